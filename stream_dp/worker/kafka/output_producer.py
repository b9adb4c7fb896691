"""The producer of release records: librdkafka (confluent-kafka) behind a small asyncio face.

A window of a million groups is a million records of ~800 bytes. Through
aiokafka every record was appended to its batch in Python and every batch
compressed with lz4 at level 9 on the event loop; librdkafka batches and
compresses (lz4, its fast default level) in its own threads, outside the GIL,
so the event loop only renders records and hands them over
(``release.publish``). Everything else of the worker stays on aiokafka.

A topic that is missing or has no leader yet is waited for, as aiokafka's
``partitions_for`` waits: an output topic deleted while the worker runs is
created again by the broker on the first request for it
(``auto.create.topics.enable``), and the window publishes into it. A broker
that cannot be reached (stopped, killed, restarting) is waited for the same
way; after ``topic_wait_s`` the release stage holds the window
(``OutputTopicUnavailable``) and tries it again later, the same records from
the ledger.

Delivery reports (of failed records only) are served by ``poll`` and
``flush``, run in a thread so the event loop keeps both consumers' heartbeats
going while the broker acknowledges. The producer is idempotent with
``acks=all``, as aiokafka's was.

``rdkafka_options`` maps the worker's connection settings (``Settings.kafka_client_options``:
bootstrap servers, security protocol, SASL, TLS files) to librdkafka's names.
"""

from __future__ import annotations

import asyncio
import time
from itertools import islice
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

#: Bytes of records waiting in librdkafka's queue before ``produce`` refuses more (``BufferError``):
#: a window of a million groups is never all in memory.
QUEUE_KBYTES = 64 * 1024
_FLUSH_STEP_S = 0.5
_ROOM_POLL_S = 0.002
_TOPIC_RETRY_S = 0.25
#: Metadata errors of a topic that is not there yet: deleted (the request asks the broker to create it again)
#: or being created. Any other error (e.g. not authorised) is raised at once.
_TOPIC_COMING = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.LEADER_NOT_AVAILABLE,
                           KafkaError._UNKNOWN_TOPIC})
#: Errors of a metadata request no broker answered: the broker is down or restarting, and is waited for.
_BROKER_AWAY = frozenset({KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN,
                          KafkaError._RESOLVE, KafkaError.REQUEST_TIMED_OUT, KafkaError.BROKER_NOT_AVAILABLE})


def rdkafka_options(client_options: dict[str, Any]) -> dict[str, Any]:
    """``Settings.kafka_client_options`` (kafka-python names) in librdkafka's names."""
    names = {
        "bootstrap_servers": "bootstrap.servers", "security_protocol": "security.protocol",
        "sasl_mechanism": "sasl.mechanism", "sasl_plain_username": "sasl.username",
        "sasl_plain_password": "sasl.password", "ssl_cafile": "ssl.ca.location",
        "ssl_certfile": "ssl.certificate.location", "ssl_keyfile": "ssl.key.location",
    }
    unknown = set(client_options) - set(names)
    if unknown:
        raise ValueError(f"Kafka client options {sorted(unknown)} have no librdkafka name; add them to rdkafka_options")
    out = {names[key]: value for key, value in client_options.items() if value is not None}
    if isinstance(out.get("bootstrap.servers"), list):
        out["bootstrap.servers"] = ",".join(out["bootstrap.servers"])
    return out


class OutputPublishFailed(RuntimeError):
    """The broker did not take a release record; the window stays unpublished and is published again from
    the ledger by the next attempt (the same records)."""


class OutputTopicUnavailable(KafkaException):
    """An output topic did not exist (with partitions), or no broker answered for it, within ``topic_wait_s``
    (``STREAM_DP_OUTPUT_WAIT_S``)."""


class OutputProducer:
    """An idempotent librdkafka producer of release records (see the module docstring)."""

    def __init__(self, options: dict[str, Any], *, client_id: str, batch_bytes: int, max_record_bytes: int,
                 linger_ms: int = 5, topic_wait_s: float) -> None:
        """``options``: connection settings in librdkafka's names (``rdkafka_options``); ``batch_bytes``: the most
        one record batch holds, within what the output topics take; ``max_record_bytes``: the largest record
        the producer accepts (the largest output topic record limit, with framing); ``topic_wait_s``: how long
        ``partitions_for`` waits for a broker and the topic (``Settings.output_wait_s``)."""
        self._config = {
            **options, "client.id": client_id, "acks": "all", "enable.idempotence": True,
            "linger.ms": linger_ms, "compression.type": "lz4", "batch.size": batch_bytes,
            "message.max.bytes": max(max_record_bytes, batch_bytes) + 16_384,
            "queue.buffering.max.kbytes": QUEUE_KBYTES, "queue.buffering.max.messages": 2_000_000,
            "log_level": 4,  # warnings and errors, through librdkafka's own log lines
            # Only failed records come back through a callback: a Python call per acknowledged record cost
            # a sixth of the publish's CPU; ``flush`` still waits for every acknowledgement.
            "delivery.report.only.error": True, "on_delivery": self._failed,
        }
        self._topic_wait_s = topic_wait_s
        self._producer: Producer | None = None
        self._failures: list[Any] = []

    def _failed(self, error: Any, _message: Any) -> None:
        if error is not None:  # reported only for failures (``delivery.report.only.error``), checked anyway
            self._failures.append(error)

    async def start(self) -> None:
        self._producer = Producer(self._config)
        # Connect now, as aiokafka's start does: a broker that cannot be reached fails the start, not a release.
        await asyncio.to_thread(self._producer.list_topics, timeout=30)

    async def stop(self) -> None:
        if self._producer is not None:
            await asyncio.to_thread(self._producer.flush, 30)
            self._producer = None

    @property
    def _client(self) -> Producer:
        if self._producer is None:
            raise RuntimeError("the output producer is not started")
        return self._producer

    async def partitions_for(self, topic: str) -> set[int]:
        """The topic's partitions, once it exists with some and a broker answers (see the module docstring);
        raises ``OutputTopicUnavailable`` after ``topic_wait_s``, at once on any other metadata error."""
        deadline = time.monotonic() + self._topic_wait_s
        while True:
            remaining_s = max(1.0, min(10.0, deadline - time.monotonic()))
            try:
                metadata = await asyncio.to_thread(self._client.list_topics, topic, remaining_s)
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if not isinstance(error, KafkaError) or error.code() not in _BROKER_AWAY:
                    raise
                away = True
            else:
                away = False
                described = metadata.topics.get(topic)
                error = None if described is None else described.error
                if described is not None and error is None and described.partitions:
                    return set(described.partitions)
                if error is not None and error.code() not in _TOPIC_COMING:
                    raise KafkaException(error)
            if time.monotonic() >= deadline:
                if away:
                    raise OutputTopicUnavailable(
                        f"no Kafka broker answered for output topic {topic} in {self._topic_wait_s:.0f}s ({error}): "
                        f"the window is held and published once a broker answers; check the brokers and "
                        f"KAFKA_BOOTSTRAP_SERVERS")
                raise OutputTopicUnavailable(
                    f"output topic {topic} has not existed with partitions for {self._topic_wait_s:.0f}s "
                    f"({error or 'not in the metadata'}): create it, or let the broker create topics on use "
                    f"(auto.create.topics.enable)")
            await asyncio.sleep(_TOPIC_RETRY_S)

    def records_to(self, topic: str) -> RecordSender:
        """A sender of records to ``topic`` that tells, at ``wait``, whether the broker took every one. One
        sender at a time: the release stage publishes one window after the other."""
        self._failures.clear()
        return RecordSender(self._client, topic, self._failures)

    async def send_and_wait(self, topic: str, *, key: bytes | None, value: bytes, partition: int | None = None) -> None:
        """One record, acknowledged (tools and tests)."""
        sender = self.records_to(topic)
        if partition is None:
            partition = min(await self.partitions_for(topic))
        await sender.send(key, value, partition)
        await sender.wait()


class RecordSender:
    """Hands records of one topic to librdkafka and collects their delivery reports."""

    def __init__(self, producer: Producer, topic: str, failures: list[Any]) -> None:
        self._producer = producer
        self._topic = topic
        self._failures = failures  # filled by the producer's delivery reports, served by poll and flush
        self.sent = 0

    def send_now(self, key: bytes, value: bytes, partition: int) -> bool:
        """Queue one record; False if librdkafka's queue is full (then ``await send`` it)."""
        try:
            self._producer.produce(self._topic, value, key, partition)
        except BufferError:
            return False
        self.sent += 1
        return True

    def send_many(self, keys: list[bytes], values: list[bytes], partitions: list[int], start: int = 0) -> int:
        """Queue records ``start`` .. of the three aligned lists until librdkafka's queue is full; returns the
        index of the first record not queued (``len(keys)`` when all were). One loop of ``produce`` calls:
        no Python call of this module per record."""
        produce, topic = self._producer.produce, self._topic
        done = start
        try:
            for key, value, partition in zip(islice(keys, start, None), islice(values, start, None),
                                             islice(partitions, start, None)):
                produce(topic, value, key, partition)
                done += 1
        except BufferError:
            pass
        self.sent += done - start
        return done

    async def make_room(self) -> None:
        """Until the broker has taken half of what the full queue held (in a thread, serving delivery reports)."""
        await asyncio.to_thread(self._make_room)
        self._raise_failures()

    async def send(self, key: bytes, value: bytes, partition: int) -> None:
        """Queue one record, waiting (in a thread, serving delivery reports) while the queue is full."""
        while not self.send_now(key, value, partition):
            await asyncio.to_thread(self._make_room)
        self._raise_failures()

    def _make_room(self) -> None:
        """Until the broker has taken half of what the full queue held. ``poll`` alone would wait out its whole
        timeout: with reports of failures only, an acknowledgement wakes nobody."""
        target = len(self._producer) // 2
        while len(self._producer) > target:
            self._producer.poll(_ROOM_POLL_S)

    def serve(self) -> None:
        """Delivery reports that have come, without waiting; raises on a failed record."""
        self._producer.poll(0)
        self._raise_failures()

    async def wait(self) -> None:
        """Until the broker acknowledged every queued record (librdkafka reports each, delivered or failed,
        within its ``message.timeout.ms``); raises ``OutputPublishFailed`` if any failed."""
        while await asyncio.to_thread(self._producer.flush, _FLUSH_STEP_S):
            self._raise_failures()
        self._raise_failures()

    def _raise_failures(self) -> None:
        if self._failures:
            raise OutputPublishFailed(f"{len(self._failures)} release record(s) to {self._topic} were not "
                                      f"acknowledged, the first: {self._failures[0]}")
