"""The worker's own topics, planned on purpose, and the record sizes that fit them. Pure logic, no I/O.

The worker creates its internal topics (partials, alerts, dead letters) and
the queries' output topics with explicit settings instead of the broker's
defaults: replication factor and ``min.insync.replicas`` from the settings
(by default three replicas, or as many as there are brokers, and one fewer
in sync), ``cleanup.policy=delete`` with a ``retention.ms`` for each role
(partials: kept no longer than the release ledger remembers their windows,
see ``kafka.admin.partials_retention_problem``; alerts and dead letters:
``STREAM_DP_INTERNAL_RETENTION_MS``; outputs: ``STREAM_DP_OUTPUT_RETENTION_MS``),
and on an output topic a ``max.message.bytes`` large enough for the largest
release record when the broker's default is not (``release_record_bytes``: a
group's record, or a top_k record listing k groups). A query whose largest
record the worker could not write at all is refused when it is built, so by
``check-config`` too (``check_release_records``).

Existing topics are left as they are, but each setting that breaks an
assumption is reported with the command that fixes it (``topic_problems``);
the worker refuses to start where nothing could work (``Problem.fatal``):
a partials topic that compacts (every chunk of a window's partials shares
one key) or takes records too small for a chunk (``kafka.topic_setup``), or a
topic whose ``min.insync.replicas`` is above its replicas (every write fails).

``record_limit`` is the largest record value the worker writes to a topic:
the smallest of the broker's ``message.max.bytes``, the topic's
``max.message.bytes`` and the producer's request size, less room for the
record's key, headers and Kafka's own framing. Partials are chunked to it,
and a dead letter is a bounded copy of its event (``stream_dp.wire.letters``),
so no record is ever refused for its size.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

RECORD_HEADROOM = 16 * 1024  # a record batch's framing, the record's key and headers, with room to spare
OUTPUT_RECORD_ROOM = 64 * 1024  # a release record beside its group values: window, privacy block, numbers
#: A top_k record's entry beside its group's values: ``{"rank":1000,"group":{}}``, a comma, room to spare.
TOP_K_ENTRY_ROOM = 64
#: The output producer's largest request, so the largest release record the worker writes (it sets an output
#: topic's max.message.bytes up to it): under the broker's socket.request.max.bytes, 100 MiB by default,
#: which bounds every request whatever the topic takes.
OUTPUT_MAX_REQUEST_BYTES = 64 * 1024 * 1024
DEFAULT_REPLICAS = 3
KAFKA_DEFAULT_MAX_BYTES = 1_048_588  # message.max.bytes and max.message.bytes when nobody set them


class TopicSettingsError(ValueError):
    """The replication settings do not fit the cluster; the message says how to fix them."""


@dataclass(frozen=True)
class TopicSpec:
    """A topic as the worker creates it."""

    name: str
    role: str  # partials, alerts, dead-letter or output
    partitions: int
    replication_factor: int
    configs: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TopicState:
    """An existing topic as the broker describes it: replicas per partition and the configs in force."""

    replication_factor: int
    configs: dict[str, str]


def replication(replication_factor: int | None, min_insync: int | None, brokers: int) -> tuple[int, int]:
    """(replication factor, min.insync.replicas) for new topics: the settings', else min(3, brokers) replicas
    and one fewer in sync (at least one)."""
    if brokers < 1:
        raise TopicSettingsError("the cluster reported no brokers; check KAFKA_BOOTSTRAP_SERVERS")
    factor = replication_factor if replication_factor is not None else min(DEFAULT_REPLICAS, brokers)
    if factor > brokers:
        raise TopicSettingsError(
            f"STREAM_DP_TOPIC_REPLICATION_FACTOR={factor} but the cluster has {brokers} broker(s): set it to at "
            f"most {brokers}, or unset it for min(3, brokers)"
        )
    in_sync = min_insync if min_insync is not None else max(1, factor - 1)
    if in_sync > factor:
        raise TopicSettingsError(
            f"STREAM_DP_TOPIC_MIN_INSYNC_REPLICAS={in_sync} is more than the replication factor {factor}: every "
            f"write with acks=all would fail; set it to at most {factor}"
        )
    return factor, in_sync


def release_record_bytes(group_bytes: int, top_k: int | None = None) -> int:
    """The largest release record (key and value) of a query whose group values take up to ``group_bytes``.

    A group's record holds its values twice (key and body); a top_k record lists ``top_k`` groups' values
    once each.
    """
    listed = 0 if top_k is None else top_k * (group_bytes + TOP_K_ENTRY_ROOM)
    return max(2 * group_bytes, listed) + OUTPUT_RECORD_ROOM


def query_group_bytes(query: Any) -> int:
    """The most bytes a group's values of ``query`` (a ``QueryConfig``) take in JSON: as long as an event
    (``max_message_bytes``), or a listed public group's, which is released even when no event could name it."""
    names = list(query.group_by) or ["value"]
    listed = (len(orjson.dumps(dict(zip(names, key)))) for key in query.public_group_keys() or ())
    return max(query.max_message_bytes, max(listed, default=0))


def query_release_record_bytes(query: Any) -> int:
    """:func:`release_record_bytes` of ``query`` (a ``QueryConfig``)."""
    top_k = query.aggregations.top_k
    return release_record_bytes(query_group_bytes(query), None if top_k is None else top_k.k)


def check_release_records(query: Any) -> None:
    """Refuse ``query`` (a ``QueryConfig``) when its largest release record could not be written to any output
    topic: every window would leave it out, on every replay. Raises ``ValueError`` saying what to lower."""
    needed = query_release_record_bytes(query) + RECORD_HEADROOM
    if needed <= OUTPUT_MAX_REQUEST_BYTES:
        return
    group_bytes, top_k = query_group_bytes(query), query.aggregations.top_k
    room = OUTPUT_MAX_REQUEST_BYTES - RECORD_HEADROOM - OUTPUT_RECORD_ROOM
    if top_k is None:  # a group's record alone: only public groups' values can be this long
        raise ValueError(
            f"a release record holds a group's values twice, up to {group_bytes} bytes each here, {needed} bytes in "
            f"all with its numbers, more than the {OUTPUT_MAX_REQUEST_BYTES} bytes a release record may take; "
            f"shorten the public groups' values to at most {room // 2} bytes"
        )
    longer = group_bytes > query.max_message_bytes  # a listed public group's values outgrow any event
    raise ValueError(
        f"its top_k record lists k={top_k.k} groups whose values may each be as long as an event "
        f"(max_message_bytes={query.max_message_bytes})"
        + (f" or a listed public group's ({group_bytes} bytes)" if longer else "")
        + f": up to {needed} bytes, more than the {OUTPUT_MAX_REQUEST_BYTES} bytes a release record may take, so "
        f"every window's list would be left out; lower top_k.k to at most "
        f"{room // (group_bytes + TOP_K_ENTRY_ROOM)} or "
        + ("shorten the public groups' values" if longer else
           f"max_message_bytes to at most {max(room // top_k.k - TOP_K_ENTRY_ROOM, 0)}")
    )


def output_message_bytes(record_bytes: int, broker_max: int | None) -> str | None:
    """``max.message.bytes`` an output topic needs for release records of up to ``record_bytes``
    (:func:`release_record_bytes`) when the broker's default could refuse one."""
    needed = record_bytes + RECORD_HEADROOM
    return str(needed) if needed > (broker_max or KAFKA_DEFAULT_MAX_BYTES) else None


def plan_topics(
    *,
    partials: str,
    alerts: str,
    dead_letter: str,
    outputs: Mapping[str, int],
    partials_partitions: int,
    output_partitions: int,
    replication_factor: int,
    min_insync: int,
    partials_configs: Mapping[str, str],
    internal_retention_ms: int,
    output_retention_ms: int,
    broker_max: int | None,
) -> list[TopicSpec]:
    """Every topic the worker needs; ``outputs`` maps each output topic to its queries' largest release record
    (:func:`release_record_bytes`)."""
    common = {"min.insync.replicas": str(min_insync), "cleanup.policy": "delete"}
    internal = {**common, "retention.ms": str(internal_retention_ms)}
    specs = [
        TopicSpec(partials, "partials", partials_partitions, replication_factor, {**common, **partials_configs}),
        TopicSpec(alerts, "alerts", 1, replication_factor, internal),
        TopicSpec(dead_letter, "dead-letter", 1, replication_factor, internal),
    ]
    for name, record_bytes in sorted(outputs.items()):
        configs = {**common, "retention.ms": str(output_retention_ms)}
        needed = output_message_bytes(record_bytes, broker_max)
        if needed is not None:
            configs["max.message.bytes"] = needed
        specs.append(TopicSpec(name, "output", output_partitions, replication_factor, configs))
    return specs


def fix_command(bootstrap: str, topic: str, configs: Mapping[str, str]) -> str:
    return (
        f"`kafka-configs.sh --bootstrap-server {bootstrap} --alter --entity-type topics --entity-name {topic} "
        f"--add-config {','.join(f'{k}={v}' for k, v in configs.items())}` (add --command-config for a secured cluster)"
    )


@dataclass(frozen=True)
class Problem:
    """A setting of an existing topic that breaks an assumption; ``fatal``: the worker cannot run on it."""

    text: str
    fatal: bool = False


_LOST_WHEN_COMPACTED = {
    "partials": "every chunk of a window's partials, from every input partition, shares the window's key, so "
                "compaction would delete all but one and windows would be released without their data",
    "output": "compaction keeps only the latest record per group key, so consumers lose every earlier window of a group",
    "alerts": "compaction keeps only the latest alert per namespace",
    "dead-letter": "compaction keeps only the last record per source, losing the pieces of dead letters that "
                   "earlier versions split in several",
}


def topic_problems(spec: TopicSpec, state: TopicState, *, bootstrap: str) -> list[Problem]:
    """Settings of an existing topic that break what the worker assumes, each with its fix (the partials
    topic's record size is checked with the broker's limit, in ``kafka.topic_setup``)."""
    problems = []
    in_force = state.configs
    name = f"{spec.role} topic {spec.name!r}"
    if state.replication_factor < spec.replication_factor:
        problems.append(Problem(
            f"{name} has {state.replication_factor} replica(s) per partition, fewer than the "
            f"{spec.replication_factor} wanted (STREAM_DP_TOPIC_REPLICATION_FACTOR): one broker lost can lose its "
            "records; add replicas with kafka-reassign-partitions.sh (kafka-configs.sh cannot change it)"
        ))
    in_sync = _int(in_force.get("min.insync.replicas"))
    wanted = _int(spec.configs.get("min.insync.replicas"))
    if in_sync is not None and in_sync > state.replication_factor:
        problems.append(Problem(
            f"{name} has min.insync.replicas={in_sync} but {state.replication_factor} replica(s): every write "
            f"with acks=all fails; fix it with "
            f"{fix_command(bootstrap, spec.name, {'min.insync.replicas': str(state.replication_factor)})}",
            fatal=True,
        ))
    elif in_sync is not None and wanted is not None and in_sync < min(wanted, state.replication_factor):
        problems.append(Problem(
            f"{name} has min.insync.replicas={in_sync}, fewer than the {wanted} wanted "
            "(STREAM_DP_TOPIC_MIN_INSYNC_REPLICAS): an acknowledged record may live on fewer brokers; fix it with "
            f"{fix_command(bootstrap, spec.name, {'min.insync.replicas': str(wanted)})}"
        ))
    policy = in_force.get("cleanup.policy", "delete")
    if "compact" in {p.strip() for p in policy.split(",")}:
        problems.append(Problem(
            f"{name} has cleanup.policy={policy}: {_LOST_WHEN_COMPACTED[spec.role]}; fix it with "
            f"{fix_command(bootstrap, spec.name, {'cleanup.policy': 'delete'})}",
            fatal=spec.role == "partials",
        ))
    retention, wanted_retention = _int(in_force.get("retention.ms")), _int(spec.configs.get("retention.ms"))
    if spec.role in ("alerts", "dead-letter") and retention is not None and wanted_retention is not None and (
            retention < 0 or retention > wanted_retention):
        problems.append(Problem(
            f"{name} keeps records for retention.ms={retention}, longer than STREAM_DP_INTERNAL_RETENTION_MS="
            f"{wanted_retention}: it holds unit ids (and events) as sensitive as the input; fix it with "
            f"{fix_command(bootstrap, spec.name, {'retention.ms': str(wanted_retention)})}"
        ))
    limit = _int(in_force.get("max.message.bytes"))
    needed = _int(spec.configs.get("max.message.bytes"))
    if spec.role == "output" and needed is not None and limit is not None and limit < needed:
        problems.append(Problem(
            f"{name} takes records of at most max.message.bytes={limit} bytes, but its queries' largest release "
            f"record (a group's, or a top_k list) takes up to {needed}: such a record would be left out "
            f"(stream_dp_internal_errors_total{{kind=\"release_record_too_large\"}}); fix it with "
            f"{fix_command(bootstrap, spec.name, {'max.message.bytes': str(needed)})}"
        ))
    return problems


def record_limit(broker_max: int | None, topic_max: int | None, producer_max: int, *, topic_decides: bool = False) -> int:
    """The largest record value the worker writes to a topic (see the module docstring).

    ``topic_decides``: for a topic whose ``max.message.bytes`` the worker set
    above the broker's default on purpose (an output topic), the topic's value
    is the one the broker enforces; elsewhere the smaller of the two is taken.
    A limit not known (None) is left out; with neither known, Kafka's default.
    """
    known = [v for v in ((topic_max,) if topic_decides and topic_max is not None else (broker_max, topic_max))
             if v is not None]
    return min(min(known, default=KAFKA_DEFAULT_MAX_BYTES), producer_max) - RECORD_HEADROOM


def _int(value: str | None) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None
