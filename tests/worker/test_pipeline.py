"""End to end on the real broker and Redis: two worker processes, three input partitions.

Every unit is active in all six windows but its budget covers three, so the
first three windows count everybody and the last three nobody: exclusion is
visible through the noise. Noise scales are chosen small (epsilon 3 per
window) so that every check on values can use a wide bound that fails by
chance with probability below 1e-3 over the whole test.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import redis
import yaml
from kafka import KafkaProducer

from stream_dp.budget import RedisBudgetStore
from stream_dp.budget import policy_from_config
from stream_dp.config import load_config
from tests.worker._support import BACKFILL, PRODUCER_STAMPED, consume_all, free_port, iso_ms, metric_sum, scrape

WINDOW_MS = 5_000
WINDOWS = 6
UNITS = 60
PAGES = ("a", "b", "c")
EVENTS_PER_PAGE = 2  # = max_events_per_group: every event is kept
VALUE = 5.0


def _config(tmp_path: Path, name: str, input_topic: str, output_topic: str, publish_from_ms: int) -> Path:
    config = {
        "namespaces": {f"{name}-users": {"budgets": [{"horizon": "1h", "epsilon": 9.0}], "alert_at": [0.8, 1.0]}},
        "queries": [{
            "name": name,
            "input_topic": input_topic,
            "output_topic": output_topic,
            "privacy_unit": {"namespace": f"{name}-users", "field": "user_id"},
            "timestamp_field": "ts",
            # a backfill: published from its first window on, not from the workers' first start
            "window": {"size": "5s", "allowed_lateness": "1s", "idle_timeout": "2s",
                       "publish_from": iso_ms(publish_from_ms)},
            "group_by": ["page"],
            "groups": {"public": list(PAGES)},
            "bounds": {"max_groups_per_unit": 3, "max_events_per_group": EVENTS_PER_PAGE},
            "aggregations": {"count": {}, "sum": {"field": "value", "clip": [0, 10]}, "mean": {"field": "value"}},
            "epsilon": 3.0,
            "release_timeout": "30s",
            **BACKFILL,
        }],
    }
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.slow
def test_two_workers_release_every_window_once_with_budget_exclusion(
    tmp_path, kafka_bootstrap, redis_url, new_topic, unique_name
):
    name = unique_name.replace("-", "_")[-40:]
    input_topic = new_topic("in", partitions=3, configs=PRODUCER_STAMPED)
    output_topic = f"{unique_name}-out"
    now_ms = int(time.time() * 1000)
    first_start = (now_ms - 120_000) // WINDOW_MS * WINDOW_MS
    config_path = _config(tmp_path, name, input_topic, output_topic, first_start)
    prefix = f"{unique_name}."
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    for w in range(WINDOWS):
        for u in range(UNITS):
            for page in PAGES:
                for e in range(EVENTS_PER_PAGE):
                    event = {"user_id": f"u{u}", "ts": first_start + w * WINDOW_MS + 37 * u + e, "page": page, "value": VALUE}
                    # a backfill: records stamped with their event times, keyed by the unit
                    producer.send(input_topic, key=f"u{u}".encode(), value=orjson.dumps(event), timestamp_ms=event["ts"])
    producer.send(input_topic, key=b"bad", value=b"{not json")
    producer.send(input_topic, key=b"bad", value=orjson.dumps({"user_id": "x", "page": "a", "value": 1}))
    producer.flush()

    ports = [free_port(), free_port()]
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap, REDIS_URL=redis_url,
               STREAM_DP_GROUP_ID=f"{unique_name}-g", STREAM_DP_INTERNAL_TOPIC_PREFIX=prefix,
               STREAM_DP_CONTRIBUTION_SECRET="test-secret-0123456789abcdef")
    logs = [open(tmp_path / f"worker{i}.log", "wb") for i in range(len(ports))]
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "stream_dp.cli.main", "run", "--config", str(config_path)],
            env=dict(env, STREAM_DP_METRICS_PORT=str(port)),
            stdout=subprocess.DEVNULL, stderr=log,
        )
        for port, log in zip(ports, logs)
    ]
    try:
        data_windows = {first_start + w * WINDOW_MS for w in range(WINDOWS)}

        def released_all(records):
            seen = {(r["window"]["start_ms"], r["group"]["page"]) for r in map(lambda m: orjson.loads(m.value), records)}
            return all((s, p) in seen for s in data_windows for p in PAGES)

        messages = consume_all(kafka_bootstrap, output_topic, until=released_all, timeout_s=120)
        releases = [orjson.loads(m.value) for m in messages]
        assert released_all(messages), f"missing releases; worker logs in {tmp_path}"

        # A late event for a released window goes to the dead-letter topic.
        late = {"user_id": "u1", "ts": first_start + 1, "page": "a", "value": 1.0}
        producer.send(input_topic, key=b"u1", value=orjson.dumps(late))
        producer.flush()

        # Exactly once per (window, group), with identical ids.
        per_key = collections.Counter((r["window"]["start_ms"], r["group"]["page"]) for r in releases)
        assert max(per_key.values()) == 1
        assert len({r["release_id"] for r in releases}) == len(releases)

        # Budget: 9.0 per hour at 3.0 per window lets each unit into the first three windows only.
        full_count = UNITS * EVENTS_PER_PAGE
        for r in releases:
            if r["window"]["start_ms"] not in data_windows:
                continue
            index = (r["window"]["start_ms"] - first_start) // WINDOW_MS
            true_count = full_count if index < 3 else 0
            true_sum = true_count * VALUE
            # 4x the 95% half-width: a Laplace draw lands outside with probability < 1e-5.
            assert abs(r["count"] - true_count) <= 4 * r["ci95"]["count"], r
            assert abs(r["sum"] - true_sum) <= 4 * r["ci95"]["sum"], r
            assert r["privacy"]["mechanism"] == "laplace" and 0 < r["privacy"]["epsilon"] <= 3.0
            assert r["count"] >= 0

        store = RedisBudgetStore(redis.Redis.from_url(redis_url), policy_from_config(load_config(config_path)))
        spend_now = int(time.time() * 1000)
        for u in range(UNITS):
            (hour,) = store.spend(f"{name}-users", f"u{u}", spend_now)
            assert hour.spent == pytest.approx(9.0, abs=1e-5), (u, hour)
            assert hour.spent <= hour.limit

        dead = consume_all(
            kafka_bootstrap, f"{prefix}dead-letter",
            until=lambda rs: {dict(r.headers).get("reason") for r in rs} >= {b"invalid_json", b"missing_field", b"late"},
            timeout_s=30,
        )
        reasons = collections.Counter(dict(r.headers)["reason"] for r in dead)
        assert reasons[b"invalid_json"] == 1 and reasons[b"missing_field"] == 1 and reasons[b"late"] == 1, reasons
        assert any(r.value == b"{not json" for r in dead)

        # Every unit reached 80% and then 100% of its hourly limit: one alert record each.
        alerts = consume_all(kafka_bootstrap, f"{prefix}alerts", until=lambda rs: len(rs) >= 2 * UNITS, timeout_s=20)
        crossings = collections.Counter(
            (a["unit"], a["threshold"]) for a in map(lambda m: orjson.loads(m.value), alerts) if a["type"] == "budget_alert"
        )
        assert set(crossings) == {(f"u{u}", t) for u in range(UNITS) for t in (0.8, 1.0)}

        time.sleep(2)  # let the late event's counter reach /metrics
        texts = [scrape(port) for port in ports]
        accepted = sum(metric_sum(t, "stream_dp_events_total", query=name, outcome="accepted") for t in texts)
        assert accepted == WINDOWS * UNITS * len(PAGES) * EVENTS_PER_PAGE
        assert sum(metric_sum(t, "stream_dp_events_total", query=name, outcome="late") for t in texts) == 1
        assert sum(metric_sum(t, "stream_dp_events_rejected_total", query=name) for t in texts) == 2
        excluded = sum(metric_sum(t, "stream_dp_window_units_total", query=name, outcome="excluded") for t in texts)
        assert excluded == 3 * UNITS
        assert all("user_id" not in t and 'u1"' not in t for t in texts)
    finally:
        producer.close()
        for worker in workers:
            worker.terminate()
        for worker in workers:
            try:
                worker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
        for log in logs:
            log.close()
