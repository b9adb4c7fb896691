"""Running script calls on the master that holds their keys, then WAIT there for replicas.

A charge is durable across a failover only once a replica holds it: Redis
replicates asynchronously, so a master that dies right after acknowledging a
write can take it with it, and the replica promoted in its place never saw it.
``WAIT n timeout`` blocks until ``n`` replicas acknowledged every write the
connection made so far, so each master's calls go down one connection (a
pipeline), followed there by WAIT. A call that replays a recorded charge writes
nothing, and WAIT only covers what its own connection wrote: the pipeline
therefore writes a small sync key of the same slot right before WAIT. Replication
is one ordered stream per master, so once that write is acknowledged, so is every
write before it, the replayed charge's first run included.

Works on a plain ``redis.Redis`` (one node) and on a ``redis.cluster.RedisCluster``,
routing by hash slot from the client's slot map; MOVED refreshes the map, ASK
sends the call once to the importing master with ASKING, and a dead master's
connection errors leave calls pending for the caller's retry after a refresh.

While a slot migrates, Redis runs a multi-key call only on a node holding all
of its declared keys, and answers TRYAGAIN (or ASK) otherwise. A charge's record
key never exists before its first run, so a new charge of a migrating slot is
refused until the migration ends (retried, fail closed), and never runs on a
node holding only part of the slot's budgets.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    NoScriptError,
    RedisClusterException,
    TryAgainError,
)

from stream_dp.budget.keys import key_slot_of

SYNC_TTL_MS = 60_000

SET_ONCE = """
local stored = redis.call('GET', KEYS[1])
if stored then return stored end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return false
"""
"""Store ARGV[1] in KEYS[1] for ARGV[2] ms unless it holds a value; returns the held value (nil if it stored)."""
SET_ONCE_SHA = hashlib.sha1(SET_ONCE.encode()).hexdigest()


class ReplicationShortfall(redis.RedisError):
    """WAIT returned before enough replicas acknowledged: the writes may not survive a failover."""


RETRYABLE_CLUSTER = (MovedError, AskError, TryAgainError, ClusterDownError, ReplicationShortfall)


@dataclass(frozen=True)
class ReplicaWait:
    """Wait for ``replicas`` replicas (``WAIT``) for at most ``timeout_ms`` after writes a release depends on."""

    replicas: int
    timeout_ms: int

    def __post_init__(self) -> None:
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int) or self.replicas < 0:
            raise ValueError(f"replicas to wait for must be an integer >= 0, got {self.replicas!r}")
        if isinstance(self.timeout_ms, bool) or not isinstance(self.timeout_ms, int) or self.timeout_ms < 1:
            raise ValueError(
                f"WAIT timeout must be a positive integer of ms, got {self.timeout_ms!r} (0 would wait forever)"
            )


@dataclass
class Call:
    """One EVALSHA: ``keys[0]`` routes it; ``sync_key`` is a key of the same slot for the WAIT write."""

    sha: str
    source: str
    keys: list[Any]
    args: list[Any]
    sync_key: str
    ask: tuple[str, int] | None = field(default=None, compare=False)


def is_cluster(client: Any) -> bool:
    return isinstance(client, RedisCluster)


class NodeRunner:
    """Runs calls pipelined per master and WAITs there; keeps the replies of the calls that are done.

    ``run_pending`` does one round and raises the first retryable error when
    calls are left, so the caller's retry loop (with backoff) simply calls it
    again: calls already done are not sent twice.
    """

    def __init__(self, client: Any, calls: list[Call], wait: ReplicaWait | None) -> None:
        self._client = client
        self._calls = calls
        self._wait = wait if wait is not None and wait.replicas > 0 else None
        self.replies: dict[int, Any] = {}

    def run_pending(self) -> list[Any]:
        pending = [i for i in range(len(self._calls)) if i not in self.replies]
        first_error: BaseException | None = None
        refresh = False
        try:
            by_node = self._by_node(pending)
        except RedisClusterException as exc:  # e.g. a slot no master serves while a failover is under way
            self._refresh()
            raise ClusterDownError(f"{type(exc).__name__}: {exc}") from exc
        for node_client, indices in by_node.items():
            try:
                error = self._run_on_node(node_client, indices)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                error, refresh = exc, True
            if error is not None:
                first_error = first_error or error
                refresh = refresh or isinstance(error, (MovedError, ClusterDownError))
        if first_error is not None:
            if refresh and is_cluster(self._client):
                self._refresh()
            raise first_error
        return [self.replies[i] for i in range(len(self._calls))]

    def _refresh(self) -> None:
        try:
            self._client.nodes_manager.initialize()
        except (redis.RedisError, RedisClusterException):
            pass  # no node answers yet (a failover under way): the next round tries again

    def _by_node(self, indices: list[int]) -> dict[Any, list[int]]:
        groups: dict[Any, list[int]] = {}
        for i in indices:
            groups.setdefault(self._node_client(self._calls[i]), []).append(i)
        return groups

    def _node_client(self, call: Call) -> Any:
        if not is_cluster(self._client):
            return self._client
        manager = self._client.nodes_manager
        if call.ask is not None:
            node = manager.get_node(host=call.ask[0], port=call.ask[1])
            if node is not None:
                return self._client.get_redis_connection(node)
        node = manager.get_node_from_slot(key_slot_of(call.keys[0]))
        return self._client.get_redis_connection(node)

    def _run_on_node(self, node_client: Any, indices: list[int]) -> BaseException | None:
        """Run ``indices`` on one master; returns the first retryable error (None if all are done and durable)."""
        for _ in range(2):  # a second pass only after loading a script missing from the node
            pipe = node_client.pipeline(transaction=False)
            for i in indices:
                call = self._calls[i]
                if call.ask is not None:
                    pipe.execute_command("ASKING")
                pipe.evalsha(call.sha, len(call.keys), *call.keys, *call.args)
            tail = 0
            if self._wait is not None:
                last = self._calls[indices[-1]]
                if last.ask is not None:  # the sync key is of the same migrating slot as the last call
                    pipe.execute_command("ASKING")
                    tail += 1
                pipe.set(last.sync_key, b"1", px=SYNC_TTL_MS)
                pipe.execute_command("WAIT", self._wait.replicas, self._wait.timeout_ms)
                tail += 2
            out = pipe.execute(raise_on_error=False)
            replies = self._strip_asking(indices, out[: len(out) - tail])
            missing = [i for i, r in zip(indices, replies, strict=True) if isinstance(r, NoScriptError)]
            if missing:
                for source in {self._calls[i].source for i in missing}:
                    node_client.script_load(source)
                continue
            return self._settle(node_client, indices, replies, out)
        return NoScriptError("script still missing after SCRIPT LOAD (is the node being replaced?)")

    def _strip_asking(self, indices: list[int], replies: list[Any]) -> list[Any]:
        """Drop the ASKING replies, keeping one reply per call."""
        kept, pos = [], 0
        for i in indices:
            if self._calls[i].ask is not None:
                pos += 1  # the ASKING reply
            kept.append(replies[pos])
            pos += 1
        return kept

    def _settle(self, node_client: Any, indices: list[int], replies: list[Any], out: list[Any]) -> BaseException | None:
        error: BaseException | None = None
        done: list[int] = []
        for i, reply in zip(indices, replies, strict=True):
            call = self._calls[i]
            call.ask = None
            if isinstance(reply, AskError) and not isinstance(reply, MovedError):
                call.ask = (reply.host, int(reply.port))
                error = error or reply
            elif isinstance(reply, RETRYABLE_CLUSTER):
                error = error or reply
            elif isinstance(reply, BaseException):
                raise reply  # a script error: not retried (fail closed)
            else:
                done.append(i)
        if self._wait is not None and done:
            sync, acked = out[-2], out[-1]
            if isinstance(sync, RETRYABLE_CLUSTER):  # the sync key's slot moved or is moving: go where it is
                return error or sync
            if isinstance(sync, BaseException) or isinstance(acked, BaseException) or int(acked) < self._wait.replicas:
                where = node_client.connection_pool.connection_kwargs
                problem = next((r for r in (sync, acked) if isinstance(r, BaseException)), None)
                detail = f"{problem}" if problem is not None else f"{acked} of {self._wait.replicas} replicas"
                return error or ReplicationShortfall(
                    f"WAIT on {where.get('host')}:{where.get('port')}: {detail} acknowledged within "
                    f"{self._wait.timeout_ms} ms; the charge may not survive a failover, so it is not released. "
                    "Check the master's replicas (INFO replication), or lower STREAM_DP_REDIS_WAIT_REPLICAS"
                )
        for i, reply in zip(indices, replies, strict=True):
            if i in done:
                self.replies[i] = reply
        return error


def set_once(client: Any, key: str, value: bytes | str, ttl_ms: int, sync_key: str, wait: ReplicaWait | None) -> Any:
    """``SET key value NX PX ttl_ms``, then the held value (None if this call stored it), durable as charges are.

    With ``wait``, returns only once that many replicas hold the key (whether
    this call or an earlier one wrote it), else raises a retryable error.
    """
    call = Call(SET_ONCE_SHA, SET_ONCE, [key], [value, int(ttl_ms)], sync_key)
    (held,) = NodeRunner(client, [call], wait).run_pending()
    return held


def ping(client: Any, replicas: int = 0) -> bool:
    """True if Redis can take charges: it answers ``PING``, and with ``replicas`` has that many connected.

    On a Redis Cluster every master of the slot map must answer (the map is
    refreshed once if one does not, as after a failover). Raises a
    ``redis.RedisError`` naming the node and what is missing otherwise.
    """
    if not is_cluster(client):
        _ping_node(client, "Redis", replicas)
        return True
    for attempt in range(2):
        try:
            for node in client.get_primaries():
                _ping_node(client.get_redis_connection(node), f"Redis Cluster master {node.name}", replicas)
            return True
        except (redis.ConnectionError, redis.TimeoutError, ReplicationShortfall):
            if attempt:
                raise
            NodeRunner(client, [], None)._refresh()
    return True  # not reached


def _ping_node(node: Any, name: str, replicas: int) -> None:
    try:
        if replicas == 0:
            node.ping()
            return
        role = node.execute_command("ROLE")
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise type(exc)(f"{name} does not answer: {exc}") from exc
    connected = len(role[2]) if role and role[0] in (b"master", "master") else 0
    if connected < replicas:
        raise ReplicationShortfall(
            f"{name} has {connected} replicas connected and charges wait for {replicas}: they fail closed until "
            "a replica is back (or lower STREAM_DP_REDIS_WAIT_REPLICAS)"
        )
