"""The queries of a file that read one input topic, taken together.

A topic's events are produced once, for every query reading it: one message key per record, one
partitioner choosing its partition, and either true values or randomized reports. Each query checks
its events against its own settings (``stream_dp.windows.placement``: the key must be the bytes of
the event's ``privacy_unit.field`` and the partition the one its ``partitioner`` gives that key;
``stream_dp.windows.classify``: a ``local_dp`` query takes only reports tagged with its randomizer),
so queries of one topic whose settings differ cannot all see its events: at least one dead-letters
them (``wrong_partition``, ``wrong_key``, ``not_randomized``, ``randomizer_mismatch``), or counts
randomized reports as true values. Whatever the namespaces: the checks are per event, not per budget.
Its records' timestamps are one clock too: the queries agree on ``trust_producer_timestamps``.
"""

from __future__ import annotations

from typing import Any


def _local_settings(query: Any) -> tuple | None:
    """What a report's tag and fields depend on (``stream_dp.dp.local.report_tag``): the randomized field,
    the mechanism, its epsilon (exactly) and the domain, ``groups.public`` in order."""
    local = query.local_dp
    if local is None:
        return None
    return local.field, local.mechanism, local.epsilon, tuple(query.public_group_keys() or ())


def _describe_local(query: Any) -> str:
    local = query.local_dp
    domain = len(query.public_group_keys() or ())
    return f"{{field: {local.field}, mechanism: {local.mechanism}, epsilon: {local.epsilon!r}}} over {domain} values"


def _problems(topic: str, first: Any, other: Any) -> list[str]:
    a, b = first.name, other.name
    both = f"queries {a!r} and {b!r} both read input_topic {topic!r}"
    problems = []
    if first.partitioner != other.partitioner:
        problems.append(
            f"{both} with partitioner {first.partitioner} and {other.partitioner}: each event must be on the partition "
            f"its query's partitioner gives its key, so one of them dead-letters most events as wrong_partition; "
            f"set the partitioner the topic's producers use (murmur2 for Kafka's Java client and kafka-python, "
            f"crc32 for librdkafka's default) on both"
        )
    if first.privacy_unit.field != other.privacy_unit.field:
        problems.append(
            f"{both} with privacy_unit.field {first.privacy_unit.field!r} and {other.privacy_unit.field!r}: each "
            f"event's message key must be its unit id, and a record has one key, so one of them dead-letters events "
            f"as wrong_key; use one privacy_unit.field for every query of the topic (the field its producers key "
            f"by), or produce the other unit's events to a topic of their own, keyed by it"
        )
    if first.trust_producer_timestamps != other.trust_producer_timestamps:
        trusting, other_query = (first, other) if first.trust_producer_timestamps else (other, first)
        problems.append(
            f"{both}, and only {trusting.name!r} has trust_producer_timestamps: true: a topic's records close "
            f"the windows of every query reading it by one clock, and the worker checks the topic's "
            f"message.timestamp.type once for all of them; set trust_producer_timestamps alike on both (true "
            f"only for a backfill whose producers stamp records with their events' times, see "
            f"docs/privacy/clock.md), or give {other_query.name!r} a topic of its own"
        )
    mine, theirs = _local_settings(first), _local_settings(other)
    if mine != theirs:
        if mine is None or theirs is None:
            local, central = (first, other) if mine is not None else (other, first)
            problems.append(
                f"{both}, and only {local.name!r} has local_dp (on {local.local_dp.field!r}): a topic carries either "
                f"randomized reports, which {central.name!r} would count as true values (or reject, lacking its "
                f"fields), or true values, which "
                f"{local.name!r} dead-letters as not_randomized and which break its promise that nobody holds a true "
                f"value; read {central.name!r} from a topic of its own, or give both the same local_dp"
            )
        else:
            problems.append(
                f"{both} with other local_dp settings ({_describe_local(first)} and {_describe_local(other)}): a "
                f"report carries one randomized field and its randomizer's tag, so each dead-letters the other's "
                f"reports (randomizer_mismatch, or a missing field); give both the same local_dp and groups.public, "
                f"or each a topic of its own"
            )
    return problems


def check_shared_topics(queries: list[Any]) -> None:
    """Raises ``ValueError``, one line per problem, naming both queries, the topic and what to align."""
    first_on: dict[str, Any] = {}
    problems = []
    for query in queries:
        first = first_on.setdefault(query.input_topic, query)
        if first is not query:
            problems.extend(_problems(query.input_topic, first, query))
    if problems:
        raise ValueError("\n".join(problems))
