"""The worker's Kafka clients, sized to the record limits in force (``kafka.topic_setup.TopicLimits``).

Nothing connects here: the caller starts and stops them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import GroupAuthorizationFailedError

from stream_dp.worker.kafka.columnar_consumer import ColumnarConsumer
from stream_dp.worker.kafka.output_producer import OutputProducer, rdkafka_options  # noqa: F401 (the app imports it here)

from stream_dp.worker.kafka.topic_setup import PRODUCER_MAX_REQUEST_BYTES, TopicLimits
from stream_dp.worker.kafka.topics import RECORD_HEADROOM
from stream_dp.worker.query.costs import WorkerConfigError

FETCH_PARTITION_BYTES = 8 * 1024 * 1024
#: How old the consumers' topic metadata may grow (aiokafka's default is 5 minutes): partitions added to
#: an input topic are read, placed and waited for by the release within seconds of the growth.
METADATA_MAX_AGE_MS = 3_000


@dataclass(frozen=True)
class KafkaClients:
    producer: AIOKafkaProducer  # partials (in chunks), progress, alerts, dead letters
    output_producer: OutputProducer  # release records (librdkafka: batches and lz4 outside the event loop)
    ingest_consumer: ColumnarConsumer  # fetched record batches as columns, no object per record
    release_consumer: AIOKafkaConsumer

    async def start(self) -> None:
        """Start every client; a consumer group the broker refuses stops the worker with the ACL it lacks (the
        start check, ``stream_dp.worker.access.check``, can see only Describe on a group not created yet)."""
        try:
            for client in (self.producer, self.output_producer, self.ingest_consumer, self.release_consumer):
                await client.start()
        except GroupAuthorizationFailedError as exc:
            await self.stop()
            raise WorkerConfigError(
                f"the broker refuses the worker's Kafka principal the consumer group {exc.args[0] if exc.args else ''!s}"
                " (it needs Read and Describe on it): grant them with `stream-dp acls --config FILE --worker-principal "
                "User:NAME --apply` (docs/operations/security.md)"
            ) from None

    async def stop(self) -> None:
        for client in (self.ingest_consumer, self.release_consumer, self.producer, self.output_producer):
            await client.stop()


def release_group_id(group_id: str) -> str:
    """The release stage's consumer group (partials topic), beside the ingest stage's ``group_id`` (input topics)."""
    return f"{group_id}-release"


#: The most the internal producer puts in one record batch (aiokafka's default is 16 KiB).
INTERNAL_BATCH_BYTES = 1024 * 1024


def internal_batch_bytes(limits: TopicLimits) -> int:
    """The internal producer's batch size: large, so that the dead letters of a flood of rejected messages
    go out many to a batch (aiokafka keeps one open batch per partition, and a send waits while it is
    full), yet within what the partials and dead-letter topics take, since the broker limits a whole batch."""
    return min(INTERNAL_BATCH_BYTES, limits.partials_record_bytes, limits.dead_letter_record_bytes)


#: aiokafka's own default of ``max_poll_interval_ms``: the least the release consumer is given.
DEFAULT_MAX_POLL_INTERVAL_MS = 300_000


def release_poll_interval_ms(together_release_ms: float) -> int:
    """The release consumer's ``max_poll_interval_ms``: the release stage polls between steps only, and one
    step releases every window that ended, so at the end of the longest window every group-by-group
    release of the file runs before the next poll (``release_time.together_release_ms``). A consumer
    silent for longer leaves its group, and the rebalance drops every unpublished window of its homes: the
    interval covers twice that estimate and a minute for the ledger and the output topics."""
    return max(DEFAULT_MAX_POLL_INTERVAL_MS, int(2 * together_release_ms) + 60_000)


def kafka_clients(aio: dict[str, Any], *, rdkafka: dict[str, Any], client_id: str, group_id: str, limits: TopicLimits,
                  output_wait_s: float, session_timeout_ms: int = 10_000,
                  max_poll_interval_ms: int = DEFAULT_MAX_POLL_INTERVAL_MS) -> KafkaClients:
    """``aio``: connection options in aiokafka's terms (``Settings.aiokafka_options``); ``rdkafka``: the same in
    librdkafka's (``kafka.output_producer.rdkafka_options``), for the output producer;
    ``max_poll_interval_ms``: the release consumer's (``release_poll_interval_ms``)."""
    group = {"session_timeout_ms": session_timeout_ms, "heartbeat_interval_ms": min(3_000, session_timeout_ms // 3)}
    return KafkaClients(
        producer=AIOKafkaProducer(**aio, client_id=f"{client_id}-producer", acks="all", enable_idempotence=True,
                                  linger_ms=5, max_request_size=PRODUCER_MAX_REQUEST_BYTES,
                                  max_batch_size=internal_batch_bytes(limits)),
        # Release records repeat their window's JSON (privacy block, times) in every record: lz4
        # shrinks a batch several times over for the broker, and consumers decompress on their own.
        output_producer=OutputProducer(
            rdkafka, client_id=f"{client_id}-output", batch_bytes=limits.output_batch_bytes,
            max_record_bytes=max([limits.output_batch_bytes, *limits.output_record_bytes.values()]) + RECORD_HEADROOM,
            topic_wait_s=output_wait_s,
        ),
        ingest_consumer=ColumnarConsumer(
            **aio, client_id=f"{client_id}-ingest", group_id=group_id, enable_auto_commit=False,
            auto_offset_reset="earliest", max_partition_fetch_bytes=FETCH_PARTITION_BYTES,
            fetch_max_bytes=64 * 1024 * 1024, metadata_max_age_ms=METADATA_MAX_AGE_MS, **group,
        ),
        # Partial chunks are up to the partials topic's record limit: a fetch takes several.
        release_consumer=AIOKafkaConsumer(
            **aio, client_id=f"{client_id}-release", group_id=release_group_id(group_id), enable_auto_commit=False,
            auto_offset_reset="earliest", max_partition_fetch_bytes=FETCH_PARTITION_BYTES,
            max_poll_interval_ms=max_poll_interval_ms, **group,
        ),
    )
