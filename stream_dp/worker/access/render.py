"""The ACL plan as ``kafka-acls.sh`` commands, as JSON and as text. Pure logic, no I/O."""

from __future__ import annotations

import shlex
from itertools import groupby
from typing import Any

from stream_dp.worker.access.kafka_plan import CLUSTER, GROUP, PREFIXED, KafkaAcl
from stream_dp.worker.access.redis_plan import RedisRule


def kafka_acls_commands(acls: list[KafkaAcl], bootstrap: str, *, command_config: str = "admin.properties") -> list[str]:
    """One ``kafka-acls.sh --add`` per principal and resource, its operations together. ``command_config``:
    the admin's client properties (a super user's SASL settings)."""
    commands = []
    for (principal, resource), bindings in groupby(sorted(acls, key=_command_key), key=lambda a: (a.principal, a.resource)):
        kind, name, pattern = resource
        words = ["kafka-acls.sh", "--bootstrap-server", bootstrap, "--command-config", command_config, "--add",
                 "--allow-principal", principal]
        for acl in bindings:
            words += ["--operation", acl.operation]
        if kind == CLUSTER:
            words.append("--cluster")
        else:
            words += ["--group" if kind == GROUP else "--topic", name]
            if pattern == PREFIXED:
                words += ["--resource-pattern-type", "prefixed"]
        commands.append(shlex.join(words))
    return commands


def _command_key(acl: KafkaAcl) -> tuple[str, ...]:
    return acl.principal, *acl.resource, acl.operation


def plan_json(acls: list[KafkaAcl], rule: RedisRule) -> dict[str, Any]:
    return {
        "kafka": [{"role": a.role, "principal": a.principal, "resource_type": a.resource_type,
                   "resource_name": a.resource_name, "pattern_type": a.pattern_type, "operation": a.operation,
                   "permission": "Allow", "host": "*", "why": a.why} for a in acls],
        "redis": {"user": rule.user, "key_patterns": list(rule.key_patterns), "commands": rule.commands,
                  "acl_file_line": rule.acl_file_line(), "acl_setuser": rule.setuser_command()},
    }


def plan_text(acls: list[KafkaAcl], rule: RedisRule, bootstrap: str) -> str:
    lines = ["# Kafka: every ACL is ALLOW from any host; everything else is denied "
             "(allow.everyone.if.no.acl.found=false)."]
    # by role and principal: input topics may each have their own producer
    for (role, principal), bindings in groupby(acls, key=lambda a: (a.role, a.principal)):
        listed = list(bindings)
        lines.append(f"# {role} ({principal}):")
        for (kind, name, pattern), on_resource in groupby(listed,
                                                          key=lambda a: a.resource):
            ops = list(on_resource)
            lines.append(f"#   {kind} {name}{' (prefixed)' if pattern == PREFIXED else ''}: "
                         + ", ".join(a.operation for a in ops) + f"  -- {ops[0].why.split(':')[0]}")
    lines += kafka_acls_commands(acls, bootstrap)
    lines += ["", f"# Redis: user {rule.user}, keys {' '.join(rule.key_patterns)}, only these commands; replace "
              "<password> (redis-cli, or a line of the aclfile):",
              shlex.join(["redis-cli", *rule.setuser_command().split(" ")]),
              rule.acl_file_line()]
    return "\n".join(lines) + "\n"
