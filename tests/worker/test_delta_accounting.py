"""Delta is charged, through a real worker on the real broker and Redis.

1. A Gaussian query and a partition-selection query each read a namespace
   whose delta limit affords three of their windows (epsilon is plentiful):
   a unit present in every window is charged in the first three and excluded
   from every later one, and Redis holds exactly three windows' delta for it.
   The check is the README's rule, not the worker's code: a unit joins a
   window only while every limit affords the window's (epsilon, delta).
2. Units whose budget is exhausted leave no trace: 100,000 exhausted units,
   each the only contributor to a group of its own, over 20 windows of a
   selection query with delta 9e-4 (the largest the config takes is under
   1e-3). Were their groups thresholded (count 0
   plus noise), each would be published with probability about delta, some
   100 of them in all; none may appear.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import defaultdict

import numpy as np
import orjson
import pytest
import redis
import yaml
from kafka import KafkaProducer

from stream_dp.budget import RedisBudgetStore, StoreOptions, policy_from_config
from stream_dp.budget.store import DEFAULT_INPUT_RETENTION_MS
from stream_dp.config import parse_config
from stream_dp.worker.query.costs import build_plan
from tests.worker._support import BACKFILL, PRODUCER_STAMPED, consume_all, free_port, iso_ms, metric_sum, scrape

pytestmark = pytest.mark.slow

WINDOW_MS = 1_000


def _start_worker(tmp_path, config: dict, kafka_bootstrap: str, redis_url: str, unique_name: str):
    config_path = tmp_path / "queries.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    port = free_port()
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap, REDIS_URL=redis_url,
               STREAM_DP_GROUP_ID=f"{unique_name}-g", STREAM_DP_INTERNAL_TOPIC_PREFIX=f"{unique_name}.",
               STREAM_DP_CONTRIBUTION_SECRET="test-secret-0123456789abcdef", STREAM_DP_METRICS_PORT=str(port))
    log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115 (closed with the process)
    worker = subprocess.Popen([sys.executable, "-m", "stream_dp.cli.main", "run", "--config", str(config_path)],
                              env=env, stdout=subprocess.DEVNULL, stderr=log)
    return worker, port, log


def _alive(worker, tmp_path) -> bool:
    if worker.poll() is not None:
        raise AssertionError(f"the worker exited with {worker.returncode}:\n"
                             + (tmp_path / "worker.log").read_text(errors="replace")[-3000:])
    return True


def _stop(worker, log) -> None:
    worker.terminate()
    try:
        worker.wait(timeout=20)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()
    log.close()


def _query(name: str, namespace: str, input_topic: str, output_topic: str, **settings) -> dict:
    query = {
        "name": name, "input_topic": input_topic, "output_topic": output_topic,
        "privacy_unit": {"namespace": namespace, "field": "user_id"},
        "timestamp_field": "ts",
        "window": {"size": "1s", "allowed_lateness": "200ms", "idle_timeout": "2s"},
        "group_by": ["page"],
        "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1},
        "aggregations": {"count": {}},
        "release_timeout": "30s",
        **BACKFILL,  # past windows, their records stamped with their events' times
    }
    query.update(settings)
    return query


def test_gaussian_and_selection_queries_stop_charging_a_unit_at_its_delta_limit(
    tmp_path, kafka_bootstrap, redis_url, new_topic, unique_name
):
    name = unique_name.replace("-", "_")[-30:]
    input_topic = new_topic("in", partitions=1, configs=PRODUCER_STAMPED)
    windows, background = 10, 5
    gaussian_delta = 1e-6
    namespaces = {
        # epsilon 1000 never binds; the delta limits are set below
        f"{name}-g": {"budgets": [{"horizon": "1h", "epsilon": 1000.0, "delta": 1e-3}]},
        f"{name}-s": {"budgets": [{"horizon": "1h", "epsilon": 1000.0, "delta": 1e-3}]},
    }
    start = (int(time.time() * 1000) - 10 * 60_000) // WINDOW_MS * WINDOW_MS
    queries = [
        # a backfill: public groups publish from its first window (the worker's first start is later)
        _query(f"{name}_g", f"{name}-g", input_topic, f"{unique_name}-out-g", groups={"public": ["a"]},
               mechanism="gaussian", epsilon=10.0, delta=gaussian_delta,
               window={"size": "1s", "allowed_lateness": "200ms", "idle_timeout": "2s", "publish_from": iso_ms(start)}),
        _query(f"{name}_s", f"{name}-s", input_topic, f"{unique_name}-out-s", groups={"select": {"delta": 1e-6}},
               epsilon=10.0),
    ]
    # Each delta limit affords three windows and a half of its query's delta (as the query states it).
    for query in parse_config({"namespaces": namespaces, "queries": queries}).queries:
        per_window = build_plan(query).loss.delta
        namespaces[query.privacy_unit.namespace]["budgets"][0]["delta"] = 3.5 * per_window
    config = {"namespaces": namespaces, "queries": queries}
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    for w in range(windows):
        t = start + w * WINDOW_MS
        for unit in ["target", *(f"bg-{w}-{i}" for i in range(background))]:  # fresh background units
            event = {"user_id": unit, "ts": t + 100, "page": "a"}
            producer.send(input_topic, key=unit.encode(), value=orjson.dumps(event), timestamp_ms=t + 100)
    producer.flush()
    producer.close()

    worker, port, log = _start_worker(tmp_path, config, kafka_bootstrap, redis_url, unique_name)
    try:
        wanted = {start + w * WINDOW_MS for w in range(windows)}
        outputs = {}
        for suffix in ("g", "s"):
            records = consume_all(kafka_bootstrap, f"{unique_name}-out-{suffix}", timeout_s=90,
                                  until=lambda rs: _alive(worker, tmp_path) and {
                                      orjson.loads(r.value)["window"]["start_ms"] for r in rs} >= wanted)
            outputs[suffix] = {orjson.loads(r.value)["window"]["start_ms"]: orjson.loads(r.value) for r in records}
        time.sleep(1.5)  # the last counters reach /metrics
        text = scrape(port)
    finally:
        _stop(worker, log)
    log_text = (tmp_path / "worker.log").read_text(errors="replace")
    policy = policy_from_config(parse_config(config))
    store = RedisBudgetStore(redis.Redis.from_url(redis_url), policy, StoreOptions.for_input_retention(
        DEFAULT_INPUT_RETENTION_MS))
    try:
        for suffix in ("g", "s"):
            releases = outputs[suffix]
            assert set(releases) == wanted, f"windows missing: {sorted(wanted - set(releases))}\n{log_text[-3000:]}"
            privacy = next(iter(releases.values()))["privacy"]
            per_window_delta = privacy["delta"]
            assert per_window_delta > 0
            # The target was charged in the first three windows only: (epsilon, delta) of three windows.
            epsilon_spend, delta_spend = store.spend(f"{name}-{suffix}", "target", start + windows * WINDOW_MS)
            assert (epsilon_spend.currency, delta_spend.currency) == ("epsilon", "delta")
            assert delta_spend.spent == pytest.approx(3 * per_window_delta, rel=1e-6)
            assert epsilon_spend.spent == pytest.approx(3 * privacy["epsilon"], rel=1e-6)
            if suffix == "s":
                # ... and counted in those windows' releases only. The count's discrete Laplace noise
                # (scale 0.2, epsilon 5 of the 10) is 2 or more away with probability 2e^-10 / (1 + e^-5)
                # < 1e-4 per window; its standard deviation is 0.12, so the mean of the first three windows
                # exceeds that of the other seven by less than 0.5 (true difference 1) with probability
                # far below 1e-6.
                counts = np.array([releases[start + w * WINDOW_MS]["count"] for w in range(windows)])
                truth = np.array([background + 1] * 3 + [background] * (windows - 3))
                assert np.abs(counts - truth).max() <= 1, counts
                assert counts[:3].mean() - counts[3:].mean() > 0.5, counts
            query = f"{name}_{suffix}"
            assert metric_sum(text, "stream_dp_window_units_total", query=query, outcome="excluded") == windows - 3
        assert metric_sum(text, "stream_dp_budget_refusals_total", namespace=f"{name}-g", horizon="1h-delta") == windows - 3
        assert metric_sum(text, "stream_dp_budget_refusals_total", namespace=f"{name}-g", horizon="1h") == 0
    finally:
        store.close()


def test_exhausted_units_private_groups_never_reach_a_release(
    tmp_path, kafka_bootstrap, redis_url, new_topic, unique_name
):
    name = unique_name.replace("-", "_")[-30:]
    namespace = f"{name}-users"
    input_topic = new_topic("in", partitions=1, configs=PRODUCER_STAMPED)
    output_topic = f"{unique_name}-out"
    windows, exhausted_per_window, common = 20, 5_000, 40
    config = {
        "namespaces": {namespace: {"budgets": [{"horizon": "1h", "epsilon": 1.0, "delta": 4e-3}]}},
        "queries": [_query(name, namespace, input_topic, output_topic, groups={"select": {"delta": 9e-4}},
                           epsilon=0.5)],
    }
    start = (int(time.time() * 1000) - 10 * 60_000) // WINDOW_MS * WINDOW_MS
    # Exhaust the units first, as earlier windows would have: their whole epsilon, an hour's limit.
    policy = policy_from_config(parse_config(config))
    store = RedisBudgetStore(redis.Redis.from_url(redis_url), policy, StoreOptions.for_input_retention(
        DEFAULT_INPUT_RETENTION_MS))
    secret_units = [f"x{w}-{i}" for w in range(windows) for i in range(exhausted_per_window)]
    try:
        outcome = store.charge(namespace, f"{name}/earlier", secret_units, 1.0, start)
        assert outcome.charged == len(secret_units)
    finally:
        store.close()
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", linger_ms=20, batch_size=512 * 1024)
    for w in range(windows):
        t = start + w * WINDOW_MS + 100
        for i in range(exhausted_per_window):
            unit = f"x{w}-{i}"
            event = {"user_id": unit, "ts": t, "page": f"secret-{unit}"}  # a group only this unit has
            producer.send(input_topic, key=unit.encode(), value=orjson.dumps(event), timestamp_ms=t)
        for i in range(common):
            unit = f"c{w}-{i}"
            producer.send(input_topic, key=unit.encode(), value=orjson.dumps({"user_id": unit, "ts": t, "page": "common"}),
                          timestamp_ms=t)
    producer.flush()
    producer.close()

    worker, port, log = _start_worker(tmp_path, config, kafka_bootstrap, redis_url, unique_name)
    try:
        def all_charged(_records) -> bool:
            _alive(worker, tmp_path)
            try:
                text = scrape(port)
            except OSError:
                return False
            return metric_sum(text, "stream_dp_window_units_total", query=name) >= windows * (exhausted_per_window
                                                                                              + common)

        consume_all(kafka_bootstrap, output_topic, until=all_charged, timeout_s=120)
        time.sleep(3)  # the last windows' release follows their charge
        records = consume_all(kafka_bootstrap, output_topic, until=lambda rs: False, timeout_s=5)
        text = scrape(port)
    finally:
        _stop(worker, log)
    log_text = (tmp_path / "worker.log").read_text(errors="replace")
    # Every exhausted unit was one trial: it reached a closed window and was excluded.
    assert metric_sum(text, "stream_dp_window_units_total", query=name, outcome="excluded") == len(secret_units), \
        log_text[-3000:]
    released = defaultdict(set)
    for r in records:
        record = orjson.loads(r.value)
        released[record["group"]["page"]].add(record["window"]["start_ms"])
    leaked = sorted(page for page in released if page.startswith("secret-"))
    assert not leaked, f"{len(leaked)} exhausted units' private groups were released, e.g. {leaked[:5]}"
    # The pipeline did release: the common group (40 units, far above the threshold) in nearly every window.
    assert len(released["common"]) >= windows - 2, dict(released)
