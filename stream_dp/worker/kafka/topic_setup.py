"""Setting up the worker's topics at start: read the cluster, create what is missing as planned
(``kafka.topics``; a missing input topic as ``kafka.input_clock`` says), report what breaks an assumption (an
input topic whose producers would stamp the window clock, ``kafka.input_clock``), and work out the record
sizes that fit."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from stream_dp.config import Settings
from stream_dp.wire.chunks import CHUNK_HEADER_ROOM
from stream_dp.worker.kafka.admin import describe_cluster, describe_topics, ensure_topics, partials_retention_problem
from stream_dp.worker.kafka.input_clock import (
    INPUT_TOPIC_CONFIGS,
    TIMESTAMP_TYPE,
    input_topics,
    timestamp_type_problem,
)
from stream_dp.worker.kafka.topics import (
    OUTPUT_MAX_REQUEST_BYTES,
    RECORD_HEADROOM,
    Problem,
    TopicSettingsError,
    TopicState,
    fix_command,
    plan_topics,
    query_release_record_bytes,
    record_limit,
    replication,
    topic_problems,
)
from stream_dp.worker.partials.wire import MIN_CHUNK_PAYLOAD
from stream_dp.worker.query.runtime import QueryRuntime

log = logging.getLogger(__name__)

PRODUCER_MAX_REQUEST_BYTES = 4 * 1024 * 1024
#: The fewest bytes a dead-letter record must be allowed: its headers (a detail of up to 500 bytes, the
#: source topic's name, the event's size and digest) and the event's head (``wire.letters``).
MIN_DEAD_LETTER_RECORD = 8 * 1024


@dataclass(frozen=True)
class TopicLimits:
    """The partials topic's partition count and the record sizes that fit the worker's topics."""

    partials_partitions: int
    partials_record_bytes: int  # a partial chunk record's value
    dead_letter_record_bytes: int  # a dead letter's value and headers
    output_batch_bytes: int  # a batch of release records (uncompressed): fits every output topic
    #: Per output topic, the largest record it takes (a record larger than a batch goes alone in its own).
    output_record_bytes: dict[str, int] = field(default_factory=dict)


def record_limits(settings: Settings, outputs: list[str], states: dict[str, TopicState], broker_max: int | None,
                  partials_partitions: int) -> tuple[TopicLimits, list[Problem]]:
    """The record sizes that fit each topic, and a fatal problem for a topic that takes records too small."""

    def limit(topic: str, *, topic_decides: bool = False) -> int:
        value = states[topic].configs.get("max.message.bytes")
        # the output producer's requests grow to what its topics take (kafka_clients), up to its own bound
        producer_max = OUTPUT_MAX_REQUEST_BYTES if topic_decides else PRODUCER_MAX_REQUEST_BYTES
        return record_limit(broker_max, int(value) if value else None, producer_max, topic_decides=topic_decides)

    limits = TopicLimits(
        partials_partitions=partials_partitions,
        partials_record_bytes=limit(settings.partials_topic),
        dead_letter_record_bytes=limit(settings.dead_letter_topic),
        output_batch_bytes=min(limit(topic, topic_decides=True) for topic in outputs),
        output_record_bytes={topic: limit(topic, topic_decides=True) for topic in outputs},
    )
    problems = []
    for topic, role, got, least in (
        (settings.partials_topic, "partials", limits.partials_record_bytes, MIN_CHUNK_PAYLOAD + CHUNK_HEADER_ROOM),
        (settings.dead_letter_topic, "dead-letter", limits.dead_letter_record_bytes, MIN_DEAD_LETTER_RECORD),
    ):
        if got < least:
            wanted = least + RECORD_HEADROOM
            problems.append(Problem(
                f"the {role} topic {topic!r} takes records of at most {got + RECORD_HEADROOM} bytes (its "
                f"max.message.bytes or the broker's message.max.bytes, whichever is smaller), too few for its "
                f"records: raise both to at least {wanted}, the topic's with "
                f"{fix_command(settings.kafka_bootstrap_servers, topic, {'max.message.bytes': str(wanted)})}",
                fatal=True,
            ))
    return limits, problems


async def prepare_topics(settings: Settings, runtimes: list[QueryRuntime], options: dict[str, Any]) -> TopicLimits:
    """Create missing topics as planned (``kafka.topics``), report existing ones that break an assumption, refuse
    (``TopicSettingsError``, every fatal problem named) topics the worker cannot run on, such as a partials
    topic that outlives the ledger; returns the record sizes that fit each topic."""
    brokers, broker_max = await asyncio.to_thread(describe_cluster, options)
    factor, in_sync = replication(settings.topic_replication_factor, settings.topic_min_insync_replicas, brokers)
    outputs: dict[str, int] = {}
    for runtime in runtimes:
        topic = runtime.config.output_topic
        outputs[topic] = max(outputs.get(topic, 0), query_release_record_bytes(runtime.config))
    specs = plan_topics(
        partials=settings.partials_topic, alerts=settings.alerts_topic, dead_letter=settings.dead_letter_topic,
        outputs=outputs, partials_partitions=settings.partials_partitions,
        output_partitions=settings.output_partitions, replication_factor=factor, min_insync=in_sync,
        partials_configs=settings.partials_topic_configs(), internal_retention_ms=settings.internal_retention_ms,
        output_retention_ms=settings.output_retention_ms, broker_max=broker_max,
    )
    inputs = input_topics(runtime.config for runtime in runtimes)
    # A missing input topic is created as users are told to create theirs (with the broker's default
    # partition count): with LogAppendTime, so that no producer stamps the clock its windows close by.
    input_configs = {**INPUT_TOPIC_CONFIGS, "min.insync.replicas": str(in_sync)}
    partition_counts = await asyncio.to_thread(
        ensure_topics, options, {**{s.name: s.partitions for s in specs}, **dict.fromkeys(inputs, -1)},
        configs={**{s.name: s.configs for s in specs}, **dict.fromkeys(inputs, input_configs)},
        replication={**{s.name: s.replication_factor for s in specs}, **dict.fromkeys(inputs, factor)},
    )
    states = await asyncio.to_thread(describe_topics, options, [s.name for s in specs])
    problems = [p for spec in specs for p in topic_problems(spec, states[spec.name], bootstrap=settings.kafka_bootstrap_servers)]
    stamps = await asyncio.to_thread(describe_topics, options, sorted(inputs), (TIMESTAMP_TYPE,))
    for topic, queries in sorted(inputs.items()):
        problem = timestamp_type_problem(topic, stamps[topic].configs, queries, bootstrap=settings.kafka_bootstrap_servers)
        if problem is not None:
            problems.append(problem)
        log.info("input topic %s: %d partition(s), %s=%s", topic, partition_counts[topic], TIMESTAMP_TYPE,
                 stamps[topic].configs.get(TIMESTAMP_TYPE, "not reported"))
    retention = partials_retention_problem(
        settings.partials_topic, states[settings.partials_topic].configs, ledger_ttl_s=settings.ledger_ttl_s,
        wanted=settings.partials_topic_configs(), bootstrap=settings.kafka_bootstrap_servers,
    )
    if retention is not None:
        problems.append(Problem(retention, fatal=True))
    limits, size_problems = record_limits(settings, sorted(outputs), states, broker_max,
                                          partition_counts[settings.partials_topic])
    problems += size_problems
    for problem in problems:
        if not problem.fatal:
            log.warning("topic settings: %s", problem.text)
    fatal = [p.text for p in problems if p.fatal]
    if fatal:
        raise TopicSettingsError("; and ".join(fatal))
    log.info("record limits in force: partials %d bytes per chunk record, dead letters %d, output batches %d "
             "(broker message.max.bytes %s, %d broker(s), replication %d, min.insync.replicas %d)",
             limits.partials_record_bytes, limits.dead_letter_record_bytes, limits.output_batch_bytes,
             broker_max, brokers, factor, in_sync)
    return limits
