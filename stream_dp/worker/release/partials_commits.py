"""Which partials-topic offsets the release stage commits, and when.

Per partition, the position read so far, lowered to the first offset that a
window not yet published still needs (the release stage says which): a crash
or a rebalance then replays exactly the partials of unpublished windows.
Commits are spaced by an interval unless forced (at a hand-over or a stop).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from stream_dp.worker.kafka.spacing import Spacing

log = logging.getLogger(__name__)


class PartialsCommits:
    def __init__(self, consumer: AIOKafkaConsumer, topic: str, *, interval_s: float) -> None:
        self.consumer = consumer
        self.topic = topic
        self._positions: dict[int, int] = {}
        self._spacing = Spacing(interval_s)  # the first commit is due at once

    def read_through(self, partition: int, offset: int) -> None:
        """Every record of ``partition`` up to ``offset`` is taken."""
        self._positions[partition] = offset + 1

    def forget(self, partitions: Iterable[int]) -> None:
        """Revoked ``partitions``: their next owner commits them."""
        for partition in partitions:
            self._positions.pop(partition, None)

    async def commit(self, holds: Callable[[], Mapping[int, int]], *, force: bool = False) -> None:
        """Commit every assigned partition's position, lowered to its hold (``holds()``: partition -> offset)."""
        now_s = self._spacing.now()
        if not force and not self._spacing.due(now_s):
            return
        held = holds()  # only asked for when a commit is due: it walks every pending window
        assigned = {tp.partition for tp in self.consumer.assignment()}
        offsets = {}
        for partition, position in self._positions.items():
            if partition in assigned:
                offsets[TopicPartition(self.topic, partition)] = min(position, held.get(partition, position))
        if not offsets:
            return
        try:
            await self.consumer.commit(offsets)
        except Exception as exc:
            log.warning("partials offset commit failed (%s); will retry", exc)
            return
        self._spacing.done(now_s)
