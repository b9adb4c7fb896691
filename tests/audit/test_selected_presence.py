"""Neighbouring streams through a real worker: over privately selected groups, one unit's lone event must not
decide whether a window publishes anything.

Two input topics, D and D', read by two queries of the same settings (``groups: {select: ...}``, ``count``
and ``top_k: {k: 1}``) in one worker process on the real broker and Redis. Both streams hold, in every even
window, ``BACKGROUND`` units in group "a" (far above the selection threshold: released in both); D' adds a
target unit sending one event to group "t" in every window. "t" has one unit, so the selection keeps it with
probability below 1e-6 a window. Whatever the selection keeps is published alike on both sides, so the
published (window, kind, group) must be the same. On the code before this test, D' also got a top_k record
``{"top": [], "candidates": 0}`` in each odd window, where D got nothing: the record told, without noise,
that somebody had sent an event.

The events are sent live (each window's in its first 200 ms, dated inside it) to input topics stamped with
the broker's clock (``message.timestamp.type=LogAppendTime``), and the windows close on that clock.
"""

from __future__ import annotations

import os
import time
import uuid

import orjson
import pytest
import yaml

from tests.reliability.topics import _kafka, create_topic, delete_topics, read_topic, wait_until
from tests.reliability.workers import WorkerProcess, metric_total

pytestmark = [pytest.mark.services, pytest.mark.slow, pytest.mark.timeout(240)]

WINDOWS = 6
WINDOW_MS = 1_000
BACKGROUND = 40  # units in group "a" in each even window; the threshold at this query's share is about 15
SECRET = "audit-secret-0123456789abcdef"


def _query(name: str, topic: str, output: str, namespace: str) -> dict:
    return {
        "name": name, "input_topic": topic, "output_topic": output,
        "privacy_unit": {"namespace": namespace, "field": "user_id"}, "timestamp_field": "ts",
        # lateness and idleness well above a loaded machine's delays: no event may be late on either side
        "window": {"size": "1s", "allowed_lateness": "2s", "idle_timeout": "3s"},
        "group_by": ["group"], "groups": {"select": {"delta": 1e-6}},
        "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1},
        "aggregations": {"count": {}, "top_k": {"k": 1}}, "epsilon": 3.0,
        "release_timeout": "60s",
    }


def _event(unit: str, ts: int, group: str) -> bytes:
    return orjson.dumps({"user_id": unit, "ts": ts, "group": group})


def test_a_lone_event_over_selected_groups_publishes_nothing_its_absence_would_not(tmp_path, kafka_bootstrap, redis_url):
    run = f"sel{uuid.uuid4().hex[:8]}"
    sides = {"D": False, "D'": True}
    topics = {label: f"{run}-in-{i}" for i, label in enumerate(sides)}
    outputs = {label: f"{run}-out-{i}" for i, label in enumerate(sides)}
    names = {label: f"{run}_{i}" for i, label in enumerate(sides)}
    for topic in topics.values():
        create_topic(kafka_bootstrap, topic, 1, {"message.timestamp.type": "LogAppendTime"})
    config = {
        "namespaces": {f"{run}-{i}": {"budgets": [{"horizon": "1h", "epsilon": 1000.0, "delta": 1e-3}]}
                       for i in range(len(sides))},
        "queries": [_query(names[label], topics[label], outputs[label], f"{run}-{i}") for i, label in enumerate(sides)],
    }
    config_path = tmp_path / "queries.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "STREAM_DP_", "REDIS_"))}
    env.update(KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap, REDIS_URL=redis_url, STREAM_DP_GROUP_ID=f"{run}-g",
               STREAM_DP_INTERNAL_TOPIC_PREFIX=f"{run}.", STREAM_DP_CONTRIBUTION_SECRET=SECRET,
               STREAM_DP_OUTPUT_PARTITIONS="1")
    worker = WorkerProcess("worker", config_path, env, tmp_path)
    producer = None
    try:
        worker.start()
        assert worker.wait_for_log("release homes assigned", 90), worker.log_text()[-3000:]
        assert worker.wait_for_log("stream_dp.worker.ingest.stage: assigned", 90), worker.log_text()[-3000:]
        producer = _kafka().KafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all", linger_ms=5)
        first = (int(time.time() * 1000) // WINDOW_MS + 2) * WINDOW_MS
        starts = [first + w * WINDOW_MS for w in range(WINDOWS)]
        for w, start in enumerate(starts):
            time.sleep(max(0.0, (start + 50) / 1000 - time.time()))
            for label, with_target in sides.items():
                if w % 2 == 0:
                    for i in range(BACKGROUND):
                        unit = f"bg-{w}-{i}"
                        producer.send(topics[label], key=unit.encode(), value=_event(unit, start + 100, "a"))
                if with_target:
                    producer.send(topics[label], key=b"target", value=_event("target", start + 150, "t"))
            producer.flush(timeout=30)

        def released(label: str) -> float:
            return metric_total(worker.scrape() or "", "stream_dp_windows_released_total", query=names[label])

        # D' has a partial in every window, D in the even ones only: each is drawn (and counted) once
        wanted = {"D": WINDOWS // 2, "D'": WINDOWS}
        done = wait_until(lambda: all(released(label) >= n for label, n in wanted.items()), timeout_s=120)
        metrics = worker.scrape() or ""
        assert done, f"windows released: {[released(label) for label in sides]}\n{worker.log_text()[-3000:]}"
        for label in sides:
            late = metric_total(metrics, "stream_dp_events_total", query=names[label], outcome="late")
            assert late == 0, f"{label}: {late} events late (a loaded machine: the comparison would be unfair)"
        published = {}
        for label in sides:
            records = [orjson.loads(r.value) for r in read_topic(kafka_bootstrap, outputs[label])]
            published[label] = {(r["window"]["start_ms"], r.get("kind", "group"),
                                 None if "group" not in r else r["group"]["group"]) for r in records}
    finally:
        if producer is not None:
            producer.close()
        worker.stop(timeout_s=20)
        delete_topics(kafka_bootstrap, [*topics.values(), *outputs.values()])

    # the background's group passes selection in every even window, on both sides (sanity: windows flowed)
    for label in sides:
        assert {(s, "group", "a") for s in starts[::2]} <= published[label], published[label]
    only_d, only_d_prime = published["D"] - published["D'"], published["D'"] - published["D"]
    assert not only_d and not only_d_prime, (
        f"published only without the target: {sorted(only_d)}; only with it: {sorted(only_d_prime)}")
