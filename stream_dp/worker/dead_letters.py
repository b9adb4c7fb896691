"""Rejected events to the dead-letter topic: the original bytes, the reason in headers, in records that fit.

A dead letter carries the event as it came, so it can be as large as the
largest input record. Records must fit the smallest limit in force for the
dead-letter topic (see ``topics.record_limit``): a larger event is split
into several records (``stream_dp.wire.letters``, which also joins them
back). A send the producer still refuses is counted and logged, never
fatal: losing one dead letter is better than stopping every query of the worker.
"""

from __future__ import annotations

import logging
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from stream_dp.wire.letters import Header, dead_letter_records

log = logging.getLogger(__name__)


def dead_letter_headers(rejection: Any, query: str, topic: str) -> list[Header]:
    return [
        ("reason", rejection.reason.value.encode()),
        ("detail", rejection.detail.encode()[:500]),
        ("query", query.encode()),
        ("source", f"{topic}/{rejection.partition}/{rejection.offset}".encode()),
    ]


class DeadLetters:
    def __init__(self, producer: AIOKafkaProducer, metrics: Any, *, topic: str, max_record_bytes: int) -> None:
        self.producer = producer
        self.metrics = metrics
        self.topic = topic
        self.max_record_bytes = max_record_bytes

    async def send(self, query: str, input_topic: str, rejections: list) -> None:
        for rejection in rejections:
            headers = dead_letter_headers(rejection, query, input_topic)
            value = rejection.value if rejection.value is not None else b""
            records = dead_letter_records(value, headers, self.max_record_bytes)
            source = dict(headers)["source"]
            try:
                for piece, piece_headers in records:
                    # Queued in the producer's buffer (the delivery future is not awaited
                    # here); the flush before each commit makes them durable before
                    # their offsets are committed. Keyed by source: all pieces on one partition.
                    await self.producer.send(self.topic, key=source, value=piece, headers=piece_headers)
            except KafkaError as exc:
                self.metrics.internal_errors.labels("dead_letter_unsent").inc()
                log.error("dead letter of %s (%d bytes in %d records) not sent: %s", source.decode(), len(value),
                          len(records), exc)
                continue
            self.metrics.dead_letters.labels(query).inc()
