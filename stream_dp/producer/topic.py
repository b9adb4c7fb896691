"""The Kafka side of producing: input topics created as the worker creates them, and a producer that keys by
the privacy unit and places each key with the query's partitioner.

No explicit partition is ever given: the partitioner places the key, as the worker checks
(``stream_dp.windows.placement``). A missing input topic is created as the worker creates one
(``stream_dp.worker.kafka.topic_setup``): ``message.timestamp.type=LogAppendTime``, so that the broker stamps
each record and its windows close by the broker's clock (docs/privacy/clock.md), with the worker's replication
(``STREAM_DP_TOPIC_REPLICATION_FACTOR``, ``STREAM_DP_TOPIC_MIN_INSYNC_REPLICAS``; by default min(3, brokers)
replicas and one fewer in sync).
"""

from __future__ import annotations

import warnings
import zlib
from typing import Any

from stream_dp.windows.partitioning import PARTITIONERS


def kafka_partitioner(name: str) -> Any:
    """The kafka-python partitioner of ``name`` (None: kafka-python's default, already murmur2)."""
    if name not in PARTITIONERS:
        raise ValueError(f"unknown partitioner {name!r}; use one of {', '.join(PARTITIONERS)} (the query's "
                         "`partitioner` setting)")
    if name == "murmur2":
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # kafka-python 3.x import-time warnings
        from kafka.partitioner import Partitioner

    class Crc32Partitioner(Partitioner):
        """librdkafka's ``consistent``: the IEEE CRC-32 of the key modulo the partition count."""

        def partition(self, topic, key, serialized_key, value, serialized_value, cluster):  # type: ignore[no-untyped-def]
            partitions = sorted(cluster.partitions_for_topic(topic))
            if serialized_key is None:  # never for an event: each is keyed by its unit
                available = sorted(cluster.available_partitions_for_topic(topic))
                return (available or partitions)[0]
            return partitions[zlib.crc32(serialized_key) % len(partitions)]

    return Crc32Partitioner()


def ensure_input_topic(client_options: dict[str, Any], topic: str, *, replication_factor: int | None = None,
                       min_insync: int | None = None) -> tuple[bool, dict[str, str]]:
    """Create ``topic`` as the worker creates a missing input topic -- ``LogAppendTime``, its replicas and
    ``min.insync.replicas`` planned from the settings and the brokers (``kafka.topics.replication``: by default
    min(3, brokers) replicas, one fewer in sync), the broker's default partition count -- unless it exists;
    (whether it was created here, its timestamp type config as the broker reports it)."""
    from stream_dp.worker.kafka.admin import create_input_topic, describe_cluster, read_topic_config
    from stream_dp.worker.kafka.input_clock import INPUT_TOPIC_CONFIGS, TIMESTAMP_TYPE
    from stream_dp.worker.kafka.topics import replication

    brokers, _largest_message = describe_cluster(client_options)
    factor, in_sync = replication(replication_factor, min_insync, brokers)
    configs = {**INPUT_TOPIC_CONFIGS, "min.insync.replicas": str(in_sync)}
    created = create_input_topic(client_options, topic, configs, replication_factor=factor)
    return created, read_topic_config(client_options, topic, (TIMESTAMP_TYPE,))


def keyed_producer(client_options: dict[str, Any], partitioner: str, **options: Any) -> Any:
    """A kafka-python producer that waits for every in-sync replica and places keys with ``partitioner``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # kafka-python 3.x import-time warnings
        from kafka import KafkaProducer

    placed = kafka_partitioner(partitioner)
    if placed is not None:
        options["partitioner"] = placed
    return KafkaProducer(**client_options, acks="all", linger_ms=20, batch_size=512 * 1024, compression_type=None,
                         **options)


class KeyedSender:
    """Records to one topic, each keyed by its unit id and placed by ``partitioner``: what ``EventProducer``
    and ``stream-dp produce`` both send through. The Kafka producer is made at the first record."""

    def __init__(self, settings: Any, topic: str, partitioner: str) -> None:
        kafka_partitioner(partitioner)  # an unknown name is refused before anything connects
        self.settings, self.topic, self.partitioner = settings, topic, partitioner
        self.client_options = settings.kafka_client_options()
        self._producer: Any = None

    def ensure_topic(self) -> tuple[bool, dict[str, str]]:
        """``ensure_input_topic`` of this topic, with the replication the settings ask for."""
        return ensure_input_topic(self.client_options, self.topic,
                                  replication_factor=self.settings.topic_replication_factor,
                                  min_insync=self.settings.topic_min_insync_replicas)

    def send(self, key: bytes, value: bytes, timestamp_ms: int | None) -> Any:
        """Send one record (no explicit partition: the partitioner places the key); its future."""
        if self._producer is None:
            self._producer = keyed_producer(self.client_options, self.partitioner)
        return self._producer.send(self.topic, key=key, value=value, timestamp_ms=timestamp_ms)

    def flush(self, timeout_s: float | None = None) -> None:
        if self._producer is not None:
            self._producer.flush() if timeout_s is None else self._producer.flush(timeout=timeout_s)

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()
            self._producer = None
