"""Which input offsets the ingest stage may commit, and what it writes beside them.

An offset is committed only once nothing before it is still needed: no open
window of any query reading the partition, no closed window still held for a
budget charge (its events must be rebuilt after a crash, not skipped as
replayed). The metadata beside it (``kafka.commit_metadata``) makes the closures
durable for the partition's next owner.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from aiokafka.structs import TopicPartition

from stream_dp.worker.ingest.closed_windows import HeldPartial
from stream_dp.worker.kafka.commit_metadata import encode_commit_metadata
from stream_dp.worker.query.runtime import QueryRuntime

Offsets = dict[TopicPartition, tuple[int, str]]
Closures = list[tuple[str, TopicPartition, int]]


def committable_offsets(
    by_topic: Mapping[str, list[QueryRuntime]],
    held: Iterable[HeldPartial],
    assigned: Iterable[TopicPartition],
    *,
    position: Callable[[TopicPartition], int | None],
    progress_through: Callable[[QueryRuntime, int], int | None],
    store: str | None,
) -> tuple[Offsets, Closures]:
    """Offsets (with metadata) safe to commit: nothing before them is still needed;
    and the (query, partition, closed through) that the metadata makes durable.

    ``position``: where reading a partition stands; ``progress_through``: how far a query's
    windows on a partition are closed and not held; ``store``: the store token every commit names.
    """
    offsets: Offsets = {}
    closures: Closures = []
    assigned = set(assigned)
    held = list(held)
    for topic, queries in by_topic.items():
        per_partition: dict[int, int] = {}
        for query in queries:
            for partition, offset in query.engine.committable_offsets().items():
                per_partition[partition] = min(offset, per_partition.get(partition, offset))
        for item in held:
            if item.query.config.input_topic == topic and item.partial.partition in per_partition:
                first = item.partial.first_offset
                per_partition[item.partial.partition] = min(per_partition[item.partial.partition], first)
        for tp in assigned:
            # Nothing processed here (an empty or idle partition): commit where reading stands,
            # so that windows closed on it stay closed for the next owner.
            where = position(tp)
            if tp.topic == topic and tp.partition not in per_partition and where is not None:
                if any(progress_through(q, tp.partition) is not None for q in queries):
                    per_partition[tp.partition] = where
        for partition, offset in per_partition.items():
            tp = TopicPartition(topic, partition)
            if tp not in assigned:
                continue
            # A held window is not closed for a restarted worker either: its
            # events must be rebuilt, not skipped as replayed.
            closed = {q.name: progress_through(q, partition) for q in queries}
            processed = [q.engine.next_offsets.get(partition) for q in queries]
            if not any(o is not None for o in processed):  # nothing read: keep what the earlier owner had
                processed = [q.engine.replay_until_offsets.get(partition) for q in queries]
            clocks = [q.engine.record_clock_ms.get(partition) for q in queries]
            closed = {k: v for k, v in closed.items() if v is not None}
            closures.extend((name, tp, through) for name, through in closed.items())
            metadata = encode_commit_metadata(
                closed,
                {q.name: q.engine.closure_steps.get(partition, ()) for q in queries},
                min((o for o in processed if o is not None), default=offset),
                max((c for c in clocks if c is not None), default=None),
                store=store,
            )
            offsets[tp] = (offset, metadata)
    return offsets, closures
