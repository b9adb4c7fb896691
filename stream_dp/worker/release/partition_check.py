"""Ask the broker what ``release.partition_lag`` judges: an input partition's offsets around a window's close time.

Three questions per partition, all answered by the broker, none by the data: the first offset
whose record timestamp is at or after a time (ListOffsets by timestamp), the log's start and
end (ListOffsets), and the ingest group's committed offset (OffsetFetch). The release stage
asks them only for windows past their release timeout, and only about the partitions they
still wait for. Any failure raises ``PartitionCheckFailed``: the window then keeps waiting.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from stream_dp.worker.release.partition_lag import PartitionEvidence

Committed = Callable[[list[TopicPartition]], Awaitable[dict[TopicPartition, int | None]]]


class PartitionCheckFailed(Exception):
    """The broker did not answer in time, or with an error: nothing can be left out."""


def committed_by(consumer: AIOKafkaConsumer) -> Committed:
    """The committed offsets of ``consumer``'s group (the ingest group), for any of its topics' partitions."""

    async def committed(partitions: list[TopicPartition]) -> dict[TopicPartition, int | None]:
        offsets = await asyncio.gather(*(consumer.committed(tp) for tp in partitions))
        return dict(zip(partitions, offsets))

    return committed


class BrokerPartitions:
    """``PartitionEvidence`` of input partitions, and end offsets of the partials topic, from the broker.

    ``offsets``: a consumer used for ListOffsets only (the release stage's: it need not be assigned
    the partitions it asks about); ``committed``: the ingest group's committed offsets.
    """

    def __init__(self, offsets: AIOKafkaConsumer, committed: Committed, *, timeout_s: float = 10.0) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self.offsets = offsets
        self.committed = committed
        self.timeout_s = timeout_s

    async def evidence(self, partitions: list[TopicPartition], close_ms: int, *,
                       broker_stamps: bool = True) -> dict[TopicPartition, PartitionEvidence]:
        """Each partition's offsets for a window closing at ``close_ms`` (see ``release.partition_lag``).

        ``broker_stamps``: the partitions' clock is the broker's record timestamps (``LogAppendTime``); else
        the producers' stamps decide (``trust_producer_timestamps``), by a rule no single record's timestamp
        meets, so the first record stamped at the close time shows nothing and no close offset is read."""
        async def ask() -> dict[TopicPartition, PartitionEvidence]:
            committed = await self.committed(partitions)
            starts = await self.offsets.beginning_offsets(partitions)
            ends = await self.offsets.end_offsets(partitions)
            closing = await self.offsets.offsets_for_times({tp: close_ms for tp in partitions}) if broker_stamps else {}
            return {
                tp: PartitionEvidence(
                    committed=committed.get(tp), log_start=starts[tp], log_end=ends[tp],
                    close_offset=None if closing.get(tp) is None else closing[tp].offset,
                )
                for tp in partitions
            }

        return await self._within_timeout(ask(), f"offsets of {sorted(map(str, partitions))}")

    async def end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        return await self._within_timeout(self.offsets.end_offsets(partitions),
                                          f"end offsets of {sorted(map(str, partitions))}")

    async def _within_timeout(self, call: Awaitable, what: str):
        try:
            return await asyncio.wait_for(call, self.timeout_s)
        except asyncio.TimeoutError:
            raise PartitionCheckFailed(f"the broker did not answer for the {what} within {self.timeout_s:.0f} s") from None
        except Exception as exc:  # a broker or client error: the window waits and is asked about again
            raise PartitionCheckFailed(f"reading the {what} failed: {exc!r}") from exc
