"""The Redis ACL rule of the worker's user: its key prefixes and the commands it issues. Pure logic, no I/O.

Redis checks every command a Lua script runs against the user that called the script, and every key
the script names, so the rule lists the scripts' commands too (``stream_dp/budget/charge.lua``, the
ledger's, period register's and store guard's scripts). ``tests/worker/access`` reads those scripts and
fails when one uses a command missing here.

Left out on purpose: ``CONFIG`` (it reads every server setting, passwords included: the worker then skips
its appendfsync and lazyfree checks), ``KEYS``/``SCAN``, ``FLUSH*`` and every pub/sub channel. The
operator's ``stream-dp budget reset`` (``reset.lua``: ``ZREM``) runs as another user.
"""

from __future__ import annotations

from dataclasses import dataclass

from stream_dp.budget.redis_store import DEFAULT_KEY_PREFIX
from stream_dp.worker.store.ledger import LEDGER_PREFIX
from stream_dp.worker.store.period_register import PERIODS_PREFIX

PASSWORD_PLACEHOLDER = "<password>"

#: Command (Redis's lower-case name, ``container|sub`` for a subcommand) -> why the worker issues it.
WORKER_COMMANDS: dict[str, str] = {
    "evalsha": "runs the charge, ledger, period and store-marker scripts",
    "script|load": "loads a script a restarted or failed-over Redis forgot",
    "get": "ledger marks, store markers, layout marks (and in scripts)",
    "set": "layout marks, sync keys before WAIT (and in scripts)",
    "hget": "budget reads and period registers (in scripts)",
    "hmget": "ledger entries, period registers, budget shards",
    "hset": "ledger entries and their chunks, budget shards (and in scripts)",
    "hdel": "budget shards of a lapsed generation (in charge.lua)",
    "hlen": "a chunked ledger entry's staging hash (in a script)",
    "expire": "staging keys and ledger entries expire",
    "pexpire": "budget shards and charge records expire (in charge.lua)",
    "pexpireat": "period registers expire (in a script)",
    "persist": "a home's released mark never expires (in a script)",
    "del": "a staging key no longer needed",
    "rename": "a chunked ledger entry is moved into place (in a script)",
    "type": "an entry written by an earlier version (in a script)",
    "zadd": "a namespace's top spenders (in charge.lua)",
    "zcard": "a namespace's top spenders (in charge.lua)",
    "zrange": "a namespace's top spenders (in charge.lua)",
    "zrevrange": "the units over budget read back",
    "zremrangebyrank": "a namespace's top spenders trimmed (in charge.lua)",
    "time": "one clock for every worker (and in scripts)",
    "ping": "readiness",
    "info": "durability checks at start (appendonly, eviction policy, replicas)",
    "role": "readiness when charges wait for replicas",
    "wait": "charges wait for replicas (STREAM_DP_REDIS_WAIT_REPLICAS)",
}

#: What a Redis Cluster client issues besides (slot map, redirections). Not run against a cluster with
#: ACLs in the test suite.
CLUSTER_COMMANDS: dict[str, str] = {
    "asking": "follows a slot being migrated",
    "cluster|slots": "the slot map",
    "cluster|shards": "the slot map",
    "command": "redis-py's cluster client reads the key positions of commands",
    "readonly": "redis-py's cluster client may send it to replicas",
}


@dataclass(frozen=True)
class RedisRule:
    """The worker user's rule: keys matching ``key_patterns``, no channels, only ``commands``."""

    user: str
    key_patterns: tuple[str, ...]
    commands: dict[str, str]

    def tokens(self) -> list[str]:
        """The rule's ACL tokens, without the user and password: ``ACL SETUSER user reset on >pw <tokens>``."""
        return ["resetkeys", *(f"~{p}" for p in self.key_patterns), "resetchannels", "-@all",
                *(f"+{c}" for c in self.commands)]

    def acl_file_line(self, password: str = PASSWORD_PLACEHOLDER) -> str:
        """A line of a Redis ACL file (``aclfile``) for this user."""
        return " ".join(["user", self.user, "on", f">{password}", *self.tokens()])

    def setuser_command(self, password: str = PASSWORD_PLACEHOLDER) -> str:
        """The ``redis-cli`` command that creates (or resets) the user with this rule."""
        return " ".join(["ACL", "SETUSER", self.user, "reset", "on", f">{password}", *self.tokens()])


def key_patterns() -> tuple[str, ...]:
    """Every key the worker reads or writes: the budget store's, the release ledger's and the period
    register's (the ledger's store markers share its prefix)."""
    return (f"{DEFAULT_KEY_PREFIX}*", f"{LEDGER_PREFIX}:*", f"{PERIODS_PREFIX}:*")


def worker_redis_rule(user: str, *, cluster: bool = False) -> RedisRule:
    if not user or any(c.isspace() for c in user):
        raise ValueError(f"Redis user name {user!r} is empty or holds a space")
    commands = dict(WORKER_COMMANDS)
    if cluster:
        commands.update(CLUSTER_COMMANDS)
    return RedisRule(user, key_patterns(), commands)
