"""Topic creation, cluster, topic-config and commit-metadata reads, through kafka-python's admin client
(blocking; run in a thread), and the check that the partials topic forgets before the release ledger does.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Mapping
from typing import Any

from aiokafka.structs import TopicPartition

from stream_dp.worker.kafka.topics import TopicState, fix_command

log = logging.getLogger(__name__)


def _admin(options: dict[str, Any]):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # kafka-python 3.x import-time warnings
        from kafka import KafkaAdminClient
    return KafkaAdminClient(**options, client_id="stream-dp-admin")


def ensure_topics(
    options: dict[str, Any],
    topics: dict[str, int],
    *,
    configs: Mapping[str, Mapping[str, str]] | None = None,
    replication: Mapping[str, int] | None = None,
    timeout_s: float = 30.0,
) -> dict[str, int]:
    """Create the topics that do not exist yet (name -> partitions, with ``configs[name]`` and
    ``replication[name]`` replicas (1) if given); existing ones are left as they are.

    Returns the partition count each topic actually has.
    """
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    configs = configs or {}
    replication = replication or {}
    admin = _admin(options)
    try:
        existing = set(admin.list_topics())
        missing = [
            NewTopic(name, partitions, replication.get(name, 1), topic_configs=dict(configs.get(name, {})))
            for name, partitions in topics.items()
            if name not in existing
        ]
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


def create_input_topic(options: dict[str, Any], topic: str, configs: Mapping[str, str], replication_factor: int = -1) -> bool:
    """Create ``topic`` with ``configs``, the broker's default partition count and ``replication_factor`` replicas
    (-1: the broker's default), unless it exists (``stream_dp.producer``; the worker creates its own in
    ``kafka.topic_setup``). True when it was created here."""
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = _admin(options)
    try:
        if topic in set(admin.list_topics()):
            return False
        try:
            admin.create_topics([NewTopic(topic, -1, replication_factor, topic_configs=dict(configs))])
        except TopicAlreadyExistsError:
            return False  # created meanwhile, by someone else
        return True
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


def read_group_metadata(options: dict[str, Any], group_id: str, topics: set[str]) -> list[str]:
    """The metadata strings committed with every partition of ``topics`` the group ever committed (not only
    the ones this worker is assigned). Raises when the broker does not answer."""
    admin = _admin(options)
    try:
        offsets = admin.list_group_offsets({group_id: None}).get(group_id, {})
    finally:
        admin.close()
    return [meta.metadata for tp, meta in offsets.items()
            if tp.topic in topics and meta is not None and meta.offset >= 0 and meta.metadata]


RETENTION_CONFIGS = ("cleanup.policy", "retention.ms", "segment.ms")
CHECKED_CONFIGS = (*RETENTION_CONFIGS, "min.insync.replicas", "max.message.bytes")


def describe_cluster(options: dict[str, Any]) -> tuple[int, int | None]:
    """(number of brokers, the smallest ``message.max.bytes`` among them, or None when the brokers do not
    say: a user without DescribeConfigs on the cluster; each topic's ``max.message.bytes`` then decides)."""
    from kafka.admin import ConfigResource, ConfigResourceType
    from kafka.errors import KafkaError

    admin = _admin(options)
    try:
        brokers = [str(b["broker_id"]) for b in admin.describe_cluster()["brokers"]]
        try:
            described = admin.describe_configs(
                [ConfigResource(ConfigResourceType.BROKER, b, configs={"message.max.bytes": None}) for b in brokers],
                config_filter="all",
            )
        except KafkaError as exc:
            log.warning("cannot read the brokers' message.max.bytes (%s); the topics' max.message.bytes decide", exc)
            described = {}
    finally:
        admin.close()
    limits = [int(entry["message.max.bytes"]["value"]) for entry in described.get("broker", {}).values()
              if entry.get("message.max.bytes", {}).get("value") is not None]
    if brokers and len(limits) < len(brokers):
        log.warning("%d of %d brokers did not report message.max.bytes (grant the worker's Kafka user "
                    "DescribeConfigs on the cluster); the topics' max.message.bytes decide", len(brokers) - len(limits),
                    len(brokers))
    return len(brokers), min(limits) if len(limits) == len(brokers) and limits else None


def describe_topics(options: dict[str, Any], topics: list[str], names: tuple[str, ...] = CHECKED_CONFIGS) -> dict[str, TopicState]:
    """Replicas per partition (the fewest) and the named configs in force of each topic."""
    from kafka.admin import ConfigResource, ConfigResourceType

    admin = _admin(options)
    try:
        described = admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, t, configs=dict.fromkeys(names)) for t in topics],
            config_filter="all",
        ).get("topic", {})
        replicas = {
            t["name"]: min((len(p["replica_nodes"]) for p in t["partitions"] or ()), default=0)
            for t in admin.describe_topics(topics)
        }
    finally:
        admin.close()
    return {
        topic: TopicState(
            replicas.get(topic, 0),
            {n: e["value"] for n, e in described.get(topic, {}).items() if e.get("value") is not None},
        )
        for topic in topics
    }


def read_topic_config(options: dict[str, Any], topic: str, names: tuple[str, ...]) -> dict[str, str]:
    """The values in force (the topic's own, else the broker's defaults) of the named configs of ``topic``."""
    from kafka.admin import ConfigResource, ConfigResourceType

    admin = _admin(options)
    try:
        # "all": without it the broker reports only values set on the topic itself, not defaults in force.
        described = admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic, configs=dict.fromkeys(names))], config_filter="all"
        )
    finally:
        admin.close()
    entries = described.get("topic", {}).get(topic, {})
    return {name: entry["value"] for name, entry in entries.items() if entry.get("value") is not None}


def partials_retention_problem(
    topic: str, config: Mapping[str, str], *, ledger_ttl_s: int, wanted: Mapping[str, str], bootstrap: str
) -> str | None:
    """Why the partials topic could keep a partial longer than the release ledger keeps entries, or None.

    ``config``: the topic's ``cleanup.policy``, ``retention.ms`` and ``segment.ms``
    in force. Kafka deletes whole segments once their newest record is past
    ``retention.ms``, and rolls a segment after ``segment.ms``, so a record may
    stay up to their sum. ``wanted``: the configs the worker would create the
    topic with, for the fix. (The release stage also drops partials that old,
    whatever the topic keeps: this check keeps the two guards independent.)
    """
    limit_ms = ledger_ttl_s * 1000
    fix = f"fix it with {fix_command(bootstrap, topic, wanted)}"
    absent = [name for name in RETENTION_CONFIGS if name not in config]
    if absent:
        return (
            f"the broker did not report {', '.join(absent)} of the partials topic {topic!r}, so the worker cannot "
            "check that partials are deleted before the release ledger forgets their windows; grant the worker's "
            "Kafka user DescribeConfigs on the topic"
        )
    policy = config["cleanup.policy"]
    if "delete" not in {p.strip() for p in policy.split(",")}:
        return (
            f"the partials topic {topic!r} has cleanup.policy={policy}, which never deletes old partials, while the "
            f"release ledger forgets a window after STREAM_DP_LEDGER_TTL_S={ledger_ttl_s} s; {fix}"
        )
    retention_ms, segment_ms = int(config["retention.ms"]), int(config["segment.ms"])
    if retention_ms < 0:
        return (
            f"the partials topic {topic!r} has retention.ms={retention_ms} (kept forever), while the release ledger "
            f"forgets a window after STREAM_DP_LEDGER_TTL_S={ledger_ttl_s} s; {fix}"
        )
    if retention_ms + segment_ms > limit_ms:
        return (
            f"the partials topic {topic!r} may keep a partial for retention.ms + segment.ms = {retention_ms} + "
            f"{segment_ms} = {retention_ms + segment_ms} ms (Kafka deletes whole segments), longer than the "
            f"{limit_ms} ms the release ledger remembers a window (STREAM_DP_LEDGER_TTL_S={ledger_ttl_s}); {fix}, "
            f"or raise STREAM_DP_LEDGER_TTL_S to at least {-(-(retention_ms + segment_ms) // 1000)}"
        )
    return None
