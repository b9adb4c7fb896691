"""Partials-topic commits: per assigned partition, the position read so far lowered to the first offset
an unpublished window still needs, so a crash replays exactly the pending partials.

The reference is that sentence, computed here from the positions and holds each case sets.
"""

from __future__ import annotations

import asyncio
import time

from aiokafka.structs import TopicPartition

from stream_dp.worker.release.partials_commits import PartialsCommits

TOPIC = "partials"


class _Consumer:
    def __init__(self, assigned: set[int], *, fail: bool = False) -> None:
        self.assigned = assigned
        self.fail = fail
        self.commits: list[dict[int, int]] = []

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition(TOPIC, p) for p in self.assigned}

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        if self.fail:
            raise RuntimeError("coordinator not available")
        assert all(tp.topic == TOPIC for tp in offsets)
        self.commits.append({tp.partition: offset for tp, offset in offsets.items()})


def _expected(read_through: dict[int, int], holds: dict[int, int], assigned: set[int]) -> dict[int, int]:
    positions = {p: last + 1 for p, last in read_through.items()}
    return {p: min(pos, holds.get(p, pos)) for p, pos in positions.items() if p in assigned}


def test_commits_each_assigned_position_lowered_to_its_hold() -> None:
    read_through = {0: 9, 1: 4, 2: 6, 3: 20}
    holds = {0: 3, 2: 50, 5: 1}  # a hold past the position, and one of a partition not read, change nothing
    consumer = _Consumer({0, 1, 2})
    commits = PartialsCommits(consumer, TOPIC, interval_s=3600.0)  # type: ignore[arg-type]
    for partition, offset in read_through.items():
        commits.read_through(partition, offset)
    asyncio.run(commits.commit(lambda: holds))
    assert consumer.commits == [_expected(read_through, holds, consumer.assigned)] == [{0: 3, 1: 5, 2: 7}]


def test_commits_are_spaced_unless_forced_and_a_failed_one_is_retried() -> None:
    consumer = _Consumer({0})
    commits = PartialsCommits(consumer, TOPIC, interval_s=3600.0)  # type: ignore[arg-type]
    asked: list[int] = []

    def holds() -> dict[int, int]:
        asked.append(1)
        return {}

    commits.read_through(0, 1)
    asyncio.run(commits.commit(holds))
    commits.read_through(0, 2)
    asyncio.run(commits.commit(holds))  # within the interval: nothing, and the holds are not walked
    assert consumer.commits == [{0: 2}] and len(asked) == 1
    asyncio.run(commits.commit(holds, force=True))
    assert consumer.commits == [{0: 2}, {0: 3}]

    failing = _Consumer({0}, fail=True)
    retried = PartialsCommits(failing, TOPIC, interval_s=3600.0)  # type: ignore[arg-type]
    retried.read_through(0, 1)
    asyncio.run(retried.commit(lambda: {}))
    failing.fail = False
    asyncio.run(retried.commit(lambda: {}))  # the failed commit did not start the interval
    assert failing.commits == [{0: 2}]


def test_forgotten_partitions_are_not_committed() -> None:
    consumer = _Consumer({0, 1})
    commits = PartialsCommits(consumer, TOPIC, interval_s=0.0)  # type: ignore[arg-type]
    commits.read_through(0, 1)
    commits.read_through(1, 1)
    commits.forget({1})
    asyncio.run(commits.commit(lambda: {}))
    assert consumer.commits == [{0: 2}]


def test_the_first_commit_is_due_on_a_machine_booted_seconds_ago(monkeypatch) -> None:
    # The monotonic clock counts from the boot: here the machine has been up 30 s, less than the interval.
    clock = {"s": 30.0}
    monkeypatch.setattr(time, "monotonic", lambda: clock["s"])
    consumer = _Consumer({0})
    commits = PartialsCommits(consumer, TOPIC, interval_s=3600.0)  # type: ignore[arg-type]
    commits.read_through(0, 1)
    asyncio.run(commits.commit(lambda: {}))
    assert consumer.commits == [{0: 2}]
    commits.read_through(0, 2)
    clock["s"] = 30.0 + 3599.0
    asyncio.run(commits.commit(lambda: {}))
    assert consumer.commits == [{0: 2}]  # the interval counts from that first commit
    clock["s"] = 30.0 + 3600.0
    asyncio.run(commits.commit(lambda: {}))
    assert consumer.commits == [{0: 2}, {0: 3}]
