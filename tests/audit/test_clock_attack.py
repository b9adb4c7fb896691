"""One producer's record timestamp must not move a partition's window clock: neighbouring streams through
real worker processes on the real broker.

D is a backlog produced while no worker ran (once for the module: every attack is a D' of the same D): WINDOWS
one-minute windows of EVENTS_PER_WINDOW events two hours old, on a CreateTime topic whose records are stamped
with their event times (a backfill, so the query says ``trust_producer_timestamps: true``). D' is D plus
records of one unit, sent after the first window's events, all keyed by that unit: one stamped 0 (which the
broker takes with CreateTime), one stamped up to an hour ahead (the broker's default
``message.timestamp.after.max.ms``), a handful so stamped (one fewer than the quorum of units a trusted
producer clock needs, ``stream_dp.windows.record_clock``), a hundred so stamped, or as many as that quorum so
stamped that are not JSON (dead-lettered: they carry no unit but their key). The worker reads the backlog in
batches of up to 20,000 records; had that one record moved the clock to the wall clock, every event of a later
batch would be late and the windows released without them. Neighbours must release the same windows with the
same counts (up to noise) and call the same events late (none).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import orjson
import pytest
import yaml
from kafka import KafkaProducer

from stream_dp.windows.record_clock import PRODUCER_QUORUM
from tests.conftest import PRODUCER_STAMPED
from tests.reliability.topics import create_topic, delete_topics
from tests.worker._support import consume_all, free_port, iso_ms, metric_sum, scrape

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.timeout(600)]

MIN = 60_000
WINDOWS = 8
EVENTS_PER_WINDOW = 5_000  # 40,000 events: two batches of the worker at least
AGO_MS = 2 * 3_600_000
AHEAD_MS = 55 * MIN  # within the hour a broker takes by default (message.timestamp.after.max.ms)
# Two counts of one window, each with discrete Laplace noise of scale 1 (epsilon 1, sensitivity 1), differ
# by more than 16 with probability below 17 e^-16 < 2e-6 per window.
NOISE_SLACK = 16
NOT_JSON = b"not json"
#: The target's records: (record timestamp, whether it is an event rather than ``NOT_JSON``), all keyed b"target".
TARGETS = {"zero": lambda now_ms: [(0, True)], "ahead": lambda now_ms: [(now_ms + AHEAD_MS, True)],
           "handful_ahead": lambda now_ms: [(now_ms + AHEAD_MS, True)] * (PRODUCER_QUORUM - 1),
           "hundred_ahead": lambda now_ms: [(now_ms + AHEAD_MS, True)] * 100,
           "quorum_not_json_ahead": lambda now_ms: [(now_ms + AHEAD_MS, False)] * PRODUCER_QUORUM}


def backlog(start_ms: int, target: list[tuple[int, bool]]) -> list[tuple[bytes, bytes, int]]:
    """(key, value, record timestamp) in sending order; the target's records after the first window's events."""
    out = []
    for w in range(WINDOWS):
        for i in range(EVENTS_PER_WINDOW):
            t = start_ms + w * MIN + i * (MIN - 1_000) // EVENTS_PER_WINDOW
            unit = f"u{i}"
            out.append((unit.encode(), orjson.dumps({"user_id": unit, "ts": t, "page": "a"}), t))
        if w == 0:
            t = start_ms + MIN - 500
            event = orjson.dumps({"user_id": "target", "ts": t, "page": "a"})
            out += [(b"target", event if valid else NOT_JSON, stamp) for stamp, valid in target]
    return out


def query_file(path, name: str, topic: str, output: str, start_ms: int) -> None:
    config = {
        "namespaces": {f"{name}-users": {"budgets": [{"horizon": "24h", "epsilon": 100.0}]}},
        "queries": [{
            "name": name, "input_topic": topic, "output_topic": output,
            "privacy_unit": {"namespace": f"{name}-users", "field": "user_id"},
            "timestamp_field": "ts",
            # the backlog is older than the query's first run: its windows are published because the file says so
            "window": {"size": "1m", "allowed_lateness": "5s", "idle_timeout": "2s", "publish_from": iso_ms(start_ms)},
            "group_by": ["page"], "groups": {"public": ["a"]},
            "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1},
            "aggregations": {"count": {}},
            "epsilon": 1.0, "release_timeout": "30s",
            # A backfill: its records carry the times its events happened, which only producers know.
            "trust_producer_timestamps": True,
        }],
    }
    path.write_text(yaml.safe_dump(config))


def run_stream(tmp_path, label: str, bootstrap: str, redis_url: str, unique_name: str, topic: str,
               start_ms: int) -> dict:
    """Start a worker on the backlog in ``topic``; its releases by window and its event counts."""
    name = f"clock_{unique_name[-8:]}_{label}"
    output = f"{unique_name}-{label}-out"
    work = tmp_path / label
    work.mkdir()
    query_file(work / "queries.yaml", name, topic, output, start_ms)
    port = free_port()
    env = dict(os.environ, KAFKA_BOOTSTRAP_SERVERS=bootstrap, REDIS_URL=redis_url,
               STREAM_DP_GROUP_ID=f"{unique_name}-{label}-g", STREAM_DP_INTERNAL_TOPIC_PREFIX=f"{unique_name}.{label}.",
               STREAM_DP_CONTRIBUTION_SECRET="test-secret-0123456789abcdef", STREAM_DP_METRICS_PORT=str(port))
    with open(work / "worker.log", "wb") as log:
        worker = subprocess.Popen([sys.executable, "-m", "stream_dp.cli.main", "run", "--config",
                                   str(work / "queries.yaml")], env=env, stdout=subprocess.DEVNULL, stderr=log)
    wanted = {start_ms + w * MIN for w in range(WINDOWS)}
    try:
        def released_all(records):
            return {orjson.loads(r.value)["window"]["start_ms"] for r in records} >= wanted

        messages = consume_all(bootstrap, output, until=lambda records: released_all(records) or worker.poll() is not None,
                               timeout_s=240)
        time.sleep(1.5)  # the last counters reach /metrics
        text = scrape(port) if worker.poll() is None else ""
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    counts = {}
    for message in messages:
        record = orjson.loads(message.value)
        counts.setdefault(record["window"]["start_ms"], record["count"])
    return {
        "counts": counts,
        "late": metric_sum(text, "stream_dp_events_total", query=name, outcome="late"),
        "accepted": metric_sum(text, "stream_dp_events_total", query=name, outcome="accepted"),
        "log": (work / "worker.log").read_text(errors="replace")[-3000:],
    }


def _produce(bootstrap: str, topic: str, start_ms: int, target: list[tuple[int, bool]]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20, batch_size=256 * 1024)
    for key, value, record_ms in backlog(start_ms, target):
        producer.send(topic, key=key, value=value, timestamp_ms=record_ms)
    producer.flush()
    producer.close()


@pytest.fixture(scope="module")
def d_stream(tmp_path_factory, kafka_bootstrap, redis_url):
    """D, released once by its own worker: its start, its releases by window and its event counts."""
    start_ms = (int(time.time() * 1000) - AGO_MS) // MIN * MIN
    name = f"t-clock-d-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, name, 1, PRODUCER_STAMPED)
    try:
        _produce(kafka_bootstrap, name, start_ms, [])  # no worker ran while the backlog was produced
        d = run_stream(tmp_path_factory.mktemp("clock-d"), "D", kafka_bootstrap, redis_url, name, name, start_ms)
        yield start_ms, d
    finally:
        delete_topics(kafka_bootstrap, [name])


def test_the_backlog_alone_is_released_whole(d_stream):
    _, d = d_stream
    sent = WINDOWS * EVENTS_PER_WINDOW
    assert len(d["counts"]) == WINDOWS, f"windows released: {sorted(d['counts'])}\n{d['log']}"
    assert d["accepted"] == sent and d["late"] == 0, f"D: late {d['late']:.0f}, accepted {d['accepted']:.0f}\n{d['log']}"


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_one_units_records_stamped_zero_or_an_hour_ahead_move_no_clock(tmp_path, kafka_bootstrap, redis_url,
                                                                      new_topic, unique_name, target, d_stream):
    start_ms, d = d_stream
    topic = new_topic("dd", configs=PRODUCER_STAMPED)
    _produce(kafka_bootstrap, topic, start_ms, TARGETS[target](int(time.time() * 1000)))
    dd = run_stream(tmp_path, "Dp", kafka_bootstrap, redis_url, unique_name, topic, start_ms)
    summary = (f"D: late {d['late']:.0f}, accepted {d['accepted']:.0f}; D': late {dd['late']:.0f}, "
               f"accepted {dd['accepted']:.0f}; counts D {sorted(d['counts'].items())}, "
               f"D' {sorted(dd['counts'].items())}")
    print(summary)
    assert d["counts"] and dd["counts"], f"{summary}\nworker log of D:\n{d['log']}\nworker log of D':\n{dd['log']}"
    assert dd["late"] == 0, f"{summary}\n{dd['log']}"
    for w in range(WINDOWS):
        start = start_ms + w * MIN
        assert start in d["counts"] and start in dd["counts"], summary
        assert abs(d["counts"][start] - dd["counts"][start]) <= NOISE_SLACK + (w == 0), summary
