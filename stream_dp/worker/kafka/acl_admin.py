"""What the broker says a principal may do, and ACLs created, through kafka-python's admin client (blocking;
run in a thread). The plan itself is ``stream_dp.worker.access``.

Kafka answers a metadata request with the operations the asking principal may perform on each topic it may
describe (KIP-430), and a group description with those on the group: the worker learns its own rights
without any right to read ACLs. A broker without an authorizer reports every operation.
"""

from __future__ import annotations

import re
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from stream_dp.worker.kafka.admin import _admin

DENIED, MISSING, UNKNOWN = "denied", "missing", "unknown"
_TOPIC_AUTHORIZATION_FAILED, _UNKNOWN_TOPIC = 29, 3


@dataclass(frozen=True)
class Rights:
    """A resource's state for the asking principal: ``ok`` with the ``operations`` it may perform (Kafka's names,
    ``Read``, ``DescribeConfigs``...), ``denied`` (not even Describe), ``missing`` (no such topic or group yet)
    or ``unknown`` (the broker did not say: ``detail``)."""

    state: str
    operations: frozenset[str] = field(default_factory=frozenset)
    detail: str = ""


def kafka_operation_name(name: str) -> str:
    """``DESCRIBE_CONFIGS`` -> ``DescribeConfigs`` (kafka-python's enum names to Kafka's)."""
    return "".join(part.capitalize() for part in name.split("_"))


def _rights(operations: Iterable[str] | None) -> Rights:
    if operations is None:
        return Rights(UNKNOWN, detail="the broker did not report its authorized operations")
    return Rights("ok", frozenset(kafka_operation_name(op) for op in operations))


def read_rights(options: dict[str, Any], topics: list[str], groups: list[str], *,
                coordinator_wait_s: float = 15.0) -> tuple[dict[str, Rights], dict[str, Rights]]:
    """(each topic's, each group's) rights of the principal ``options`` connect as. (The cluster's are not asked:
    the broker reports them only to a principal that may Describe the cluster, which lets it list every ACL.)
    ``coordinator_wait_s``: how long a new broker may take to create its offsets topic before it can say."""
    from kafka.errors import CoordinatorNotAvailableError, GroupAuthorizationFailedError, GroupIdNotFoundError, KafkaError

    admin = _admin(options)
    try:
        topic_rights: dict[str, Rights] = {}
        for entry in admin.describe_topics(topics):
            code = entry.get("error_code", 0)
            if code == _TOPIC_AUTHORIZATION_FAILED:
                topic_rights[entry["name"]] = Rights(DENIED)
            elif code == _UNKNOWN_TOPIC:
                topic_rights[entry["name"]] = Rights(MISSING)
            elif code:
                topic_rights[entry["name"]] = Rights(UNKNOWN, detail=f"metadata error {code}")
            else:
                topic_rights[entry["name"]] = _rights(entry.get("authorized_operations"))
        group_rights: dict[str, Rights] = {}
        deadline = time.monotonic() + coordinator_wait_s
        for group in groups:  # one at a time: a group the principal may not describe fails the whole request
            try:
                while True:
                    try:
                        described = admin.describe_groups([group]).get(group, {})
                        break
                    except CoordinatorNotAvailableError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.5)
            except GroupAuthorizationFailedError:
                group_rights[group] = Rights(DENIED)
                continue
            except KafkaError as exc:
                group_rights[group] = Rights(UNKNOWN, detail=f"{type(exc).__name__}")
                continue
            error = described.get("error") or ""
            if GroupIdNotFoundError.__name__ in error or (not error and described.get("group_state") == "Dead"
                                                           and described.get("authorized_operations") is None):
                group_rights[group] = Rights(MISSING)
            elif "GroupAuthorizationFailed" in error:
                group_rights[group] = Rights(DENIED)
            elif error:
                group_rights[group] = Rights(UNKNOWN, detail=re.sub(r"\s+", " ", error)[:200])
            else:
                group_rights[group] = _rights(described.get("authorized_operations"))
    finally:
        admin.close()
    return topic_rights, group_rights


def create_acls(options: dict[str, Any], bindings: list[tuple[str, str, str, str, str]]) -> list[str]:
    """Create ALLOW ACLs from any host, each ``(principal, resource type, name, pattern type, operation)`` in
    Kafka's names (``User:w``, ``Topic``, ``events``, ``literal``, ``DescribeConfigs``); an ACL that exists is
    left as it is. Returns a reason for each one the broker refused (empty when all were created)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka.admin import ACL, ACLOperation, ACLPermissionType, ACLResourcePatternType, ResourcePattern, ResourceType

    def enum_name(name: str) -> str:
        return re.sub(r"(?<!^)(?=[A-Z])", "_", name).upper()

    acls = [ACL(principal, "*", ACLOperation[enum_name(operation)], ACLPermissionType.ALLOW,
                ResourcePattern(ResourceType[kind.upper()], name, ACLResourcePatternType[pattern.upper()]))
            for principal, kind, name, pattern, operation in bindings]
    admin = _admin(options)
    try:
        result = admin.create_acls(acls) if acls else {"failed": []}
    finally:
        admin.close()
    # kafka-python lists the refusals' error classes alone, in the order of the ACLs that did not succeed
    succeeded = {id(acl) for acl in result["succeeded"]}
    refused = [acl for acl in acls if id(acl) not in succeeded]
    return [_refusal(acl, error) for acl, error in zip(refused, result["failed"], strict=False)]


def _refusal(acl: Any, error: Any) -> str:
    """One refused ACL, as ``User:w READ TOPIC events: SecurityDisabledError``."""
    pattern = acl.resource_pattern
    name = getattr(error, "__name__", None) or type(error).__name__
    return f"{acl.principal} {acl.operation.name} {pattern.resource_type.name} {pattern.resource_name}: {name}"


def describe_acls(options: dict[str, Any]) -> list[tuple[str, str, str, str, str, str, str]]:
    """Every ACL on the cluster as ``(principal, host, resource type, name, pattern type, operation, permission)``
    in Kafka's names (``User:w``, ``*``, ``Topic``, ``events``, ``literal``, ``Read``, ``Allow``). Needs a
    principal allowed to Describe the cluster (an admin); raises the broker's refusal as a ``KafkaError``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka.admin import ACLFilter, ACLOperation, ACLPermissionType, ACLResourcePatternType, ResourcePatternFilter, ResourceType
        from kafka.errors import NoError

    every = ACLFilter(principal=None, host=None, operation=ACLOperation.ANY, permission_type=ACLPermissionType.ANY,
                      resource_pattern=ResourcePatternFilter(ResourceType.ANY, None, ACLResourcePatternType.ANY))
    admin = _admin(options)
    try:
        acls, error = admin.describe_acls(every)
    finally:
        admin.close()
    if error is not NoError and not isinstance(error, NoError):
        raise error() if isinstance(error, type) else error
    return [(acl.principal, acl.host, kafka_operation_name(acl.resource_pattern.resource_type.name),
             acl.resource_pattern.resource_name, acl.resource_pattern.pattern_type.name.lower(),
             kafka_operation_name(acl.operation.name), kafka_operation_name(acl.permission_type.name))
            for acl in acls]
