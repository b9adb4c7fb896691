"""The releases dashboard against a real Prometheus scraping ``stream-dp export``, fed by a real worker.

One worker runs nine queries on the real Kafka broker and Redis -- noisy counts, sums and means; top-k;
quantiles with value intervals; running totals (continual); a mean vector; a sample-and-aggregate median;
a covariance; selected groups, of which the exporter shows at most ``MAX_GROUPS``; local-DP reports -- fed
through ``stream_dp.producer.EventProducer`` with live events. ``stream-dp export`` reads their output topics
and a private Prometheus scrapes it every second. Once every query has released several windows of live
events, the worker stops while events still flow (so its last windows hold data) and the releases stand
still; then every panel of the releases dashboard must show exactly the values of each query's newest
window on the output topics (read here, independently, and turned into the documented series by
``release_reference``), and every value a series ever took must be one a window released. One
module-scoped run (about half a minute) serves every test here.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from stream_dp.config import Settings, load_config
from stream_dp.producer import EventProducer

from .promql import REPO, panels
from .release_reference import differences, evaluate, every_value, latest_series, prometheus_series
from .stack import PrometheusServer, free_port, processes, scrape, wait_for

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.timeout(240)]

RELEASES_JSON = REPO / "deploy" / "grafana" / "dashboards" / "stream-dp-releases.json"
PAGES = ["/", "/a", "/b"]
BROWSERS = ["chrome", "safari", "firefox"]
UNITS = 40
RELEASED_S = 8.0  # of live events released by every query before the worker stops
MAX_PRODUCE_S = 120.0
WINDOW = {"size": "2s", "allowed_lateness": "1s", "idle_timeout": "3s"}
VARIABLES = {"query": ".*", "group": ".*"}
MAX_GROUPS = 2


def _queries(prefix: str) -> dict:
    common = {"privacy_unit": {"namespace": f"{prefix}-users", "field": "user_id"}, "timestamp_field": "ts",
              "window": WINDOW, "release_timeout": "5s", "group_by": ["page"], "groups": {"public": PAGES},
              "input_topic": f"{prefix}-events"}
    bounds = {"max_groups_per_unit": 3, "max_events_per_group": 2}
    queries = [
        {"name": "views", "bounds": bounds, "epsilon": 1.0,
         "aggregations": {"count": {}, "sum": {"field": "value", "clip": [0, 100]}, "mean": {"field": "value"}}},
        {"name": "top", "bounds": bounds, "epsilon": 1.0, "aggregations": {"count": {}, "top_k": {"k": 2}}},
        {"name": "quants", "bounds": {**bounds, "max_events_per_group": 1}, "epsilon": 2.0,
         "aggregations": {"count": {}, "quantiles": {"field": "value", "q": [0.5, 0.9], "bounds": [0, 100],
                                                     "bins": 20, "value_interval": True}}},
        {"name": "today", "bounds": bounds, "epsilon": 2.0, "continual": {"period": "1h", "max_windows_per_unit": 4},
         "aggregations": {"count": {}, "sum": {"field": "value", "clip": [0, 100]}}},
        {"name": "vec", "bounds": {**bounds, "max_events_per_group": 5}, "epsilon": 2.0, "delta": 1e-6,
         "mechanism": "gaussian", "aggregations": {"mean_vector": {"fields": ["vx", "vy"], "clip_norm": 5}}},
        {"name": "stat", "bounds": {**bounds, "max_events_per_group": 5}, "epsilon": 2.0,
         "aggregations": {"sample_aggregate": {"function": "statistics:median", "field": "value", "blocks": 2,
                                               "output_range": [0, 100], "timeout": "100ms"}}},
        {"name": "cov", "bounds": {**bounds, "max_events_per_group": 5}, "epsilon": 2.0, "delta": 1e-6,
         "mechanism": "gaussian", "aggregations": {"count": {}, "covariance": {"fields": ["vx", "vy"], "clip_norm": 5}}},
        # selected groups: all three pages pass selection in a window with data; the exporter shows MAX_GROUPS
        # (its long release_timeout keeps its last groups shown through the test: they go 2 windows + 1s + 2m
        # after their window's end without a newer one)
        {"name": "chosen", "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1}, "epsilon": 4.0,
         "groups": {"select": {"delta": 1e-4}}, "aggregations": {"count": {}}, "release_timeout": "2m"},
        {"name": "local", "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1}, "epsilon": 2.0,
         "input_topic": f"{prefix}-browsers", "group_by": ["browser"], "groups": {"public": BROWSERS},
         "aggregations": {"count": {}}, "local_dp": {"field": "browser", "mechanism": "krr", "epsilon": 2.0}},
    ]
    return {
        "namespaces": {f"{prefix}-users": {"budgets": [{"horizon": "1h", "epsilon": 4000.0, "delta": 0.004}]}},
        "queries": [{**common, **q, "name": f"{prefix}_{q['name']}".replace("-", "_"),
                     "output_topic": f"{prefix}-{q['name']}"} for q in queries],
    }


def _produce(config_path: Path, settings: Settings, events_query: str, local_query: str,
             stop: threading.Event) -> None:
    """Live events through EventProducer until ``stop`` is set (at most MAX_PRODUCE_S): every window released
    meanwhile holds data, so the last ones before the worker stops do too."""
    config = load_config(config_path)
    rng = np.random.default_rng(7)  # synthetic data only; never noise
    with EventProducer(config.query(events_query), settings) as events, \
            EventProducer(config.query(local_query), settings, local_dp_secret=b"a producer secret of 32 bytes!!") as local:
        events.ensure_topics()
        local.ensure_topics()
        started = time.monotonic()
        while not stop.is_set() and time.monotonic() - started < MAX_PRODUCE_S:
            now = time.time()
            units = rng.integers(0, UNITS, 20).tolist()
            events.send([{"user_id": f"u{u}", "ts": now, "page": PAGES[u % 3], "value": float(rng.gamma(2.0, 20.0)),
                          "vx": float(rng.normal(1.0, 0.5)), "vy": float(rng.normal(-1.0, 0.5))} for u in units])
            local.send([{"user_id": f"u{u}", "ts": now, "browser": BROWSERS[u % 3]} for u in units])
            time.sleep(0.1)


def _read_all(bootstrap: str, topics: list[str]) -> list[dict]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        partitions = [TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or ())]
        consumer.assign(partitions)
        consumer.seek_to_beginning()
        ends = consumer.end_offsets(partitions)
        records: list[dict] = []
        deadline = time.monotonic() + 60
        while any(consumer.position(tp) < ends[tp] for tp in partitions):
            assert time.monotonic() < deadline, "the output topics could not be read to their end within 60 s"
            for batch in consumer.poll(timeout_ms=500).values():
                records += [json.loads(message.value) for message in batch]
        return records
    finally:
        consumer.close()


@pytest.fixture(scope="module")
def run(tmp_path_factory, prometheus_binary, kafka_bootstrap, redis_url):
    from kafka.admin import KafkaAdminClient, NewTopic

    tmp = tmp_path_factory.mktemp("releases")
    prefix = f"t-releases-{uuid.uuid4().hex[:8]}"
    document = _queries(prefix)
    config_path = tmp / "queries.yaml"
    config_path.write_text(yaml.safe_dump(document))
    names = [q["name"] for q in document["queries"]]
    outputs = [q["output_topic"] for q in document["queries"]]
    env = {
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "REDIS_URL": redis_url,
        "STREAM_DP_CONTRIBUTION_SECRET": "test-secret-0123456789abcdef",
        "STREAM_DP_INPUT_RETENTION_MS": "3600000", "STREAM_DP_LEDGER_TTL_S": "8200",
        "STREAM_DP_GROUP_ID": prefix, "STREAM_DP_INTERNAL_TOPIC_PREFIX": f"{prefix}-",
        "STREAM_DP_METRICS_PORT": str(free_port()),
    }
    settings = Settings(**env)
    # Every topic up front, so that it is deleted afterwards and no worker reads a topic the broker has only
    # just created (it may report no partitions yet).
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, client_id="stream-dp-tests")
    topics = {f"{prefix}-events": (2, {"message.timestamp.type": "LogAppendTime"}),
              f"{prefix}-browsers": (1, {"message.timestamp.type": "LogAppendTime"}),
              settings.partials_topic: (2, settings.partials_topic_configs()),
              settings.alerts_topic: (1, {}), settings.dead_letter_topic: (1, {}),
              **{topic: (2, {}) for topic in outputs}}
    admin.create_topics([NewTopic(name, parts, 1, topic_configs=configs) for name, (parts, configs) in topics.items()])
    prometheus = None
    try:
        with processes() as start:
            worker = start(["run", "--config", str(config_path)], env, tmp / "worker.log")
            export_port = free_port()
            start(["export", "--config", str(config_path), "--port", str(export_port), "--max-groups", str(MAX_GROUPS)],
                  {"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap}, tmp / "export.log")
            wait_for(lambda: scrape(export_port), timeout_s=30, what=f"the exporter's /metrics (logs in {tmp})")
            prometheus = PrometheusServer(prometheus_binary, tmp / "prometheus", targets=[f"127.0.0.1:{export_port}"],
                                          rule_files={})
            prometheus.wait_ready(timeout_s=20)
            started_s = time.time()
            stop = threading.Event()
            failed: list[BaseException] = []

            def produce() -> None:
                try:
                    _produce(config_path, settings, names[0], names[-1], stop)
                except Exception as exc:  # noqa: BLE001 - the fixture asserts on it, in its own thread
                    failed.append(exc)

            producer = threading.Thread(target=produce, name="releases-producer", daemon=True)
            producer.start()

            def released_events_for_a_while() -> bool:
                assert not failed, failed
                ends = prometheus.query("stream_dp_release_window_end_seconds")
                return len(ends) == len(names) and min(float(e["value"][1]) for e in ends) >= started_s + RELEASED_S

            try:
                wait_for(released_events_for_a_while, timeout_s=90, interval_s=1,
                         what=f"every query to release {RELEASED_S:.0f} s of events (logs in {tmp})")
                # stopped while events still flow: its last releases hold data, none is of an empty window
                worker.terminate()
                worker.wait(timeout=30)
            finally:
                stop.set()
                producer.join(timeout=30)
            assert not failed, failed
            records = _read_all(kafka_bootstrap, outputs)
            latest = latest_series(records, MAX_GROUPS)
            ends = {dict(labels)["query"]: value for (metric, labels), value in latest.items()
                    if metric == "stream_dp_release_window_end_seconds"}

            def exporter_caught_up() -> bool:
                shown = {e["metric"]["query"]: float(e["value"][1])
                         for e in prometheus.query("stream_dp_release_window_end_seconds")}
                return shown == ends

            wait_for(exporter_caught_up, timeout_s=30, interval_s=1, what="the exporter to show the last windows")
            time.sleep(2)  # two more scrapes: every series of the last windows is in Prometheus
            yield SimpleNamespace(prometheus=prometheus, records=records, latest=latest, started_s=started_s,
                                  config_path=config_path, names=names, kafka=kafka_bootstrap, tmp=tmp)
    finally:
        if prometheus is not None:
            prometheus.close()
        try:
            admin.delete_topics(list(topics))
        except Exception:  # deleting is housekeeping; a failure must not mask the test result
            pass
        admin.close()


def _targets():
    dashboard = json.loads(RELEASES_JSON.read_text())
    for panel in panels(dashboard):
        for target in panel["targets"]:
            expr = target["expr"]
            for name, value in VARIABLES.items():
                expr = expr.replace(f"${name}", value)
            yield panel["title"], target["refId"], expr


def test_every_panel_shows_the_values_of_the_latest_records_on_the_output_topics(run):
    problems = []
    for title, ref, expr in _targets():
        expected = evaluate(expr, run.latest)
        got = prometheus_series(run.prometheus.query(expr))
        if not expected:
            problems.append(f"{title} [{ref}]: the records give this panel nothing to show: {expr}")
        problems += [f"{title} [{ref}]: {d}" for d in differences(expected, got)]
    assert problems == [], "\n".join(problems)


def test_every_value_a_series_took_was_released(run):
    """Over the whole run, not only at its end: every sample of every plain series is a value some window of
    its query released for its group."""
    released = every_value(run.records, MAX_GROUPS)
    problems = []
    end = time.time()
    for title, ref, expr in _targets():
        if re.search(r"\}\s*[-+*]", expr):  # arithmetic: its plain selectors are checked on their own
            continue
        for item in run.prometheus.query_range(expr, run.started_s, end):
            labels = frozenset((k, v) for k, v in item["metric"].items() if k not in {"job", "instance", "__name__"})
            key = (item["metric"]["__name__"], labels)
            shown = {float(v) for _t, v in item["values"]}
            if not shown <= released.get(key, set()):
                problems.append(f"{title} [{ref}] {dict(labels)}: {sorted(shown - released.get(key, set()))[:3]} "
                                f"never released")
    assert problems == [], "\n".join(problems)


def test_selected_groups_are_capped_and_public_ones_all_shown(run):
    shown = {}
    for item in run.prometheus.query('stream_dp_release_value{statistic="count"}'):
        shown.setdefault(item["metric"]["query"], set()).add(item["metric"]["group"])
    chosen = next(name for name in run.names if name.endswith("_chosen"))
    released = {",".join(r["group"].values()) for r in run.records
                if r["query"] == chosen and r["window"]["start_ms"] == max(
                    x["window"]["start_ms"] for x in run.records if x["query"] == chosen)}
    assert len(shown[chosen]) == min(MAX_GROUPS, len(released)) and shown[chosen] <= released
    assert len(released) > MAX_GROUPS, f"the last window selected {sorted(released)}: the cap was not exercised"
    for name in run.names:
        if name.endswith(("_views", "_top", "_quants", "_cov", "_local")):
            assert len(shown[name]) == 3, (name, shown[name])


def test_the_dashboard_variables_offer_every_query_and_group(run):
    dashboard = json.loads(RELEASES_JSON.read_text())
    offered = {}
    for variable in dashboard["templating"]["list"]:
        metric, label = variable["definition"].removeprefix("label_values(").removesuffix(")").rsplit(", ", 1)
        offered[variable["name"]] = set(run.prometheus.api(f"label/{label}/values",
                                                           **{"match[]": metric.replace("$query", ".*")}))
    assert offered["query"] == set(run.names)
    assert offered["group"] == set(PAGES) | set(BROWSERS)


def _exported(text: str | None) -> dict:
    shown = {}
    for family in text_string_to_metric_families(text or ""):
        for sample in family.samples:
            if sample.name.startswith("stream_dp_release_") and sample.name != "stream_dp_release_groups":
                shown[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return shown


def _counted(text: str | None) -> dict[str, float]:
    return {sample.labels["outcome"]: sample.value for family in text_string_to_metric_families(text or "")
            for sample in family.samples if sample.name == "stream_dp_export_records_total"}


def test_a_restarted_exporter_rebuilds_the_latest_values_from_the_topics(run):
    port = free_port()
    with processes() as start:
        start(["export", "--config", str(run.config_path), "--port", str(port), "--max-groups", str(MAX_GROUPS)],
              {"KAFKA_BOOTSTRAP_SERVERS": run.kafka}, run.tmp / "export-restarted.log")

        def read_back() -> bool:
            text = scrape(port)
            return not differences(run.latest, _exported(text)) and sum(_counted(text).values()) == len(run.records)

        try:
            wait_for(read_back, timeout_s=40, what="the restarted exporter to read the topics back")
        except TimeoutError:
            pass  # the assertions below say what differs
        text = scrape(port)
    assert differences(run.latest, _exported(text)) == []
    # it read every record of the topics (fewer than --lookback per partition), each of a configured query
    counted = _counted(text)
    assert sum(counted.values()) == len(run.records) and set(counted) <= {"shown", "older_window"}, counted
