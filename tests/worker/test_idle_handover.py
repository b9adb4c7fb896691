"""Progress vouches only for durable closure: a short idle assignment cannot release windows early.

A worker that owns an input partition with nothing to read closes its
windows by the wall clock (the idle rule) and tells the release stage so
with a progress marker: windows through that time may go out without this
partition's partial. That promise binds every later owner of the partition
only if the closure is in the committed offset metadata, which is what the
next owner restores. Without it, a worker that owned every partition for a
few seconds at start-up (the first to join the group) vouched for windows
that their real owners went on to fill; the release stage released them
with one partition's data and dropped the rest as late partials.

The check reads the broker's own evidence, independent of the worker's
code: every progress marker in the partials topic must be covered by the
closure committed for that input partition at the moment the worker is
killed (``kill -9``, so nothing is committed on the way out). The events
that arrive afterwards for those windows are then late for the next owner:
counted and dead-lettered with a reason, never silently left out of a
release that claims to be complete.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import orjson
import pytest
import yaml
from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import KafkaAdminClient
from kafka.structs import TopicPartition

from tests.worker._support import consume_all, free_port, metric_sum, scrape

SECRET = "test-secret-0123456789abcdef"


def _start(config_path, env, log_path):
    with open(log_path, "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "stream_dp.cli.main", "run", "--config", str(config_path)],
                                env=env, stdout=subprocess.DEVNULL, stderr=log)


def _progress_markers(bootstrap: str, topic: str, query: str, timeout_s: float) -> list[dict]:
    records = consume_all(bootstrap, topic, until=lambda rs: False, timeout_s=timeout_s)
    markers = [orjson.loads(r.value) for r in records]
    return [m for m in markers if m.get("type") == "progress" and m.get("query") == query]


def _committed_closure(bootstrap: str, group: str, topic: str, partitions: int, query: str) -> dict[int, int | None]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="stream-dp-tests")
    try:
        offsets = admin.list_group_offsets({group: [TopicPartition(topic, p) for p in range(partitions)]}).get(group, {})
    finally:
        admin.close()
    out: dict[int, int | None] = {p: None for p in range(partitions)}
    for tp, meta in offsets.items():
        if meta is not None and meta.offset >= 0 and meta.metadata:
            out[tp.partition] = orjson.loads(meta.metadata).get("closed_through_ms", {}).get(query)
    return out


@pytest.mark.slow
def test_progress_is_sent_only_for_closure_the_next_owner_restores(
    tmp_path, kafka_bootstrap, redis_url, new_topic, unique_name
):
    name = unique_name.replace("-", "_")[-40:]
    input_topic = new_topic("in", partitions=2)
    output_topic = f"{unique_name}-out"
    group = f"{unique_name}-g"
    config = {
        "namespaces": {f"{name}-users": {"budgets": [{"horizon": "1h", "epsilon": 100.0}]}},
        "queries": [{
            "name": name, "input_topic": input_topic, "output_topic": output_topic,
            "privacy_unit": {"namespace": f"{name}-users", "field": "user_id"},
            "timestamp_field": "ts",
            "window": {"size": "10s", "allowed_lateness": "1s", "idle_timeout": "1s"},
            "group_by": ["page"], "groups": {"public": ["a"]},
            "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1},
            "aggregations": {"count": {}},
            "epsilon": 4.0, "release_timeout": "30s",
        }],
    }
    config_path = tmp_path / "queries.yaml"
    config_path.write_text(yaml.safe_dump(config))
    prefix = f"{unique_name}."
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap, REDIS_URL=redis_url, STREAM_DP_GROUP_ID=group,
               STREAM_DP_INTERNAL_TOPIC_PREFIX=prefix, STREAM_DP_CONTRIBUTION_SECRET=SECRET)
    partials_topic = f"{prefix}partials"

    # 1. A worker owns both (empty) partitions, goes idle and sends progress; then it is killed.
    first = _start(config_path, dict(env, STREAM_DP_METRICS_PORT=str(free_port())), tmp_path / "first.log")
    try:
        deadline = time.monotonic() + 60
        markers: list[dict] = []
        while time.monotonic() < deadline and {m["partition"] for m in markers} != {0, 1}:
            markers = _progress_markers(kafka_bootstrap, partials_topic, name, timeout_s=2)
        assert {m["partition"] for m in markers} == {0, 1}, (tmp_path / "first.log").read_text(errors="replace")[-3000:]
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    markers = _progress_markers(kafka_bootstrap, partials_topic, name, timeout_s=3)
    committed = _committed_closure(kafka_bootstrap, group, input_topic, 2, name)
    for marker in markers:
        through = committed[marker["partition"]]
        assert through is not None and through >= marker["closed_through_ms"], (
            f"progress {marker} vouches for more than the closure committed for partition "
            f"{marker['partition']} ({through}): the next owner would fill windows already vouched closed"
        )

    # 2. Events of a window the marker covered arrive on both partitions; the next owner calls them late.
    vouched = min(m["closed_through_ms"] for m in markers)
    window_start = (vouched - 20_000) // 10_000 * 10_000
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    sent = 0
    for u in range(20):
        event = {"user_id": f"u{u}", "ts": window_start + 100 * u, "page": "a"}
        producer.send(input_topic, key=f"u{u}".encode(), value=orjson.dumps(event))  # stamped by the broker
        sent += 1
    producer.flush()
    producer.close()
    port = free_port()
    second = _start(config_path, dict(env, STREAM_DP_METRICS_PORT=str(port)), tmp_path / "second.log")
    try:
        late = 0.0
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and late < sent:
            time.sleep(1)
            try:
                late = metric_sum(scrape(port), "stream_dp_events_total", query=name, outcome="late")
            except OSError:
                continue
        text = scrape(port)
        log_text = (tmp_path / "second.log").read_text(errors="replace")
        assert late == sent, f"{late} of {sent} events late; log:\n{log_text[-3000:]}"
        assert metric_sum(text, "stream_dp_events_total", query=name, outcome="accepted") == 0
        assert metric_sum(text, "stream_dp_late_partials_total", query=name) == 0
        dead = consume_all(kafka_bootstrap, f"{prefix}dead-letter", until=lambda rs: len(rs) >= sent, timeout_s=20)
        assert len(dead) == sent and all(dict(d.headers).get("reason") == b"late" for d in dead)
    finally:
        second.terminate()
        try:
            second.wait(timeout=20)
        except subprocess.TimeoutExpired:
            second.kill()
            second.wait()
