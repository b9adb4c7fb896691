"""An input topic grown inside an open window loses no event sent after its producer saw the growth.

Three worker processes read a topic of 2 partitions (created with LogAppendTime, keyed events,
the default murmur2 partitioner), 20-second windows. Inside one window:

* before the growth, 50 old units send one event each: 20 whose key stays on its partition once
  the topic has 6 (murmur2 % 6 == murmur2 % 2), 30 whose key moves;
* the topic grows from 2 to 6 partitions;
* a producer that sees 6 partitions sends one event each of 20 of the moving units and of 40 new units.

One event per unit and window is counted. A unit must not count twice (its events before and
after the growth sit on two partitions, each bounded on its own), so in the window of the
growth the events placed by the old count of units whose key moved are dropped: the release
holds the 20 staying units, the 20 moved units that sent again, and the 40 new units, 80 of
the 90. The 10 moved units that sent nothing after the growth are the bound of what a growth
costs: their events before it, in the window open at the growth. Seen on the code whose workers
learned of new partitions after 5 minutes (their metadata age) and released without them: 63
(every old unit and the 13 new units whose key fell on partition 0 or 1).
"""

from __future__ import annotations

import datetime
import time

import pytest

from tests.reliability.topics import _kafka, kafka_partition
from tests.worker._live_streams import Deployment, event, producer, sleep_until

WINDOW_MS = 20_000
STAYING, MOVED_TWICE, MOVED_ONCE, NEW = 20, 20, 10, 40
TOLERANCE = 3  # the count's noise at epsilon 10 is about 0.1 (discrete Laplace): 3 is never reached by chance


def _old_units() -> tuple[list[str], list[str], list[str]]:
    staying, moving = [], []
    i = 0
    while len(staying) < STAYING or len(moving) < MOVED_TWICE + MOVED_ONCE:
        unit = f"old-{i}"
        same = kafka_partition(unit, 6) == kafka_partition(unit, 2)
        if same and len(staying) < STAYING:
            staying.append(unit)
        elif not same and len(moving) < MOVED_TWICE + MOVED_ONCE:
            moving.append(unit)
        i += 1
    return staying, moving[:MOVED_TWICE], moving[MOVED_TWICE:]


def _logged_at(log_text: str, needle: str) -> float | None:
    """Epoch seconds of the first log line holding ``needle``."""
    for line in log_text.splitlines():
        if needle in line:
            try:
                return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            except ValueError:
                continue
    return None


def _delays(times: list[float | None], since: float) -> list[float]:
    return sorted(round(t - since, 1) for t in times if t is not None)


def _grow(bootstrap: str, topic: str, partitions: int) -> None:
    kafka = _kafka()
    from kafka.admin import NewPartitions

    admin = kafka.KafkaAdminClient(bootstrap_servers=bootstrap, client_id="stream-dp-tests")
    try:
        admin.create_partitions({topic: NewPartitions(partitions)})
    finally:
        admin.close()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_window_open_at_a_growth_keeps_every_event_sent_after_it(tmp_path, kafka_bootstrap, redis_url):
    stream = Deployment("grow", tmp_path / "grow", kafka_bootstrap, redis_url, partitions=2, workers_count=3,
                        query_settings={"window": {"size": "20s", "allowed_lateness": "1s", "idle_timeout": "3s"}})
    try:
        stream.start()
        stream.wait_assigned()
        staying, moved_twice, moved_once = _old_units()
        new = [f"new-{i}" for i in range(NEW)]
        start = (int(time.time() * 1000) // WINDOW_MS + 1) * WINDOW_MS
        before = producer(kafka_bootstrap)
        assert len(before.partitions_for(stream.topic)) == 2
        sleep_until(start + 2_000)
        for unit in [*staying, *moved_twice, *moved_once]:
            before.send(stream.topic, key=unit.encode(), value=event(unit, int(time.time() * 1000)))
        before.flush()
        before.close()
        sleep_until(start + 4_000)
        grown_at = time.time()
        _grow(kafka_bootstrap, stream.topic, 6)
        after = producer(kafka_bootstrap)
        deadline = time.monotonic() + 30
        while len(after.partitions_for(stream.topic)) != 6:
            assert time.monotonic() < deadline, "the producer did not see the new partitions within 30 s"
            time.sleep(0.2)
        sleep_until(start + 6_000)
        placed = {}
        for unit in [*moved_twice, *new]:
            after.send(stream.topic, key=unit.encode(), value=event(unit, int(time.time() * 1000)))
            placed[unit] = kafka_partition(unit, 6)
        after.flush()
        after.close()
        assert int(time.time() * 1000) < start + WINDOW_MS - 5_000, "the machine was too slow to send inside the window"
        stream.collect([start], timeout_s=240)
        record = stream.releases.get(start)
        withheld = stream.metric("stream_dp_windows_withheld_total", query=stream.query)
        late_partials = stream.metric("stream_dp_late_partials_total", query=stream.query)
        rejected = {reason: stream.metric("stream_dp_events_rejected_total", query=stream.query, reason=reason)
                    for reason in ("wrong_partition", "wrong_key")}
        learned = [_logged_at(w.log_text(), f"input topic {stream.topic} now has 6 partitions") for w in stream.workers]
        owned = [_logged_at(w.log_text(), f"'{stream.topic}[5]'") for w in stream.workers]
        report = (f"workers saw the growth {_delays(learned, grown_at)} s after it, partition 5 was assigned "
                  f"{_delays(owned, grown_at)} s after it; "
                  f"release {record and record['count']}, expected {STAYING + MOVED_TWICE + NEW}; new units on "
                  f"partitions 0-1: {sum(p < 2 for p in placed.values())} of {len(placed)}; withheld {withheld}; "
                  f"late partials {late_partials}; rejected {rejected}")
        print(report)
        assert record is not None, f"window not released: {report}\n{stream.log_tails()}"
        assert abs(record["count"] - (STAYING + MOVED_TWICE + NEW)) <= TOLERANCE, f"{report}\n{stream.log_tails()}"
    finally:
        stream.stop()
