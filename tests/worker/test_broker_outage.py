"""Events that producers buffer through a broker outage are on time when it ends.

While the broker does not answer, the worker cannot know whether a partition
has records waiting, so the partition is not idle and the wall clock closes
none of its windows. Before, a quiet partition counted as idle during the
outage: its windows closed by the wall clock, and every event its producers
had buffered meanwhile (stamped when sent) arrived late.

A private broker (it is stopped and started again), one worker with
``idle_timeout`` 2 s and ``allowed_lateness`` 1 s, a 10-second window, an
outage of more than idle timeout plus lateness plus the window.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import orjson
import pytest
import yaml
from kafka import KafkaAdminClient
from kafka.admin import NewTopic

from tests.reliability.services import PrivateKafka
from tests.worker._support import free_port, metric_sum, scrape


@pytest.mark.slow
def test_events_buffered_through_a_broker_outage_are_not_late(tmp_path, redis_url, unique_name):
    broker = PrivateKafka(tmp_path / "kafka")
    broker.start()
    name = unique_name.replace("-", "_")[-40:]
    topic = f"{unique_name}-in"
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    admin.create_topics([NewTopic(topic, 1, 1, topic_configs={"message.timestamp.type": "LogAppendTime"})])
    admin.close()
    config = {
        "namespaces": {f"{name}-users": {"budgets": [{"horizon": "1h", "epsilon": 100.0}]}},
        "queries": [{
            "name": name, "input_topic": topic, "output_topic": f"{unique_name}-out",
            "privacy_unit": {"namespace": f"{name}-users", "field": "user_id"}, "timestamp_field": "ts",
            "window": {"size": "10s", "allowed_lateness": "1s", "idle_timeout": "2s"},
            "group_by": ["page"], "groups": {"public": ["a"]},
            "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1},
            "aggregations": {"count": {}}, "epsilon": 1.0,
        }],
    }
    config_path = tmp_path / "queries.yaml"
    config_path.write_text(yaml.safe_dump(config))
    port = free_port()
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap, REDIS_URL=redis_url,
               STREAM_DP_GROUP_ID=f"{unique_name}-g", STREAM_DP_INTERNAL_TOPIC_PREFIX=f"{unique_name}.",
               STREAM_DP_CONTRIBUTION_SECRET="test-secret-0123456789abcdef", STREAM_DP_METRICS_PORT=str(port))
    with open(tmp_path / "worker.log", "wb") as log:
        worker = subprocess.Popen([sys.executable, "-m", "stream_dp.cli.main", "run", "--config", str(config_path)],
                                  env=env, stdout=subprocess.DEVNULL, stderr=log)
    try:
        # One producer through it all, in its own process (a client that cannot reach its broker leaves
        # sockets behind): 5 units, then a unit a second, stamped when sent, buffered while the broker is away.
        with open(tmp_path / "producer.log", "wb") as producer_log:
            buffered = subprocess.Popen([sys.executable, "-c", _BUFFERING_PRODUCER, broker.bootstrap, topic, "16"],
                                        stdout=subprocess.PIPE, stderr=producer_log)
        assert buffered.stdout.readline().strip() == b"first five sent"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and metric_sum(_scrape(port), "stream_dp_events_total", query=name) < 5:
            time.sleep(0.2)
        # (the producer goes on a unit a second: a slow worker may have read the sixth already)
        assert metric_sum(_scrape(port), "stream_dp_events_total", query=name, outcome="accepted") >= 5
        broker.stop(crash=True)
        outage_started = time.monotonic()
        time.sleep(16.5)
        broker.start()
        assert buffered.wait(timeout=150) == 0, (tmp_path / "producer.log").read_text(errors="replace")[-2000:]
        buffered.stdout.close()
        assert time.monotonic() - outage_started > 2 + 1 + 10
        sent = 5 + 16
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and metric_sum(_scrape(port), "stream_dp_events_total", query=name) < sent:
            time.sleep(0.5)
        text = _scrape(port)
        log_text = (tmp_path / "worker.log").read_text(errors="replace")
        outcomes = {outcome: metric_sum(text, "stream_dp_events_total", query=name, outcome=outcome)
                    for outcome in ("accepted", "late", "replayed", "rejected")}
        said = f"of {sent} events sent: {outcomes}\n{log_text[-3000:]}"
        assert outcomes["late"] == 0, said
        assert outcomes["accepted"] == sent, said
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        broker.stop(crash=True)


def _event(unit: str) -> bytes:
    return orjson.dumps({"user_id": unit, "ts": int(time.time() * 1000), "page": "a"})


_BUFFERING_PRODUCER = """
import sys, time, warnings
warnings.simplefilter("ignore")
import orjson
from kafka import KafkaProducer
bootstrap, topic, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", retries=1_000_000, request_timeout_ms=5_000,
                         delivery_timeout_ms=120_000, reconnect_backoff_max_ms=1_000, max_block_ms=120_000)

def send(unit):
    producer.send(topic, key=unit.encode(), value=orjson.dumps({"user_id": unit, "ts": int(time.time() * 1000),
                                                                "page": "a"}))

for i in range(5):
    send(f"u{i}")
producer.flush()
print("first five sent", flush=True)
time.sleep(1.0)
for i in range(count):
    send(f"o{i}")
    time.sleep(1.0)
producer.flush(timeout=120)
producer.close(timeout=10)
"""


def _scrape(port: int) -> str:
    try:
        return scrape(port)
    except OSError:
        return ""
