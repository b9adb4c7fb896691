"""Rejected events to the dead-letter topic: a bounded copy (head, size, digest), the reason in headers.

One record per rejected event, about a kilobyte whatever the event's size
(``stream_dp.wire.letters``): a flood of large rejected messages neither fills
the topic nor slows the worker that writes it. A send the producer refuses is
counted and logged, never fatal: losing one dead letter is better than
stopping every query of the worker.
"""

from __future__ import annotations

import logging
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from stream_dp.wire.letters import Header, dead_letter_record

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
            head, stamped = dead_letter_record(value, headers, self.max_record_bytes)
            source = dict(headers)["source"]
            try:
                # Queued in the producer's buffer (the delivery future is not awaited here); the
                # flush before each commit makes them durable before their offsets are committed.
                await self.producer.send(self.topic, key=source, value=head, headers=stamped)
            except KafkaError as exc:
                self.metrics.internal_errors.labels("dead_letter_unsent").inc()
                log.error("dead letter of %s (an event of %d bytes) not sent: %s", source.decode(), len(value), exc)
                continue
            self.metrics.dead_letters.labels(query).inc()
