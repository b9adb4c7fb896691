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
from stream_dp.config.topic_roles import topic_role_problems
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


def check_principal(principal: str, *, custom_types: bool = False) -> str:
    """``User:NAME`` with a NAME that names one principal: Kafka reads ``User:*`` as every user, a principal
    type other than ``User`` matches nobody unless the cluster has a custom principal builder (``custom_types``),
    and whitespace or a comma in the name is a typo or a list, never one SASL user."""
    kind, _, name = principal.partition(":")
    if not kind or not name:
        raise AclPlanError(f"principal {principal!r} is not of the form User:NAME (Kafka's principal type and name)")
    if "*" in principal:
        raise AclPlanError(f"principal {principal!r} is a wildcard: Kafka would grant every principal; name one "
                           "user, User:NAME")
    if any(c.isspace() for c in principal) or "," in principal:
        raise AclPlanError(f"principal {principal!r} holds whitespace or a comma: give one principal, User:NAME "
                           "(repeat the option for a topic's own producer: TOPIC=User:NAME)")
    if kind != "User" and not custom_types:
        raise AclPlanError(f"principal {principal!r} has type {kind!r}: SASL and TLS clients are User principals "
                           "(the type is case-sensitive), so it would match nobody; write User:NAME, or pass "
                           "--custom-principal-types if the brokers run a principal builder that makes such types")
    return principal


def producer_principals(inputs: list[str], given: list[str], default: str, *,
                        custom_types: bool = False) -> dict[str, str]:
    """Each input topic's producer: ``TOPIC=User:NAME`` entries of ``given``, a bare ``User:NAME`` for every
    other topic, else ``default``. A topic named twice, or two bare principals, is refused: only one would win."""
    every: str | None = None
    named: dict[str, str] = {}
    for entry in given:
        topic, sep, principal = entry.partition("=")
        if not sep:
            if every is not None:
                raise AclPlanError(f"--producer-principal names two principals for every input topic ({every} and "
                                   f"{entry}); give one, and TOPIC=User:NAME for a topic's own")
            every = check_principal(entry, custom_types=custom_types)
        elif topic not in inputs:
            raise AclPlanError(f"--producer-principal {entry!r} names topic {topic!r}, which no query reads; "
                               f"the input topics are {', '.join(inputs)}")
        elif topic in named:
            raise AclPlanError(f"--producer-principal names topic {topic!r} twice ({named[topic]} and {principal}); "
                               "one principal writes each input topic: keep one")
        else:
            named[topic] = check_principal(principal, custom_types=custom_types)
    return {topic: named.get(topic, every or default) for topic in inputs}


def worker_topics(config: PipelineConfig, settings: Settings) -> dict[str, list[str]]:
    """Every topic the worker uses, and its roles in the plan (input, partials, alerts, dead-letter, output);
    a topic with two roles is refused before (``config.topic_roles``)."""
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
               analyst_group_prefix: str = DEFAULT_ANALYST_GROUP_PREFIX, custom_types: bool = False) -> list[KafkaAcl]:
    """Every ALLOW binding the three roles need, sorted by role, principal and resource. Refuses a topic with two
    roles (``config.topic_roles``): the plan grants by role."""
    worker = check_principal(principals.worker, custom_types=custom_types)
    analyst = check_principal(principals.analyst, custom_types=custom_types)
    problems = topic_role_problems(config.queries, settings.internal_topic_prefix)
    if problems:
        raise AclPlanError("; and ".join(problems))
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
            producer = check_principal(principals.producers[topic], custom_types=custom_types)
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
