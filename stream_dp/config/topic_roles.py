"""Each topic has one role: a query's input, a query's output, or one of the worker's internal topics. Pure
logic, no I/O.

The ACL plan grants by role (``stream_dp.worker.access.kafka_plan``): producers Write the input topics, analysts
Read the output topics, only the worker touches the internal ones. A topic with two roles would give one role's
principals the other's rights -- analysts reading the exact partials, producers writing partials (forged
releases) or releases -- and make the worker mix records of two kinds. So ``check-config``, ``stream-dp acls``
and the worker at start refuse it, through :func:`topic_role_problems`.

Two deployments on one cluster (different ``STREAM_DP_GROUP_ID``) that keep the default internal topic prefix
would share one partials topic, each combining the other's exact partials: :func:`deployment_problem`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

DEFAULT_GROUP_ID = "stream-dp"
DEFAULT_INTERNAL_TOPIC_PREFIX = "stream-dp."
PREFIX_ENV = "STREAM_DP_INTERNAL_TOPIC_PREFIX"
#: Every internal topic the worker uses, by role; its name is ``STREAM_DP_INTERNAL_TOPIC_PREFIX`` + role.
INTERNAL_TOPIC_ROLES = ("partials", "alerts", "dead-letter")


class _Query(Protocol):
    name: str
    input_topic: str
    output_topic: str


def internal_topics(prefix: str) -> dict[str, str]:
    """``{topic: role}`` of the worker's internal topics under ``prefix``."""
    return {f"{prefix}{role}": role for role in INTERNAL_TOPIC_ROLES}


@dataclass(frozen=True)
class Clash:
    """Query ``index``'s ``field`` (``input_topic`` or ``output_topic``) names a topic that has another role."""

    index: int
    query: str
    field: str
    message: str

    def __str__(self) -> str:
        return f"query {self.query!r}: {self.message}"


def topic_role_clashes(queries: Iterable[_Query], prefix: str | None) -> list[Clash]:
    """Every query topic with a second role: an internal topic under ``prefix`` (the query's producers would get
    Write, or its analysts Read, on it), or another query's output topic read as an input topic (a chain).
    ``prefix`` None: chains only (what the query file alone decides)."""
    queries = list(queries)
    internal = internal_topics(prefix) if prefix is not None else {}
    writers = {q.output_topic: q.name for q in queries}
    clashes = []
    for index, query in enumerate(queries):
        for field, topic in (("input_topic", query.input_topic), ("output_topic", query.output_topic)):
            role = internal.get(topic)
            if role is not None:
                who = "producers Write" if field == "input_topic" else "analysts Read"
                clashes.append(Clash(index, query.name, field, (
                    f"{field} {topic!r} is the worker's internal {role} topic ({PREFIX_ENV}={prefix!r} + {role!r}): "
                    f"the ACL plan would give the query's {who} on it; rename the {field}, or set {PREFIX_ENV} to "
                    "another prefix for every worker of the deployment and for `stream-dp acls`")))
        writer = writers.get(query.input_topic)
        if writer is not None and writer != query.name:
            clashes.append(Clash(index, query.name, "input_topic", (
                f"input_topic {query.input_topic!r} is where query {writer!r} writes its releases: producers of an "
                "input topic may write it (they could forge releases there) and analysts of an output topic may "
                "read it (they would read raw events with unit ids); read the raw events' topic instead, and "
                "process releases outside stream-dp")))
    return clashes


def topic_role_problems(queries: Iterable[_Query], prefix: str) -> list[str]:
    return [str(clash) for clash in topic_role_clashes(queries, prefix)]


def chain_problems(queries: Iterable[_Query]) -> list[str]:
    """A query reading another query's output topic (the query file alone decides: config validation)."""
    return [str(clash) for clash in topic_role_clashes(queries, None)]


def deployment_problem(group_id: str, prefix: str) -> str | None:
    """A deployment with its own group id but the default internal topic prefix would share the partials,
    alerts and dead-letter topics of every other such deployment on the cluster (and of the default one)."""
    if prefix == DEFAULT_INTERNAL_TOPIC_PREFIX and group_id != DEFAULT_GROUP_ID:
        return (
            f"STREAM_DP_GROUP_ID is {group_id!r} but {PREFIX_ENV} is the default {DEFAULT_INTERNAL_TOPIC_PREFIX!r}: "
            "every deployment on the cluster that keeps that prefix shares one partials topic, and each would "
            f"combine the others' exact partials; set {PREFIX_ENV}={group_id + '.'!r} (one prefix per deployment) "
            "for every worker of this deployment and for `stream-dp acls`; see docs/operations/security.md"
        )
    return None


def environment_prefix(environ: Mapping[str, str]) -> str:
    """The internal topic prefix a worker run with ``environ`` uses."""
    return environ.get(PREFIX_ENV, DEFAULT_INTERNAL_TOPIC_PREFIX)
