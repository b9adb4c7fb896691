"""Topic creation and commit-metadata reads, through kafka-python's admin client (blocking; run in a thread)."""

from __future__ import annotations

import logging
import time
import warnings
from typing import Any

from aiokafka.structs import TopicPartition

log = logging.getLogger(__name__)


def _admin(options: dict[str, Any]):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # kafka-python 3.x import-time warnings
        from kafka import KafkaAdminClient
    return KafkaAdminClient(**options, client_id="stream-dp-admin")


def ensure_topics(options: dict[str, Any], topics: dict[str, int], *, timeout_s: float = 30.0) -> dict[str, int]:
    """Create the topics that do not exist yet (name -> partitions); existing ones are left as they are.

    Returns the partition count each topic actually has.
    """
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = _admin(options)
    try:
        existing = set(admin.list_topics())
        missing = [NewTopic(name, partitions, 1) for name, partitions in topics.items() if name not in existing]
        if missing:
            try:
                admin.create_topics(missing)
            except TopicAlreadyExistsError:
                pass  # another worker created it first
            log.info("created topics %s", [t.name for t in missing])
        # Right after creation the metadata may not list a topic's partitions yet.
        deadline = time.monotonic() + timeout_s
        while True:
            counts = {t["name"]: len(t["partitions"] or ()) for t in admin.describe_topics(list(topics))}
            if all(counts.get(name, 0) > 0 for name in topics):
                return counts
            if time.monotonic() > deadline:
                missing = sorted(name for name in topics if counts.get(name, 0) == 0)
                raise RuntimeError(f"topics {missing} report no partitions after {timeout_s:.0f}s; check the broker")
            time.sleep(0.2)
    finally:
        admin.close()


def read_commit_metadata(options: dict[str, Any], group_id: str, partitions: list[TopicPartition]) -> dict[TopicPartition, str]:
    """The metadata string committed with each partition's offset (where window progress is kept)."""
    from kafka.structs import TopicPartition as KafkaTopicPartition

    admin = _admin(options)
    try:
        offsets = admin.list_group_offsets(
            {group_id: [KafkaTopicPartition(tp.topic, tp.partition) for tp in partitions]}
        ).get(group_id, {})
    finally:
        admin.close()
    return {
        TopicPartition(tp.topic, tp.partition): meta.metadata
        for tp, meta in offsets.items()
        if meta is not None and meta.offset >= 0 and meta.metadata
    }
