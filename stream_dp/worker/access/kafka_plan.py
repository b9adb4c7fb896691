"""The Kafka ACLs of each role, from the query file and the worker's settings. Pure logic, no I/O.

Three roles, each granted only what it uses:

* the **worker** reads its input topics and writes the partials (which it reads back), alerts, dead-letter
  and output topics; it creates any of them that is missing (``kafka.topic_setup``), reads their configs
  and the brokers' ``message.max.bytes`` (``kafka.admin``), and joins two consumer groups: ``group_id``
  (input topics) and ``release_group_id(group_id)`` (partials topic). Its producers are idempotent, which
  a broker allows with Write on a topic since KIP-679 (no IdempotentWrite); it uses no transactional id.
* **producers** write their input topics, nothing else.
* **analysts** read the output topics, in consumer groups whose names start with their prefix.

Every other principal gets nothing: the partials (exact per-partition aggregates), alerts (unit ids),
dead letters (original events) and input topics are as sensitive as the raw data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from stream_dp.config import PipelineConfig, Settings
from stream_dp.worker.kafka.clients import release_group_id

WORKER, PRODUCER, ANALYST = "worker", "producer", "analyst"
TOPIC, GROUP, CLUSTER = "Topic", "Group", "Cluster"
LITERAL, PREFIXED = "literal", "prefixed"
CLUSTER_NAME = "kafka-cluster"  # the one cluster resource's name in Kafka
DEFAULT_ANALYST_GROUP_PREFIX = "analyst-"


class AclPlanError(ValueError):
    """The principals or names given cannot make a sound plan; the message says what to change."""


@dataclass(frozen=True, order=True)
class KafkaAcl:
    """One ALLOW binding: ``principal`` may do ``operation`` on the resource, from any host."""

    role: str
    principal: str
    resource_type: str  # Topic, Group or Cluster
    resource_name: str
    pattern_type: str  # literal or prefixed
    operation: str  # Kafka's name: Read, Write, Create, Describe, DescribeConfigs
    why: str

    @property
    def resource(self) -> tuple[str, str, str]:
        return self.resource_type, self.resource_name, self.pattern_type


@dataclass(frozen=True)
class Principals:
    """``producers`` maps each input topic to the principal writing it (one principal for all by default)."""

    worker: str
    analyst: str
    producers: Mapping[str, str]


def check_principal(principal: str) -> str:
    kind, _, name = principal.partition(":")
    if not kind or not name or kind != kind.strip() or name != name.strip():
        raise AclPlanError(f"principal {principal!r} is not of the form User:NAME (Kafka's principal type and name)")
    return principal


def producer_principals(inputs: list[str], given: list[str], default: str) -> dict[str, str]:
    """Each input topic's producer: ``TOPIC=User:NAME`` entries of ``given``, a bare ``User:NAME`` for every
    other topic, else ``default``."""
    every = default
    named: dict[str, str] = {}
    for entry in given:
        topic, sep, principal = entry.partition("=")
        if not sep:
            every = check_principal(entry)
        elif topic not in inputs:
            raise AclPlanError(f"--producer-principal {entry!r} names topic {topic!r}, which no query reads; "
                               f"the input topics are {', '.join(inputs)}")
        else:
            named[topic] = check_principal(principal)
    return {topic: named.get(topic, every) for topic in inputs}


def worker_topics(config: PipelineConfig, settings: Settings) -> dict[str, list[str]]:
    """Every topic the worker uses, and its roles in the plan (input, partials, alerts, dead-letter, output):
    one query's output topic may be another's input."""
    roles: dict[str, list[str]] = {}
    named = [*((q.input_topic, "input") for q in config.queries),
             (settings.partials_topic, "partials"), (settings.alerts_topic, "alerts"),
             (settings.dead_letter_topic, "dead-letter"), *((q.output_topic, "output") for q in config.queries)]
    for topic, role in named:
        if role not in roles.setdefault(topic, []):
            roles[topic].append(role)
    return roles


_WORKER_TOPIC_OPERATIONS: dict[str, tuple[tuple[str, str], ...]] = {
    "input": (("Read", "consumes the events"), ("Describe", "partitions, offsets and committed positions"),
              ("DescribeConfigs", "refuses a topic whose producers stamp the window clock (message.timestamp.type)"),
              ("Create", "creates the topic with LogAppendTime if it is missing")),
    "partials": (("Write", "sends each input partition's exact partials and progress"),
                 ("Read", "the release stage combines the partials"),
                 ("Describe", "partitions and offsets"),
                 ("DescribeConfigs", "checks retention, cleanup policy and record size"),
                 ("Create", "creates the topic as planned if it is missing")),
    "alerts": (("Write", "sends budget alerts"), ("Describe", "partitions"),
               ("DescribeConfigs", "checks retention and cleanup policy"),
               ("Create", "creates the topic as planned if it is missing")),
    "dead-letter": (("Write", "sends rejected events"), ("Describe", "partitions"),
                    ("DescribeConfigs", "checks retention, cleanup policy and record size"),
                    ("Create", "creates the topic as planned if it is missing")),
    "output": (("Write", "publishes the releases"), ("Describe", "partitions"),
               ("DescribeConfigs", "checks retention, cleanup policy and record size"),
               ("Create", "creates the topic as planned if it is missing")),
}


def worker_groups(settings: Settings) -> dict[str, str]:
    """The worker's consumer groups and what each reads."""
    return {settings.group_id: "input topics (ingest stage)",
            release_group_id(settings.group_id): "partials topic (release stage)"}


def kafka_acls(config: PipelineConfig, settings: Settings, principals: Principals, *,
               analyst_group_prefix: str = DEFAULT_ANALYST_GROUP_PREFIX) -> list[KafkaAcl]:
    """Every ALLOW binding the three roles need, sorted by role, principal and resource."""
    worker, analyst = check_principal(principals.worker), check_principal(principals.analyst)
    if not analyst_group_prefix:
        raise AclPlanError("the analysts' consumer-group prefix is empty: it would let them join every group")
    groups = worker_groups(settings)
    for group in groups:
        if group.startswith(analyst_group_prefix):
            raise AclPlanError(
                f"the analysts' consumer-group prefix {analyst_group_prefix!r} covers the worker's group {group!r}: "
                "an analyst could join it and take partitions from the worker; choose another prefix "
                "(--analyst-group-prefix) or STREAM_DP_GROUP_ID"
            )
    if worker in {analyst, *principals.producers.values()}:
        raise AclPlanError(f"{worker} is both the worker and a producer or analyst: give each role its own principal")
    acls = worker_acls(config, settings, worker)
    topics = worker_topics(config, settings)
    for topic, roles in topics.items():
        if "input" in roles:
            producer = check_principal(principals.producers[topic])
            acls += [KafkaAcl(PRODUCER, producer, TOPIC, topic, LITERAL, "Write", "produces the events"),
                     KafkaAcl(PRODUCER, producer, TOPIC, topic, LITERAL, "Describe", "partitions")]
        if "output" in roles:
            acls += [KafkaAcl(ANALYST, analyst, TOPIC, topic, LITERAL, "Read", "reads the releases"),
                     KafkaAcl(ANALYST, analyst, TOPIC, topic, LITERAL, "Describe", "partitions and offsets")]
    acls += [KafkaAcl(ANALYST, analyst, GROUP, analyst_group_prefix, PREFIXED, "Read", "its own consumer groups"),
             KafkaAcl(ANALYST, analyst, GROUP, analyst_group_prefix, PREFIXED, "Describe", "its own groups' offsets")]
    order = {WORKER: 0, PRODUCER: 1, ANALYST: 2}
    return sorted(set(acls), key=lambda a: (order[a.role], a.principal, a.resource_type, a.resource_name, a.operation))


def worker_acls(config: PipelineConfig, settings: Settings, worker: str) -> list[KafkaAcl]:
    """The worker's bindings alone (also what it checks at start, ``access.check``)."""
    acls: list[KafkaAcl] = []
    topics = worker_topics(config, settings)
    groups = worker_groups(settings)
    for topic, roles in topics.items():
        operations: dict[str, str] = {}
        for role in roles:
            for operation, why in _WORKER_TOPIC_OPERATIONS[role]:
                operations.setdefault(operation, f"{role} topic: {why}")
        acls += [KafkaAcl(WORKER, worker, TOPIC, topic, LITERAL, op, why) for op, why in operations.items()]
    for group, what in groups.items():
        acls += [KafkaAcl(WORKER, worker, GROUP, group, LITERAL, "Read", f"joins the group and commits: {what}"),
                 KafkaAcl(WORKER, worker, GROUP, group, LITERAL, "Describe", f"reads the group's offsets: {what}")]
    acls.append(KafkaAcl(WORKER, worker, CLUSTER, CLUSTER_NAME, LITERAL, "DescribeConfigs",
                         "reads the brokers' message.max.bytes (the record sizes that fit)"))
    return acls
