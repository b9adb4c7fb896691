"""An aiokafka consumer whose ``getmany`` returns columns instead of one ``ConsumerRecord`` per message.

aiokafka fetches whole record batches into memory and then, per message, builds
a ``ConsumerRecord`` in Python; in the worker that object alone cost more than
decoding the event. ``ColumnarConsumer.getmany`` takes the same fetched batches
and reads each partition's records into ``RecordColumns`` with one pass of the
client's compiled batch reader, so no Python code runs per message. Record
batches are read only as far as a ``getmany`` reaches (``max_records``): a
fetch waiting to be returned stays in its compact wire form (see ``_Parsed``).

Everything else is aiokafka's own: group membership, rebalances and their
listener, positions, ``seek``, commits with metadata, highwater marks, fetch
requests and their buffering. ``getmany`` follows ``Fetcher.fetched_records``
step by step -- the same partitions in the same order, ``max_records`` across
them, records below the fetch position skipped, control batches skipped, CRCs
checked, the position advanced exactly as far as records were returned (so a
``seek`` in between discards the rest, as it does in aiokafka), errors raised
at the same point. Where aiokafka filters records per message (read_committed
isolation, key or value deserializers), it falls back to aiokafka's own reader
and converts the records. The private parts of aiokafka it uses are checked
when the consumer is built (``check_compatible``), so a client upgrade that
moves them fails at start-up instead of misreading records.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.consumer.fetcher import READ_COMMITTED, FetchResult, PartitionRecords
from aiokafka.errors import ConsumerStoppedError, CorruptRecordException
from aiokafka.structs import TopicPartition

from stream_dp.worker.kafka.record_columns import RecordColumns

# Where the parsed columns of a fetched partition are kept, on aiokafka's PartitionRecords object.
_PARSED = "_stream_dp_columns"


class _Parsed:
    """A fetched partition's records read into columns as ``getmany`` asks for them, and how far it has
    returned them.

    A fetch holds up to ``max_partition_fetch_bytes`` of one partition (some 100,000 small records when the
    worker is behind); read into columns at once they cost several times their raw bytes as Python objects
    for as long as the fetch is being returned. Record batches are therefore read only as far as the
    records asked for (``getmany``'s ``max_records``) reach: what waits in memory is the fetched bytes,
    plus at most ``max_records`` records and one record batch as columns.
    """

    __slots__ = ("columns", "cursor", "end_offset", "error", "exhausted")

    def __init__(self, records: PartitionRecords) -> None:
        # ``records`` itself is not kept: it holds this object, and a cycle would keep the fetch until a collection
        self.columns = RecordColumns.empty()
        self.cursor = 0  # records of ``columns`` already returned
        self.end_offset = records.next_fetch_offset  # the fetch position once every record read is returned
        self.error: Exception | None = None  # raised once the records before it are returned
        self.exhausted = False  # every record batch of the fetch has been read

    @property
    def waiting(self) -> int:
        return len(self.columns) - self.cursor

    def all_returned(self) -> bool:
        return self.exhausted and self.error is None and self.cursor == len(self.columns)


def check_compatible() -> None:
    """Raise ``RuntimeError`` if the installed aiokafka lacks what ``ColumnarConsumer`` reads."""
    missing = [f"FetchResult.{name}" for name in ("check_assignment", "has_more", "_update_position", "getall")
               if not hasattr(FetchResult, name)]
    missing += [f"PartitionRecords.{name}" for name in ("_consumer_record", "_unpack_records")
                if not hasattr(PartitionRecords, name)]
    if missing:
        import aiokafka

        raise RuntimeError(f"aiokafka {aiokafka.__version__} lacks {', '.join(missing)}, which the columnar reader "
                           "uses; install a supported aiokafka (see pyproject.toml)")


def parse_partition(records: PartitionRecords, parsed: _Parsed, wanted: int | None) -> None:
    """Read record batches of ``records`` (one fetch response for one partition) into ``parsed.columns`` until at least
    ``wanted`` records (None: all) wait to be returned, the fetch is read to its end, or a batch is corrupt.

    The same rules as ``PartitionRecords._unpack_records``: records below the fetch
    offset (the part of a batch before the requested position) and control batches
    are skipped, the position after a batch is its ``next_offset``, and a batch whose
    CRC does not match ends the reading with ``CorruptRecordException``.
    """
    memory = records._records
    position = parsed.end_offset
    parts: list[RecordColumns] = [parsed.columns[parsed.cursor:]] if parsed.waiting else []
    waiting = parsed.waiting
    while (wanted is None or waiting < wanted) and parsed.error is None:
        if not memory.has_next():
            parsed.exhausted = True
            break
        batch = memory.next_batch()
        if records._check_crcs and not batch.validate_crc():
            parsed.error = CorruptRecordException(f"Invalid CRC - {records._tp}")
            break
        if getattr(batch, "is_control_batch", False):
            position = batch.next_offset
            continue
        batch_records = list(batch)
        if batch_records:
            consecutive = None
            if getattr(batch, "magic", 0) >= 2 and len(batch_records) == batch.last_offset_delta + 1:
                consecutive = batch.base_offset  # offset deltas 0..n-1: no gaps (nothing compacted away)
            # who stamped the records (the broker with LogAppendTime) decides whether they move the window clock
            columns = RecordColumns.of_records(batch_records, consecutive_from=consecutive,
                                               timestamp_type=getattr(batch, "timestamp_type", None))
            del batch_records
            if columns.offsets[0] < position:
                columns = columns.from_offset(position)
            if columns:
                parts.append(columns)
                waiting += len(columns)
        position = max(position, batch.next_offset)
    parsed.columns = RecordColumns.concat(parts)
    parsed.cursor = 0
    parsed.end_offset = position


class ColumnarConsumer(AIOKafkaConsumer):
    """``AIOKafkaConsumer`` whose ``getmany`` returns ``{TopicPartition: RecordColumns}``.

    ``RecordColumns`` reads like a list of records (``len``, ``[0].offset``,
    iteration), so callers written for aiokafka's lists keep working.
    """

    def __init__(self, *topics: str, **options: Any) -> None:
        check_compatible()
        super().__init__(*topics, **options)

    async def getmany(self, *partitions: TopicPartition, timeout_ms: int = 0,  # type: ignore[override]
                      max_records: int | None = None) -> dict[TopicPartition, RecordColumns]:
        if self._closed:
            raise ConsumerStoppedError()
        if max_records is not None and (not isinstance(max_records, int) or max_records < 1):
            raise ValueError("`max_records` must be a positive Integer")
        self._coordinator.check_errors()
        with self._subscription.fetch_context():
            return await self._fetched_columns(set(partitions), timeout_ms / 1000,
                                               max_records or self._max_poll_records)

    async def _fetched_columns(self, partitions: set[TopicPartition], timeout: float,
                               max_records: int | None) -> dict[TopicPartition, RecordColumns]:
        """``Fetcher.fetched_records`` with columns (see the module docstring)."""
        fetcher = self._fetcher
        while True:
            if fetcher._subscriptions.reassignment_in_progress:
                await fetcher._subscriptions.wait_for_assignment()
            start_time = time.monotonic()
            drained: dict[TopicPartition, RecordColumns] = {}
            for tp in list(fetcher._records.keys()):
                if partitions and tp not in partitions:
                    if not fetcher._subscriptions.is_assigned(tp):
                        del fetcher._records[tp]
                    continue
                result = fetcher._records[tp]
                if type(result) is FetchResult:
                    columns = _take(result, max_records)
                    if not result.has_more():
                        del fetcher._records[tp]
                        fetcher._notify(fetcher._wait_consume_future)
                    if not columns:
                        continue
                    drained[tp] = columns
                    if max_records is not None:
                        max_records -= len(columns)
                        if max_records == 0:
                            break
                elif drained:
                    return drained  # the error is raised on the next call
                else:
                    del fetcher._records[tp]
                    fetcher._notify(fetcher._wait_consume_future)
                    result.check_raise()
            if drained or not timeout:
                return drained
            waiter = fetcher._create_fetch_waiter()
            done, pending = await asyncio.wait([waiter], timeout=timeout)
            if not done or fetcher._closed:
                if pending:
                    pending.pop().cancel()
                return {}
            if waiter.done():
                waiter.result()
            timeout = max(0.0, timeout - (time.monotonic() - start_time))


def _take(result: FetchResult, max_records: int | None) -> RecordColumns:
    """``FetchResult.getall`` as columns: up to ``max_records`` records, position moved past them."""
    tp = result._topic_partition
    if not result.check_assignment(tp) or not result.has_more():
        return RecordColumns.empty()
    records: PartitionRecords = result._partition_records
    if records._isolation_level == READ_COMMITTED or records._key_deserializer or records._value_deserializer:
        return RecordColumns.of_records(result.getall(max_records))  # aiokafka filters or converts per record
    parsed: _Parsed | None = getattr(records, _PARSED, None)
    if parsed is None:
        parsed = _Parsed(records)
        setattr(records, _PARSED, parsed)
    if max_records is None or parsed.waiting < max_records:
        parse_partition(records, parsed, max_records)
    columns = parsed.columns
    total, start = len(columns), parsed.cursor
    if start == total and parsed.error is not None:
        result._partition_records = None  # dropped: fetched again from the unchanged position, and raised again
        raise parsed.error
    stop = total if max_records is None else min(total, start + max_records)
    if stop == total and parsed.error is None:
        records.next_fetch_offset = parsed.end_offset  # past trailing control batches and compacted offsets
    elif stop > start:
        records.next_fetch_offset = int(columns.offsets[stop - 1]) + 1
    parsed.cursor = stop
    result._update_position()
    if parsed.all_returned():
        result._partition_records = None  # all returned: the fetcher asks for more
    return columns if (start == 0 and stop == total) else columns[start:stop]
