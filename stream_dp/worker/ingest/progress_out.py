"""Progress markers out of the ingest stage: how far each owned input partition has closed, told to
every release consumer (a ``partials.wire.Progress`` to every partition of the partials topic).

A marker vouches only for closure that later owners of the partition keep: a held window (not yet
charged and published) is not closed for the release stage, and closure past what the committed
offsets make durable (``kafka.positions``) is not sent. An unchanged marker is sent again only as a
heartbeat, every ``interval_s``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence

from aiokafka import AIOKafkaProducer
from aiokafka.structs import TopicPartition

from stream_dp.worker.ingest.closed_windows import HeldPartial
from stream_dp.worker.kafka.spacing import Spacing
from stream_dp.worker.partials.wire import Progress, encode_progress
from stream_dp.worker.query.runtime import QueryRuntime


def earliest_held(held: Iterable[HeldPartial]) -> dict[tuple[int, int], int]:
    """Per (``id`` of a query, partition): the start of its earliest held window. Built once per use, so that
    asking every owned partition of every query costs one pass over the held windows, not one each (a backlog
    holds thousands)."""
    earliest: dict[tuple[int, int], int] = {}
    for waiting in held:
        key, start = (id(waiting.query), waiting.partial.partition), waiting.partial.window_start_ms
        earliest[key] = min(start, earliest.get(key, start))
    return earliest


def progress_through(query: QueryRuntime, partition: int, earliest: Mapping[tuple[int, int], int]) -> int | None:
    """Where ``query``'s engine has closed ``partition`` through, held windows not counted as closed
    (``earliest``: ``earliest_held`` of the windows held)."""
    closed = query.engine.closed_through_ms.get(partition)
    if closed is None:
        return None
    held_from = earliest.get((id(query), partition))
    # A held window is not closed for the release stage yet.
    return closed if held_from is None else min(closed, held_from)


class ProgressOut:
    def __init__(self, producer: AIOKafkaProducer, *, topic: str, partitions: int, interval_s: float) -> None:
        self.producer = producer
        self.topic = topic
        self.partitions = partitions
        self._heartbeat_spacing = Spacing(interval_s)
        self._sent: dict[tuple[str, int], int] = {}

    async def send(
        self,
        assignment: Iterable[TopicPartition],
        by_topic: Mapping[str, Sequence[QueryRuntime]],
        *,
        through: Callable[[QueryRuntime, int], int | None],
        durable: Callable[[str, TopicPartition], int | None],
        partition_count: Callable[[str], int],
    ) -> None:
        """Send the markers that changed (all of them when a heartbeat is due) and wait until they are out."""
        now_s = self._heartbeat_spacing.now()
        heartbeat = self._heartbeat_spacing.due(now_s)
        sends = []
        for tp in assignment:
            for query in by_topic.get(tp.topic, ()):
                closed = through(query, tp.partition)
                kept = durable(query.name, tp)
                if closed is None or kept is None:
                    continue
                closed = min(closed, kept)
                key = (query.name, tp.partition)
                if not heartbeat and self._sent.get(key) == closed:
                    continue
                self._sent[key] = closed
                value = encode_progress(Progress(query.name, tp.partition, partition_count(tp.topic), closed))
                # Every release consumer must see every partition's progress:
                # the marker goes to each partition of the partials topic.
                for partials_partition in range(self.partitions):
                    sends.append(await self.producer.send(self.topic, value=value, partition=partials_partition))
        if heartbeat:
            self._heartbeat_spacing.done(now_s)
        if sends:
            await asyncio.gather(*sends)
