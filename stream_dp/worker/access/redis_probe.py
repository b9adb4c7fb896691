"""At start, the worker tries every command of its Redis rule (``redis_plan``) once, harmlessly, on keys of
each of its prefixes, and stops naming what Redis refused.

Why try rather than ask: ``ACL GETUSER`` and ``ACL DRYRUN`` need an admin's rights, which the worker's user
must not have. Redis checks a command's right and its keys' patterns before it runs the command, so a refusal
is ``NOPERM`` and any other answer (``NOSCRIPT``, ``no such key``, a value) means allowed. The probes touch
only keys named ``<prefix>{probe-<random>}:<n>``, which no budget, ledger or period key can be, written with
a TTL and deleted again; ``SCRIPT LOAD`` caches a one-line script.

Without this, a user missing say ``hset`` lets the worker join its groups and report ready, then hold
every window (each charge or ledger write is refused, and fails closed) with nothing but errors in the log.
A Redis that does not answer at start is not a refusal: the check is made at the first answer instead
(the readiness watcher calls :meth:`RedisRights.verify` with each ping), and the worker is not ready while
its rights are short.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from stream_dp.worker.access.redis_plan import PASSWORD_PLACEHOLDER, RedisRule, worker_redis_rule
from stream_dp.worker.query.costs import WorkerConfigError

log = logging.getLogger(__name__)

#: A far-off absolute expiry (ms) for the PEXPIREAT probe: the probe key is deleted right after.
_FAR_EXPIRY_MS = 4_102_444_800_000  # 2100-01-01


class RedisAccessError(WorkerConfigError):
    """The worker's Redis user may not run a command, or touch a key, its rule needs."""


@dataclass(frozen=True)
class Probe:
    command: str  # the rule's name for it: ``hset``, ``script|load``
    args: tuple[Any, ...]
    pattern: str | None  # the key pattern whose keys it touches; None for a command without keys


def _keyed_probes(pattern: str, token: str) -> list[Probe]:
    """Every keyed command of the rule on keys of ``pattern``, in an order that leaves nothing behind.

    The keys share a hash tag, so that RENAME's two keys are in one slot of a Redis Cluster."""
    base = f"{pattern.rstrip('*')}{{probe-{token}}}"
    text, fields, ranked, renamed = f"{base}:1", f"{base}:2", f"{base}:3", f"{base}:4"
    calls: list[tuple[str, tuple[Any, ...]]] = [
        ("set", ("SET", text, "1", "PX", 60_000)),
        ("get", ("GET", text)),
        ("type", ("TYPE", text)),
        ("rename", ("RENAME", text, renamed)),  # keeps the TTL
        ("hset", ("HSET", fields, "f", "1")),
        ("expire", ("EXPIRE", fields, 60)),
        ("pexpire", ("PEXPIRE", fields, 60_000)),
        ("hget", ("HGET", fields, "f")),
        ("hmget", ("HMGET", fields, "f")),
        ("hlen", ("HLEN", fields)),
        ("persist", ("PERSIST", fields)),
        ("pexpireat", ("PEXPIREAT", fields, _FAR_EXPIRY_MS)),
        ("hdel", ("HDEL", fields, "f")),  # the hash's last field: the key goes with it
        ("zadd", ("ZADD", ranked, 0, "m")),
        ("zcard", ("ZCARD", ranked)),
        ("zrange", ("ZRANGE", ranked, 0, -1)),
        ("zrevrange", ("ZREVRANGE", ranked, 0, -1)),
        ("zremrangebyrank", ("ZREMRANGEBYRANK", ranked, 0, -1)),  # the set's last member: the key goes too
        ("evalsha", ("EVALSHA", "0" * 40, 1, text)),  # no such script: NOSCRIPT once the right is checked
        ("del", ("DEL", text, fields, ranked, renamed)),
    ]
    return [Probe(command, args, pattern) for command, args in calls]


#: Commands without keys, with a harmless call each.
_KEYLESS: dict[str, tuple[Any, ...]] = {
    "script|load": ("SCRIPT", "LOAD", "return 1"),
    "time": ("TIME",),
    "ping": ("PING",),
    "info": ("INFO", "persistence"),
    "role": ("ROLE",),
    "wait": ("WAIT", 0, 0),  # no replica asked for: answers at once
}


#: Commands a worker can do without: ``info`` only feeds the durability warnings at start (without it the
#: worker says it could not check them); ``role`` and ``wait`` serve only charges that wait for replicas.
OPTIONAL = frozenset({"info"})
ONLY_WITH_REPLICAS = frozenset({"role", "wait"})


def probes(rule: RedisRule, token: str, *, replicas: bool = True) -> list[Probe]:
    """The calls that try each command of ``rule`` (the keyed ones on every key pattern), without ``role``
    and ``wait`` unless charges wait for replicas. Pure."""
    keyed = [p for pattern in rule.key_patterns for p in _keyed_probes(pattern, token)]
    keyless = [Probe(c, args, None) for c, args in _KEYLESS.items() if replicas or c not in ONLY_WITH_REPLICAS]
    return [p for p in keyless + keyed if p.command in rule.commands]


def refused(execute: Callable[..., Any], calls: Sequence[Probe]) -> list[str]:
    """Run ``calls``; each one Redis refuses, as ``command on pattern: Redis's message``. Connection errors
    propagate (Redis not answering is not a refusal)."""
    import redis

    out: list[str] = []
    for probe in calls:
        try:
            execute(*probe.args)
        except redis.exceptions.NoPermissionError as exc:
            where = f" on keys {probe.pattern!r}" if probe.pattern else ""
            out.append(f"{probe.command.upper()}{where} ({exc})")
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
            raise
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException):
            pass  # NOSCRIPT, no such key...: the right was granted
    return out


def redis_user(url: str) -> str:
    """The user a Redis URL logs in as (``default`` when it names none)."""
    from urllib.parse import unquote, urlsplit

    return unquote(urlsplit(url).username or "") or "default"


class RedisRights:
    """Whether the worker's Redis user may do what the worker does; verified once, then remembered."""

    def __init__(self, client: Any, url: str, *, cluster: bool, replicas: bool = False) -> None:
        """``replicas``: charges wait for replicas (``STREAM_DP_REDIS_WAIT_REPLICAS``), which needs ROLE and WAIT."""
        self._client = client
        self._replicas = replicas
        self.user = redis_user(url)
        self.rule = worker_redis_rule(self.user, cluster=cluster)
        self._verified = False
        self._lock = threading.Lock()

    def verify(self) -> None:
        """Try the rule's commands unless done already; ``RedisAccessError`` naming each refusal and the fix.
        A connection error propagates, and the check is made again at the next call."""
        with self._lock:
            if self._verified:
                return
            tried = probes(self.rule, secrets.token_hex(8), replicas=self._replicas)
            short = refused(self._client.execute_command, [p for p in tried if p.command not in OPTIONAL])
            for missing in refused(self._client.execute_command, [p for p in tried if p.command in OPTIONAL]):
                log.warning("the worker's Redis user %r may not run %s: it cannot check Redis's durability "
                            "settings at start (check them on the server)", self.user, missing)
            if short:
                raise RedisAccessError(
                    f"the worker's Redis user {self.user!r} may not run: " + "; ".join(short)
                    + f". Give it the rule `stream-dp acls --config FILE` prints: "
                    f"{self.rule.setuser_command(PASSWORD_PLACEHOLDER)} (docs/operations/security.md)")
            self._verified = True
            log.info("Redis user %r may run every command of its rule on its %d key prefixes",
                     self.user, len(self.rule.key_patterns))

    def verify_at_start(self) -> None:
        """As :meth:`verify`, but a Redis that does not answer yet is left to the readiness watcher."""
        import redis

        try:
            self.verify()
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
            log.warning("cannot check the Redis user's rights now (%s): checked when Redis answers; the worker "
                        "is not ready until then", exc)
