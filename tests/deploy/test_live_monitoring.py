"""The dashboard and the alert rules against a real Prometheus scraping real workers.

Two worker processes run on the real Kafka broker, each fed a synthetic stream
by ``stream-dp produce``:

* **healthy**: Redis reachable; per-window epsilon 0.3 against a limit of 1.0
  per hour, so the units active in every 2 s window pass 80% of their budget at
  the third window (0.9) and are refused from the fourth. Invalid, late and one
  corrupt internal record are added to it.
* **broken**: its REDIS_URL points at a closed port, so it can never verify
  its store: every closed window is held uncharged, nothing is released (fail
  closed), and the release ledger cannot be read.

A private Prometheus (the Debian binary) scrapes both every second and
evaluates the repository's rules with every ``for:`` shortened to 3 s (only
``for`` changes; see ``stack.rules_with_short_for``). The test asserts that
the alerts these situations call for fire, with the right labels, that the
healthy worker does not trigger the broken one's, and that every query of the
dashboard returns data.
"""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest
import redis
import yaml

from stream_dp.budget import RedisBudgetStore
from stream_dp.budget import policy_from_config
from stream_dp.config import Settings, load_config

from .promql import alert_rules, load_dashboard, panels, selectors, substitute
from .stack import PrometheusServer, finite_values, free_port, processes, rules_with_short_for, scrape, wait_for

# Healthy runs take about 20 s; every wait below is bounded by TEST_BUDGET_S and
# pytest-timeout stops anything else.
pytestmark = [pytest.mark.services, pytest.mark.timeout(150)]
TEST_BUDGET_S = 90

EPSILON_PER_WINDOW = 0.3
LIMIT_PER_HOUR = 1.0
HEALTHY_RATE = 250  # events per second
BROKEN_RATE = 50
UNITS = 40
PAGES = ["/", "/pricing", "/docs"]
LATE_EVENTS = 1_500
INVALID_EVENTS = 400
# Counters only a restart, a replay, a lost partition, a topic gaining partitions or a
# failing sample-and-aggregate function increments; this test stages none of those, so
# their panel queries are only checked to be valid.
FAULT_ONLY_SERIES = {
    "stream_dp_windows_republished_total",
    "stream_dp_late_partials_total",
    "stream_dp_partials_expired_total",
    "stream_dp_windows_expired_total",
    "stream_dp_partials_unreleasable_total",
    "stream_dp_release_partitions_missing_total",
    "stream_dp_budget_charge_replays_total",
    "stream_dp_windows_withheld_total",
    "stream_dp_partition_count_changes_total",
    "stream_dp_sample_aggregate_failed_blocks_total",
}
# Grafana's $__rate_interval is at least four scrape intervals (1 s here).
DASHBOARD_VARIABLES = {"query": ".*", "namespace": ".*", "horizon": ".*", "__rate_interval": "10s"}


def _config(path: Path, name: str, input_topic: str) -> Path:
    config = {
        "namespaces": {f"{name}-users": {
            "budgets": [{"horizon": "1h", "epsilon": LIMIT_PER_HOUR}], "alert_at": [0.8, 1.0],
        }},
        "queries": [{
            "name": name,
            "input_topic": input_topic,
            "output_topic": f"{input_topic}-out",
            "privacy_unit": {"namespace": f"{name}-users", "field": "user_id"},
            "timestamp_field": "ts",
            "window": {"size": "2s", "allowed_lateness": "1s", "idle_timeout": "3s"},
            "group_by": ["page"],
            "groups": {"public": PAGES},
            "bounds": {"max_groups_per_unit": 3, "max_events_per_group": 2},
            "aggregations": {"count": {}, "sum": {"field": "value", "clip": [0, 100]}, "mean": {"field": "value"}},
            "epsilon": EPSILON_PER_WINDOW,
            "release_timeout": "5s",
        }],
    }
    path.write_text(yaml.safe_dump(config))
    return path


def _spaceless(expr: str) -> str:
    return "".join(expr.split())


def _has(alerts: list[dict[str, str]], alertname: str, **labels: str) -> bool:
    return any(a["alertname"] == alertname and all(a.get(k) == v for k, v in labels.items()) for a in alerts)


def _send_bad_input(kafka_bootstrap: str, input_topic: str, partials_topic: str) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", linger_ms=20)
    old_ms = int(time.time() * 1000) - 120_000  # windows two minutes old are closed
    try:
        for i in range(LATE_EVENTS):
            event = {"user_id": f"u{i % UNITS}", "ts": old_ms + i, "page": "/", "value": 1.0}
            producer.send(input_topic, key=f"u{i % UNITS}".encode(), value=orjson.dumps(event))
        for i in range(INVALID_EVENTS):
            producer.send(input_topic, key=b"bad", value=b"{not json" if i % 2 else orjson.dumps({"page": "/"}))
        producer.send(partials_topic, partition=0, value=b"not a partial aggregate")
        producer.flush(timeout=30)
    finally:
        producer.close()


def test_dashboard_queries_return_data_and_alerts_fire(
    tmp_path, prometheus_binary, kafka_bootstrap, redis_url, new_topic, unique_name
):
    started_s = time.time()
    deadline = time.monotonic() + TEST_BUDGET_S

    def within_budget(seconds: float) -> float:
        return max(1.0, min(seconds, deadline - time.monotonic()))

    healthy_name = f"{unique_name}-ok".replace("-", "_")
    broken_name = f"{unique_name}-broken".replace("-", "_")
    healthy_topic = new_topic("ok", partitions=2)
    broken_topic = new_topic("broken", partitions=1)
    # Every topic a worker uses is created up front, so that the fixture deletes
    # them afterwards and a worker never reads the partition count of a topic
    # the broker has only just created (it may report none yet).
    common = {
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "STREAM_DP_CONTRIBUTION_SECRET": "test-secret-0123456789abcdef",
        # the shortest allowed: test releases and budgets expire within a few hours
        "STREAM_DP_INPUT_RETENTION_MS": "3600000",
        "STREAM_DP_LEDGER_TTL_S": "8200",
    }
    # The partials topic as the worker would create it: gone before the ledger forgets (or it refuses to start).
    partials_configs = Settings(**common).partials_topic_configs()
    for side in ("ok", "broken"):
        new_topic(f"{side}-out", partitions=3)
        new_topic(f"{side}-partials", partitions=4, configs=partials_configs)
        new_topic(f"{side}-alerts", partitions=1)
        new_topic(f"{side}-dead-letter", partitions=1)
    healthy_config = _config(tmp_path / "healthy.yaml", healthy_name, healthy_topic)
    broken_config = _config(tmp_path / "broken.yaml", broken_name, broken_topic)
    healthy_port, broken_port = free_port(), free_port()
    healthy_env = {**common, "REDIS_URL": redis_url, "STREAM_DP_METRICS_PORT": str(healthy_port),
                   "STREAM_DP_GROUP_ID": f"{unique_name}-ok", "STREAM_DP_INTERNAL_TOPIC_PREFIX": f"{unique_name}-ok-"}
    broken_env = {**common, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",  # nothing listens there
                  "STREAM_DP_REDIS_TIMEOUT_S": "0.5", "STREAM_DP_REDIS_RETRIES": "0",
                  "STREAM_DP_METRICS_PORT": str(broken_port),
                  "STREAM_DP_GROUP_ID": f"{unique_name}-broken",
                  "STREAM_DP_INTERNAL_TOPIC_PREFIX": f"{unique_name}-broken-"}

    prometheus = None
    with processes() as start:
        try:
            start(["run", "--config", str(healthy_config)], healthy_env, tmp_path / "healthy-worker.log")
            start(["run", "--config", str(broken_config)], broken_env, tmp_path / "broken-worker.log")
            wait_for(lambda: scrape(healthy_port) and scrape(broken_port), timeout_s=within_budget(40),
                     what=f"both workers' /metrics (logs in {tmp_path})")
            prometheus = PrometheusServer(
                prometheus_binary, tmp_path / "prometheus",
                targets=[f"127.0.0.1:{healthy_port}", f"127.0.0.1:{broken_port}"],
                rule_files=rules_with_short_for("3s"),
            )
            prometheus.wait_ready(timeout_s=within_budget(20))
            # Event times follow the wall clock (--rate), so windows close as the test runs.
            for name, topic, config, rate in ((healthy_name, healthy_topic, healthy_config, HEALTHY_RATE),
                                              (broken_name, broken_topic, broken_config, BROKEN_RATE)):
                start(["produce", "--topic", topic, "--synthetic", str(rate * 120), "--units", str(UNITS),
                       "--groups", str(len(PAGES)), "--rate", str(rate), "--config", str(config),
                       "--query", name, "--quiet"], common, tmp_path / f"{name}-producer.log")

            # Late events need closed windows to be late for: wait for the first releases.
            wait_for(lambda: prometheus.query(f'stream_dp_windows_released_total{{query="{healthy_name}"}} > 0'),
                     timeout_s=within_budget(40), what=f"a release of the healthy query (logs in {tmp_path})")
            _send_bad_input(kafka_bootstrap, healthy_topic, f"{unique_name}-ok-partials")

            healthy_ns, broken_ns = f"{healthy_name}-users", f"{broken_name}-users"
            expected = [
                ("StreamDpUnitsNearBudgetLimit", {"namespace": healthy_ns, "horizon": "1h", "threshold": "0.8"}),
                ("StreamDpUnitsBudgetExhausted", {"namespace": healthy_ns, "horizon": "1h"}),
                ("StreamDpBudgetExclusionsHigh", {"namespace": healthy_ns}),
                ("StreamDpLateEventsHigh", {"query": healthy_name}),
                ("StreamDpRejectedEventsHigh", {"query": healthy_name}),
                ("StreamDpInternalErrors", {"kind": "corrupt_internal_record"}),
                ("StreamDpBudgetStoreUnavailable", {"query": broken_name}),
                # It never verifies its store, so it never sends a charge that could fail.
                ("StreamDpStoreUnverified", {"instance": f"127.0.0.1:{broken_port}", "outcome": "unanswered"}),
                ("StreamDpReleasesStalled", {"query": broken_name}),
                # The broken worker cannot read the release ledger when it is assigned the partials topic.
                ("StreamDpReleaseLedgerUnavailable", {"instance": f"127.0.0.1:{broken_port}"}),
            ]
            seen: list[dict[str, str]] = []

            def all_fired() -> bool:
                seen.extend(prometheus.firing_alerts())  # some, like late events, fire only for a while
                return all(_has(seen, name, **labels) for name, labels in expected)

            try:
                wait_for(all_fired, timeout_s=within_budget(45), interval_s=1, what="the expected alerts")
            except TimeoutError:
                missing = [(n, labels) for n, labels in expected if not _has(seen, n, **labels)]
                # What the alerts' ratios were computed from, so that a miss says which count fell short.
                counts = {r["metric"].get("outcome"): r["value"][1] for r in prometheus.query(
                    f'sum by (outcome) (stream_dp_events_total{{query="{healthy_name}"}})')}
                pytest.fail(f"alerts that never fired: {missing}; fired: {sorted({a['alertname'] for a in seen})}; "
                            f"the healthy query's events by outcome: {counts} (late events sent: {LATE_EVENTS}, "
                            f"invalid: {INVALID_EVENTS}; logs in {tmp_path})")

            # The healthy query releases, so the stalled alert must clear for it
            # (it may fire at the start, before the first release).
            wait_for(lambda: not _has(prometheus.firing_alerts(), "StreamDpReleasesStalled", query=healthy_name),
                     timeout_s=within_budget(20), interval_s=1, what="the healthy query's stalled alert to clear")
            # The healthy worker never waits for Redis; the broken one never charges anybody.
            assert not _has(seen, "StreamDpBudgetStoreUnavailable", query=healthy_name)
            assert not _has(seen, "StreamDpReleaseLedgerUnavailable", instance=f"127.0.0.1:{healthy_port}")
            assert not _has(seen, "StreamDpUnitsNearBudgetLimit", namespace=broken_ns)
            assert not _has(seen, "StreamDpBudgetChargesRejected")

            # The alert agrees with the budget store: the most active unit (u0: the
            # synthetic stream is Zipf-skewed towards it) spent over 80% of its limit.
            store = RedisBudgetStore(redis.Redis.from_url(redis_url), policy_from_config(load_config(healthy_config)))
            (hour,) = store.spend(healthy_ns, "u0", int(time.time() * 1000))
            assert hour.spent >= 0.8 * hour.limit, hour
            store.close()

            # Prometheus evaluated the repository's expressions, without errors.
            loaded = {rule["name"]: rule for group in prometheus.api("rules")["groups"] for rule in group["rules"]}
            repository = {rule["alert"]: rule for rule in alert_rules()}
            assert set(loaded) == set(repository)
            assert {name: rule["lastError"] for name, rule in loaded.items() if rule["health"] != "ok"} == {}
            for name, rule in loaded.items():
                assert _spaceless(rule["query"]) == _spaceless(repository[name]["expr"]), name
                assert rule["duration"] == (3 if "for" in repository[name] else 0), name

            _assert_every_dashboard_query_returns_data(prometheus, started_s, within_budget(15))
        finally:
            if prometheus is not None:
                prometheus.close()


def _assert_every_dashboard_query_returns_data(prometheus: PrometheusServer, started_s: float, wait_s: float) -> None:
    dashboard = load_dashboard()
    for variable in dashboard["templating"]["list"]:
        metric, label = variable["definition"].removeprefix("label_values(").removesuffix(")").split(", ")
        values = prometheus.api(f"label/{label}/values", **{"match[]": metric})
        assert values, f"dashboard variable ${variable['name']} would offer nothing"

    checks = []
    for panel in panels(dashboard):
        for target in panel["targets"]:
            expr = substitute(target["expr"], DASHBOARD_VARIABLES)
            fault_only = {s.metric for s in selectors(expr)} <= FAULT_ONLY_SERIES
            checks.append((panel["title"], target["refId"], expr, fault_only))

    def empty_queries() -> list[str]:
        end = time.time()
        empty = []
        for title, ref, expr, fault_only in checks:
            result = prometheus.query_range(expr, started_s, end)  # raises on invalid PromQL
            if not fault_only and not finite_values(result):
                empty.append(f"{title} [{ref}]: {expr}")
        return empty

    # Most return data at once; the last window's panels may need a few more scrapes.
    deadline = time.monotonic() + wait_s
    empty = empty_queries()
    while empty and time.monotonic() < deadline:
        time.sleep(2)
        empty = empty_queries()
    assert empty == [], "dashboard queries without data:\n" + "\n".join(empty)
