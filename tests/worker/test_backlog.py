"""A backlog produced while no worker ran is released in full when one starts.

Two hours of events sit in the input topic, each record stamped when its
producer sent it (its event time). The worker starts afterwards, reads them
all at once, closes their windows as the record timestamps advance, charges
the budget two hours late and releases every window: nothing is late and
nothing is dropped. The windows are older than the worker's first start, so
the query publishes them because its ``window.publish_from`` says so. Noise is small: discrete Laplace of scale 1/4 (epsilon 4,
sensitivity 1), which is 3 or more away from the true count with probability
2e^-12 / (1 + e^-4) < 1.3e-5 per window, so the check of 12 windows within 2
fails by chance with probability below 2e-4.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import orjson
import pytest
import yaml
from kafka import KafkaProducer

from tests.worker._support import BACKFILL, PRODUCER_STAMPED, consume_all, free_port, iso_ms, metric_sum, scrape

MIN = 60_000
HOURS = 2
DATA_EVERY_MIN = 10  # a window with data every 10 minutes; the windows between are released empty
UNITS = 25


@pytest.mark.slow
def test_a_two_hour_backlog_is_released_in_full_with_nothing_late(
    tmp_path, kafka_bootstrap, redis_url, new_topic, unique_name
):
    name = unique_name.replace("-", "_")[-40:]
    input_topic = new_topic("in", partitions=2, configs=PRODUCER_STAMPED)
    output_topic = f"{unique_name}-out"
    now_ms = int(time.time() * 1000)
    first = (now_ms - HOURS * 3_600_000) // MIN * MIN
    config = {
        # Limits a unit in every data window can live with, over the short and the long horizon.
        "namespaces": {f"{name}-users": {"budgets": [{"horizon": "1h", "epsilon": 100.0},
                                                     {"horizon": "24h", "epsilon": 1000.0}]}},
        "queries": [{
            "name": name, "input_topic": input_topic, "output_topic": output_topic,
            "privacy_unit": {"namespace": f"{name}-users", "field": "user_id"},
            "timestamp_field": "ts",
            # The backlog is older than the worker's first start: published because the operator says so.
            "window": {"size": "1m", "allowed_lateness": "5s", "idle_timeout": "2s", "publish_from": iso_ms(first)},
            "group_by": ["page"], "groups": {"public": ["a"]},
            "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1},
            "aggregations": {"count": {}},
            "epsilon": 4.0, "release_timeout": "30s",
            # The backlog's producers sent its events live two hours ago, stamped then: by the broker's
            # clock (LogAppendTime) they would be stamped so too, but a test cannot wait two hours.
            **BACKFILL,
        }],
    }
    config_path = tmp_path / "queries.yaml"
    config_path.write_text(yaml.safe_dump(config))

    data_windows = [first + k * DATA_EVERY_MIN * MIN for k in range(HOURS * 60 // DATA_EVERY_MIN)]
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    sent = 0
    for start in data_windows:
        for u in range(UNITS):
            t = start + 1_000 + 997 * u
            event = {"user_id": f"u{u}", "ts": t, "page": "a"}
            # As its producer sent it two hours ago: stamped then, keyed by the unit.
            producer.send(input_topic, key=f"u{u}".encode(), value=orjson.dumps(event), timestamp_ms=t)
            sent += 1
    producer.flush()
    producer.close()

    port = free_port()
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap, REDIS_URL=redis_url,
               STREAM_DP_GROUP_ID=f"{unique_name}-g", STREAM_DP_INTERNAL_TOPIC_PREFIX=f"{unique_name}.",
               STREAM_DP_CONTRIBUTION_SECRET="test-secret-0123456789abcdef", STREAM_DP_METRICS_PORT=str(port))
    with open(tmp_path / "worker.log", "wb") as log:
        worker = subprocess.Popen([sys.executable, "-m", "stream_dp.cli.main", "run", "--config", str(config_path)],
                                  env=env, stdout=subprocess.DEVNULL, stderr=log)
    try:
        # Every minute from the first data window on: the ones between are released empty (noise only).
        every_minute = set(range(first, data_windows[-1] + MIN, MIN))

        def released_all(records):
            return {orjson.loads(r.value)["window"]["start_ms"] for r in records} >= every_minute

        messages = consume_all(kafka_bootstrap, output_topic, until=released_all, timeout_s=120)
        log_text = (tmp_path / "worker.log").read_text(errors="replace")
        missing = every_minute - {orjson.loads(r.value)["window"]["start_ms"] for r in messages}
        assert not missing, f"{len(missing)} windows missing, e.g. {sorted(missing)[:5]}; worker log:\n{log_text[-3000:]}"
        releases = {}
        for m in messages:
            record = orjson.loads(m.value)
            releases.setdefault(record["window"]["start_ms"], []).append(record)
        for start in data_windows:
            (record,) = releases[start]
            assert abs(record["count"] - UNITS) <= 2, record
        assert all(len(r) == 1 for r in releases.values())  # once each

        time.sleep(1.5)  # the last counters reach /metrics
        text = scrape(port)
        assert metric_sum(text, "stream_dp_events_total", query=name, outcome="accepted") == sent
        assert metric_sum(text, "stream_dp_events_total", query=name, outcome="late") == 0
        assert metric_sum(text, "stream_dp_budget_failures_total", query=name) == 0
        assert "budget store refused" not in log_text
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
