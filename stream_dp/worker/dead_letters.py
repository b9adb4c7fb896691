"""Rejected events to the dead-letter topic: the original bytes, the reason in headers, always within the limit.

A dead letter carries the event as it came, so one can be as large as the
largest input record. Records must fit the smallest limit in force for the
dead-letter topic (see ``topics.record_limit``); a larger event is cut to
fit, with a ``truncated_from_bytes`` header giving its full size. A send the
producer still refuses is counted and logged, never fatal: losing one dead
letter is better than stopping every query of the worker.
"""

from __future__ import annotations

import logging
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

log = logging.getLogger(__name__)

Header = tuple[str, bytes]
_RECORD_FRAMING = 64  # one record's own varints and attributes, beside its key, value and headers


def dead_letter_record(rejection: Any, query: str, topic: str, max_record_bytes: int) -> tuple[bytes, list[Header]]:
    """The value and headers of a rejected event's dead letter, cut to fit ``max_record_bytes`` in all."""
    value = rejection.value if rejection.value is not None else b""
    headers: list[Header] = [
        ("reason", rejection.reason.value.encode()),
        ("detail", rejection.detail.encode()[:500]),
        ("query", query.encode()),
        ("source", f"{topic}/{rejection.partition}/{rejection.offset}".encode()),
    ]
    truncated = ("truncated_from_bytes", str(len(value)).encode())
    room = max_record_bytes - _RECORD_FRAMING - sum(len(k) + len(v) + 10 for k, v in [*headers, truncated])
    if len(value) > room:
        headers.append(truncated)
        value = value[:max(0, room)]
    return value, headers


class DeadLetters:
    def __init__(self, producer: AIOKafkaProducer, metrics: Any, *, topic: str, max_record_bytes: int) -> None:
        self.producer = producer
        self.metrics = metrics
        self.topic = topic
        self.max_record_bytes = max_record_bytes

    async def send(self, query: str, input_topic: str, rejections: list) -> None:
        for rejection in rejections:
            value, headers = dead_letter_record(rejection, query, input_topic, self.max_record_bytes)
            try:
                # Queued in the producer's buffer (the delivery future is not awaited
                # here); the flush before each commit makes them durable before
                # their offsets are committed.
                await self.producer.send(self.topic, value=value, headers=headers)
            except KafkaError as exc:
                self.metrics.internal_errors.labels("dead_letter_unsent").inc()
                log.error("dead letter of %s/%s/%s (%d bytes) not sent: %s", input_topic, rejection.partition,
                          rejection.offset, len(value), exc)
                continue
            self.metrics.dead_letters.labels(query).inc()
