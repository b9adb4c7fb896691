"""The ingest stage's output to the partials topic: a charged window partial, in records that fit.

A partial is encoded as one binary frame (``partials.wire.encode_partial_payload``)
and cut into chunk records no larger than ``max_record_bytes``, the smallest
record limit in force (the broker's ``message.max.bytes``, the partials
topic's ``max.message.bytes`` and the producer's request size, less room for
Kafka's framing; see ``kafka.topics.record_limit``). All chunks go to the window's
home partition in order, and ``send`` returns their delivery futures: the
caller awaits them before any progress marker vouches for the window.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiokafka import AIOKafkaProducer

from stream_dp.worker.partials.homes import window_home
from stream_dp.worker.partials.wire import PartialAggregate, partial_key, partial_records
from stream_dp.worker.query.runtime import settings_fingerprint

_ENCODE_IN_THREAD_GROUPS = 20_000  # larger partials are encoded off the event loop


def partial_message(query: Any, partial: Any, totals: Any, *, input_partitions: int, units: int, excluded: int,
                    closed_at_ms: int) -> PartialAggregate:
    """The budget-filtered partial of ``query`` (a ``QueryRuntime``) as published: ``totals`` are the
    group totals of ``partial`` (a ``WindowPartial``) without its excluded units, with their histogram
    when the query has quantiles (``partial.aggregate(excluded, histogram=query.histogram)``). It names the
    settings its units were just charged under: the release stage combines it only under the same."""
    return PartialAggregate(
        query=query.name,
        window_start_ms=partial.window_start_ms,
        window_end_ms=partial.window_end_ms,
        partition=partial.partition,
        input_partitions=input_partitions,
        groups=list(totals.groups),
        count=totals.count,
        sum=totals.sum if query.config.aggregations.sum is not None else None,
        distinct_units=totals.distinct_units,
        units_charged=units - excluded,
        units_excluded=excluded,
        closed_at_ms=closed_at_ms,
        placement_partitions=partial.partition_count,
        placement_changed=partial.partition_count_changed,
        histogram=totals.histogram,
        features=totals.features,
        blocks=totals.blocks,
        settings=settings_fingerprint(query),
        public_positions=totals.positions,
    )


class PartialsOut:
    def __init__(self, producer: AIOKafkaProducer, metrics: Any, *, topic: str, partitions: int,
                 max_record_bytes: int, periods: dict[str, tuple[int, int]] | None = None) -> None:
        self.producer = producer
        self.metrics = metrics
        self.topic = topic
        self.partitions = partitions
        self.max_record_bytes = max_record_bytes
        self.periods = periods or {}  # continual queries: (period_ms, offset_ms), see ``window_home``

    async def send(self, message: PartialAggregate) -> list[asyncio.Future]:
        """Queue every chunk of ``message`` for its window's home partition; returns their delivery futures."""
        started = time.perf_counter()
        limit = self.max_record_bytes - len(partial_key(message.query, message.window_start_ms))
        if len(message.groups) > _ENCODE_IN_THREAD_GROUPS:
            records = await asyncio.to_thread(partial_records, message, limit)
        else:
            records = partial_records(message, limit)
        home = window_home(message.query, message.window_start_ms, self.partitions, self.periods.get(message.query))
        key = partial_key(message.query, message.window_start_ms)
        sends = [await self.producer.send(self.topic, key=key, value=value, partition=home) for value in records]
        self.metrics.release_stage_seconds.labels(message.query, "partial_send").observe(time.perf_counter() - started)
        return sends
