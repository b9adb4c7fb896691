"""``stream-dp acls --check``: the ACLs a broker holds on the worker's topics and groups beyond the plan
(``kafka_plan``). Pure logic, no I/O (``kafka.acl_admin.describe_acls`` reads them).

``--apply`` only adds: a grant from an earlier plan (a renamed principal, a topic that changed role, a test
user) stays. Every binding that reaches one of the plan's resources -- the same name, the ``*`` wildcard, or
a prefix of the name -- and is not in the plan is listed with the ``kafka-acls.sh --remove`` command that drops
it. The check fails when one lets a principal other than the worker Read or Write a topic as sensitive as the
raw events (input, partials, alerts, dead-letter): that one breaks the guarantee. Super users (``super.users``)
hold no ACL and are not seen here.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from stream_dp.worker.access.kafka_plan import CLUSTER, GROUP, LITERAL, PREFIXED, KafkaAcl

ALLOW, DENY = "Allow", "Deny"
SENSITIVE_ROLES = ("input", "partials", "alerts", "dead-letter")
#: Operations that read or write records (``All`` includes both).
_READ_WRITE = frozenset({"Read", "Write", "All"})


@dataclass(frozen=True, order=True)
class Binding:
    """One ACL as the broker lists it, in Kafka's names (``Topic``, ``literal``, ``Read``, ``Allow``)."""

    principal: str
    host: str
    resource_type: str
    resource_name: str
    pattern_type: str
    operation: str
    permission: str


@dataclass(frozen=True)
class Finding:
    binding: Binding
    reaches: tuple[str, ...]  # "Topic 'x' (partials)", ...
    fatal: bool


def reaches(binding: Binding, resource_type: str, name: str, pattern: str = LITERAL) -> bool:
    """Whether ``binding`` applies to the plan's resource (a prefixed plan resource: to any name under it)."""
    if binding.resource_type != resource_type:
        return False
    if binding.pattern_type == LITERAL:
        return binding.resource_name in ("*", name) if pattern == LITERAL else binding.resource_name == "*"
    if binding.pattern_type == PREFIXED:
        return name.startswith(binding.resource_name)
    return False


def audit(existing: list[Binding], plan: list[KafkaAcl], roles: dict[tuple[str, str], list[str]], *,
          worker: str) -> list[Finding]:
    """Each binding in ``existing`` that reaches a resource of ``plan`` and is not one of its ALLOWs from any
    host. ``roles``: ``(resource type, name)`` -> the resource's roles (``input``, ``partials``...)."""
    planned = {(a.principal, "*", a.resource_type, a.resource_name, a.pattern_type, a.operation, ALLOW) for a in plan}
    resources = sorted({(a.resource_type, a.resource_name, a.pattern_type) for a in plan if a.resource_type != CLUSTER})
    findings = []
    for binding in sorted(set(existing)):
        key = (binding.principal, binding.host, binding.resource_type, binding.resource_name, binding.pattern_type,
               binding.operation, binding.permission)
        if key in planned:
            continue
        hit = [(kind, name, roles.get((kind, name), [])) for kind, name, pattern in resources
               if reaches(binding, kind, name, pattern)]
        if not hit:
            continue
        fatal = (binding.permission == ALLOW and binding.principal != worker and binding.operation in _READ_WRITE
                 and any(role in SENSITIVE_ROLES for _, _, found in hit for role in found))
        findings.append(Finding(binding, tuple(f"{kind} {name!r} ({' and '.join(found) or 'analysts'})"
                                               for kind, name, found in hit), fatal))
    return findings


def remove_command(binding: Binding, bootstrap: str, *, command_config: str = "admin.properties") -> str:
    """The ``kafka-acls.sh --remove`` that drops exactly ``binding``."""
    side = "allow" if binding.permission == ALLOW else "deny"
    words = ["kafka-acls.sh", "--bootstrap-server", bootstrap, "--command-config", command_config, "--remove",
             "--force", f"--{side}-principal", binding.principal, f"--{side}-host", binding.host,
             "--operation", binding.operation]
    if binding.resource_type == CLUSTER:
        words.append("--cluster")
    else:
        words += ["--group" if binding.resource_type == GROUP else "--topic", binding.resource_name,
                  "--resource-pattern-type", binding.pattern_type]
    return shlex.join(words)


def report(findings: list[Finding], bootstrap: str) -> str:
    if not findings:
        return "# no ACL on the worker's topics and groups beyond the plan\n"
    lines = [f"# {len(findings)} ACL(s) on the worker's topics and groups beyond the plan"
             + (f", {sum(f.fatal for f in findings)} letting a principal other than the worker read or write "
                "input, partials, alerts or dead-letter records" if any(f.fatal for f in findings) else "") + ":"]
    for finding in findings:
        b = finding.binding
        lines.append(f"# {'DANGER ' if finding.fatal else ''}{b.permission} {b.principal} from {b.host}: {b.operation} "
                     f"on {b.resource_type} {b.resource_name!r} ({b.pattern_type}), reaching "
                     + ", ".join(finding.reaches))
    lines += [remove_command(f.binding, bootstrap) for f in findings]
    return "\n".join(lines) + "\n"
