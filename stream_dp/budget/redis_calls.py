"""Talking to Redis for the budget store: scripts by SHA, retries, fail-closed errors, server checks."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from importlib import resources
from typing import Any

import redis
from redis.exceptions import BusyLoadingError, NoScriptError, OutOfMemoryError, RedisError

from stream_dp.budget.redis_nodes import RETRYABLE_CLUSTER, ReplicationShortfall, is_cluster
from stream_dp.budget.store import BudgetUnavailable
from stream_dp.metrics.budget import BudgetMetrics

# Redirections and a cluster without a master for a slot are what a failover or resharding looks like
# from a client: retried like a lost connection (a charge retried is replayed, never charged twice).
_RETRYABLE = (redis.ConnectionError, redis.TimeoutError, BusyLoadingError, *RETRYABLE_CLUSTER)


def error_kind(error: BaseException) -> str:
    """Metric label of a Redis error."""
    if isinstance(error, redis.TimeoutError):
        return "timeout"
    if isinstance(error, BusyLoadingError):
        return "loading"
    if isinstance(error, redis.ConnectionError):
        return "connection"
    if isinstance(error, ReplicationShortfall):
        return "replication"
    if isinstance(error, RETRYABLE_CLUSTER):
        return "cluster"
    if isinstance(error, OutOfMemoryError):
        return "out_of_memory"
    return "script"


_UNCHECKED = ("{setting} could not be read (CONFIG GET refused for this user): check that it is {want} on the "
              "server yourself")


class Script:
    """A Lua script shipped with the package, run by SHA (EVALSHA)."""

    def __init__(self, name: str) -> None:
        self.source = resources.files("stream_dp.budget").joinpath(f"{name}.lua").read_text(encoding="utf-8")
        self.sha = hashlib.sha1(self.source.encode("utf-8")).hexdigest()


class RedisCaller:
    """Runs Redis calls with retries and turns every failure into ``BudgetUnavailable``.

    Connection errors, timeouts, a loading server, cluster redirections and
    replicas short of WAIT are retried ``retries``
    times, waiting ``backoff_s * 2**attempt``; other errors (a script error,
    WRONGTYPE, OOM) are not. A script missing from the server's cache (after a
    restart or SCRIPT FLUSH) is loaded and run again.
    """

    def __init__(
        self,
        client: Any,
        *,
        retries: int,
        backoff_s: float,
        metrics: BudgetMetrics | None,
        sleep: Callable[[float], None],
    ) -> None:
        if retries < 0 or backoff_s < 0:
            raise ValueError(f"retries and backoff_s must be >= 0, got retries={retries!r}, backoff_s={backoff_s!r}")
        self.client = client
        self._retries = retries
        self._backoff_s = backoff_s
        self._metrics = metrics
        self._sleep = sleep

    def run_script(self, script: Script, keys: list[Any], args: list[Any]) -> Any:
        """EVALSHA once (no retries; wrap in :meth:`call`)."""
        try:
            return self.client.evalsha(script.sha, len(keys), *keys, *args)
        except NoScriptError:
            self.client.script_load(script.source)
            return self.client.evalsha(script.sha, len(keys), *keys, *args)

    def call(self, namespace: str, operation: str, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` with retries; any failure becomes ``BudgetUnavailable`` (fail closed)."""
        attempt = 0
        while True:
            try:
                return fn()
            except _RETRYABLE as error:
                self._count_error(namespace, operation, error)
                if attempt >= self._retries:
                    raise BudgetUnavailable(
                        f"budget store unreachable during {operation} ({type(error).__name__}: {error}) after "
                        f"{attempt + 1} attempts; nothing may be released. Check Redis, or raise retries/backoff_s"
                    ) from error
                self._sleep(self._backoff_s * (2**attempt))
                attempt += 1
            except OutOfMemoryError as error:
                # Not retried here: memory frees only when keys expire or an operator acts. The window is
                # held (nothing was written: Redis refuses a writing script whole) and charged later.
                self._count_error(namespace, operation, error)
                raise BudgetUnavailable(
                    f"budget store is out of memory during {operation} ({error}); nothing may be released until "
                    "it has room. Raise Redis's maxmemory (keep maxmemory-policy noeviction) or add memory; held "
                    "windows are charged and released once it accepts writes"
                ) from error
            except RedisError as error:
                self._count_error(namespace, operation, error)
                raise BudgetUnavailable(
                    f"budget store failed during {operation} ({type(error).__name__}: {error}); nothing may be "
                    "released. Check that no other application writes keys under this key prefix"
                ) from error

    def _count_error(self, namespace: str, operation: str, error: BaseException) -> None:
        if self._metrics is not None:
            self._metrics.record_error(namespace, operation, error_kind(error))

    def server_time_ms(self, namespace: str) -> int:
        seconds, micros = self.call(namespace, "read", self.client.time)
        return int(seconds) * 1000 + int(micros) // 1000

    def durability_warnings(self, wait_replicas: int = 0) -> list[str]:
        """Server settings under which acknowledged charges could be lost (empty if none), on every master."""
        if not is_cluster(self.client):
            return self._node_warnings(self.client, "", wait_replicas)
        warnings = []
        if wait_replicas == 0:
            warnings.append(
                "charges do not wait for replicas (STREAM_DP_REDIS_WAIT_REPLICAS=0): a failover can lose charges "
                "already released; set it to 1 or more"
            )
        for node in self.call("-", "read", self.client.get_primaries):
            warnings += self._node_warnings(self.client.get_redis_connection(node), f"{node.name}: ", wait_replicas)
        return warnings

    def _node_warnings(self, client: redis.Redis, where: str, wait_replicas: int) -> list[str]:
        warnings: list[str] = []
        info = self.call("-", "read", lambda: client.info())
        replicas = int(info.get("connected_slaves", 0))
        if wait_replicas > replicas:
            warnings.append(
                f"{where}{replicas} replicas connected, but charges wait for {wait_replicas}: every charge fails "
                "until enough replicas are up; add replicas or lower STREAM_DP_REDIS_WAIT_REPLICAS"
            )
        if info.get("maxmemory_policy", "noeviction") != "noeviction":
            warnings.append(
                f"{where}maxmemory-policy is {info['maxmemory_policy']}: Redis may evict budget keys, which forgets "
                "spending; set maxmemory-policy noeviction"
            )
        lazyfree = self._config_value(client, "lazyfree-lazy-expire")
        if lazyfree is None:
            warnings.append(f"{where}{_UNCHECKED.format(setting='lazyfree-lazy-expire', want='yes')}")
        elif lazyfree not in ("", "yes"):
            warnings.append(
                f"{where}lazyfree-lazy-expire is off: expiring a generation's shard hashes frees them in the main "
                "thread; set lazyfree-lazy-expire yes"
            )
        if not int(info.get("aof_enabled", 0)):
            warnings.append(f"{where}appendonly is off: a Redis restart forgets all spending; set appendonly yes")
        else:
            fsync = self._config_value(client, "appendfsync")
            if fsync is None:
                warnings.append(f"{where}{_UNCHECKED.format(setting='appendfsync', want='always')}")
            elif fsync not in ("", "always"):
                warnings.append(
                    f"{where}appendfsync is {fsync}: a Redis crash can forget charges already acknowledged; "
                    "set appendfsync always"
                )
        return warnings

    @staticmethod
    def _config_value(client: redis.Redis, name: str) -> str | None:
        """A server setting ("" if the server does not know it), or None where CONFIG is refused (a Redis ACL
        user with only the worker's commands, a managed Redis)."""
        try:
            values = client.config_get(name)
        except RedisError:
            return None
        for key, value in values.items():
            if (key.decode() if isinstance(key, bytes) else key) == name:
                return value.decode() if isinstance(value, bytes) else str(value)
        return ""
