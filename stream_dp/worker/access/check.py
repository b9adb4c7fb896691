"""At start, the worker asks the broker what it may do and compares it with its plan (``kafka_plan``).

A right it lacks on a topic or group stops it before it reads or writes any record, with the ACL missing
and the command that grants it. What it may do beyond its plan is the operator's business: it is logged.
A topic that does not exist yet is checked once the worker created it; a group that does not exist yet is
checked for ``Describe`` only (the broker refuses a ``Read`` it lacks when the worker joins). The cluster's
``DescribeConfigs`` is not checked here: ``kafka.admin.describe_cluster`` warns when the brokers' record size
cannot be read, and the worker then goes by the topics' limits.
"""

from __future__ import annotations

import asyncio
import logging
import shlex
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from stream_dp.config import PipelineConfig, Settings
from stream_dp.worker.access.kafka_plan import (
    CLUSTER,
    GROUP,
    TOPIC,
    WORKER,
    worker_acls,
    worker_groups,
    worker_topics,
)
from stream_dp.worker.query.costs import WorkerConfigError
from stream_dp.worker.kafka.acl_admin import DENIED, MISSING, UNKNOWN, Rights, read_rights

log = logging.getLogger(__name__)


class AccessError(WorkerConfigError):
    """The worker's Kafka principal lacks an ACL it needs; the message names each and how to grant it."""


@dataclass(frozen=True)
class Needed:
    """The operations the worker needs on one resource (from the plan), for the check."""

    resource_type: str
    name: str
    operations: frozenset[str]
    role: str  # what the resource is to the worker: "input topic", "partials topic", "consumer group ..."


def worker_needs(config: PipelineConfig, settings: Settings) -> list[Needed]:
    """What the worker needs, as :func:`kafka_plan.kafka_acls` grants it to its principal."""
    acls = worker_acls(config, settings, "User:worker")  # any name: the bindings do not depend on it
    roles = {**{t: f"{' and '.join(r)} topic" for t, r in worker_topics(config, settings).items()},
             **{g: f"consumer group of the {what}" for g, what in worker_groups(settings).items()}}
    by_resource: dict[tuple[str, str], set[str]] = defaultdict(set)
    for acl in acls:
        if acl.role == WORKER:
            by_resource[(acl.resource_type, acl.resource_name)].add(acl.operation)
    return [Needed(kind, name, frozenset(ops), roles.get(name, "cluster")) for (kind, name), ops in by_resource.items()]


def principal_of(settings: Settings) -> str:
    return f"User:{settings.kafka_sasl_username}" if settings.kafka_sasl_username else "the worker's Kafka principal"


def judge(needs: list[Needed], topics: dict[str, Rights], groups: dict[str, Rights], *,
          principal: str) -> tuple[list[str], list[str], list[str], list[str]]:
    """(missing: fatal, each naming the ACL; warnings; found: what the broker granted; topics not there yet)."""
    missing: list[str] = []
    warnings: list[str] = []
    found: list[str] = []
    absent: list[str] = []
    for need in sorted(needs, key=lambda n: (n.resource_type, n.name)):
        if need.resource_type == CLUSTER:
            continue
        rights = (topics if need.resource_type == TOPIC else groups).get(
            need.name, Rights(UNKNOWN, detail="not in the broker's answer"))
        where = f"{need.resource_type} {need.name!r} ({need.role})"
        if rights.state == MISSING:
            if need.resource_type == TOPIC:
                absent.append(need.name)
            found.append(f"{where}: not there yet" + ("" if need.resource_type == TOPIC else ", may Describe"))
            continue
        if rights.state == UNKNOWN:
            warnings.append(f"cannot check {principal}'s rights on {where}: {rights.detail}")
            continue
        granted = rights.operations if rights.state != DENIED else frozenset()
        everything = "All" in granted
        lacking = [] if everything else sorted(need.operations - granted)
        if lacking:
            missing.append(f"{principal} may not {', '.join(lacking)} {where}")
        extra = ["All"] if everything else sorted(granted - need.operations)
        found.append(f"{where}: {', '.join(sorted(granted)) or 'nothing'}"
                     + (f" (beyond what it needs: {', '.join(extra)})" if extra else ""))
    return missing, warnings, found, absent


def fix_hint(principal: str, config_source: str, bootstrap: str) -> str:
    who = principal if principal.startswith("User:") else "User:NAME"
    command = shlex.join(["stream-dp", "acls", "--config", config_source, "--worker-principal", who, "--apply"])
    return (f"grant them with `{command}` run with an admin's KAFKA_* settings (or print the kafka-acls.sh "
            f"commands for {bootstrap} without --apply); see docs/operations/security.md")


async def check_kafka_access(options: dict[str, Any], needs: list[Needed], *, settings: Settings, config_source: str,
                             only_topics: list[str] | None = None) -> list[str]:
    """Ask the broker, log what the worker may do, raise ``AccessError`` naming every ACL missing. Returns the
    topics that do not exist yet (to check again once they are created: ``only_topics``)."""
    if only_topics is not None:
        needs = [n for n in needs if n.resource_type == TOPIC and n.name in only_topics]
    topics = sorted(n.name for n in needs if n.resource_type == TOPIC)
    groups = sorted(n.name for n in needs if n.resource_type == GROUP)
    topic_rights, group_rights = await asyncio.to_thread(read_rights, options, topics, groups)
    principal = principal_of(settings)
    missing, warnings, found, absent = judge(needs, topic_rights, group_rights, principal=principal)
    log.info("Kafka rights of %s: %s", principal, "; ".join(found))
    for warning in warnings:
        log.warning("Kafka rights: %s", warning)
    if missing:
        raise AccessError("the worker lacks Kafka ACLs it needs: " + "; ".join(missing) + "; "
                          + fix_hint(principal, config_source, settings.kafka_bootstrap_servers))
    return absent
