"""The Redis budget store: packed unit states in sharded hashes, one Lua script per batch.

Keys on one Redis (``prefix`` defaults to ``dp:``; namespaces contain no ``:``):

* ``{prefix}s:{namespace}:{generation}:{shard}`` -- hash of packed unit
  states, one field per active unit (layout, generations and shards in
  :mod:`stream_dp.budget.layout`); expires two generations after it was
  last written;
* ``{prefix}c:{namespace}:{charge_id}`` -- the charge record that makes a
  retry replay instead of charging again; expires after
  ``StoreOptions.record_ttl_ms``;
* ``{prefix}t:{namespace}:{period}`` -- sorted set of the units with the
  highest spend fraction charged in one period (the longest horizon), at most
  ``top_capacity`` members; expires two periods later;
* ``{prefix}m:{namespace}`` -- the layout fingerprint every writer must share
  (:attr:`StorageLayout.fingerprint`); readers adopt it.

On a Redis Cluster (a ``redis.cluster.RedisCluster`` client) the same keys
carry the hash tag of their shard's slot group after the namespace
(``{prefix}s:{namespace}:{tag}:{generation}:{shard}`` and so on, see
:mod:`stream_dp.budget.keys`): a batch is charged by one call per slot group,
each atomic and idempotent on its own, and a charge's manifest (the digest of
the whole batch, by charge id, see :mod:`stream_dp.budget.redis_marks`) makes a
charge id reused for another batch fail before any group is charged.

Redis must keep what it acknowledged: run it with ``appendonly yes`` and
``appendfsync always`` (with ``everysec`` a crash of Redis can forget up to a
second of charges that were already released) and ``maxmemory-policy
noeviction`` (an evicted unit would start again with a full budget). With
replicas (always on a cluster), a failover loses what the promoted replica had
not received: ``wait`` (:class:`ReplicaWait`) makes each charge return only
once that many replicas acknowledged it, and fail closed otherwise.
:meth:`RedisBudgetStore.durability_warnings` checks all of this, and recommends
``lazyfree-lazy-expire yes`` so that a whole generation expiring does not
stall Redis.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from stream_dp.budget import batch, charge_call, redis_marks
from stream_dp.budget.charge_call import LAYOUT_MISMATCH, Part, PartResult
from stream_dp.budget.keys import DEFAULT_GROUPS, KeyNames
from stream_dp.budget.layout import StorageLayout, legacy_layout
from stream_dp.budget.ledger import NamespaceLedger
from stream_dp.budget.policy import BudgetPolicy, NamespacePolicy
from stream_dp.budget.redis_calls import RedisCaller, Script
from stream_dp.budget.redis_nodes import Call, NodeRunner, ReplicaWait, is_cluster
from stream_dp.budget.redis_url import client_from_url
from stream_dp.budget.store import (
    ChargeOutcome,
    HorizonSpend,
    StoreLayoutMismatch,
    StoreOptions,
)
from stream_dp.metrics.budget import BudgetMetrics

log = logging.getLogger(__name__)

DEFAULT_SHARDS = 64
"""Hashes per namespace and generation (see ``RedisBudgetStore``)."""


DEFAULT_KEY_PREFIX = "dp:"
"""Where the worker's budget keys live (every key of every namespace starts with it)."""


class RedisBudgetStore:
    """Budget store backed by a real Redis server or Redis Cluster (the default backend).

    ``client`` (``redis.Redis`` or ``redis.cluster.RedisCluster``) must return
    bytes (``decode_responses=False``). ``retries`` and ``backoff_s`` govern
    retries after connection errors, timeouts, cluster redirections and
    failovers (waiting ``backoff_s * 2**attempt``); retrying a charge is safe
    because of its charge id. ``max_units_per_call`` splits very large
    batches into several script calls so one call does not block Redis for
    long: each chunk is atomic and idempotent on its own (its record is
    ``{charge_id}#{index}``), so a retry must use the same chunk size.
    ``shards`` is the number of hashes per namespace and generation (fewer:
    fewer Redis calls per batch; more: smaller hashes to expire at once).
    ``groups`` is the number of slot groups on a cluster (default
    ``DEFAULT_GROUPS``; must divide nothing, at most ``shards``); it is part of
    the key layout. ``wait``: replicas that must acknowledge each charge
    before it returns (``WAIT``); None or 0 replicas waits for none.
    ``clock_ms`` replaces the Redis server clock (tests only); by default
    every worker uses the server's ``TIME``, so worker clock skew cannot
    weaken the rule.
    """

    def __init__(
        self,
        client: Any,
        policy: BudgetPolicy,
        options: StoreOptions | None = None,
        *,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        retries: int = 2,
        backoff_s: float = 0.05,
        max_units_per_call: int = 20_000,
        shards: int = DEFAULT_SHARDS,
        groups: int | None = None,
        wait: ReplicaWait | None = None,
        metrics: BudgetMetrics | None = None,
        clock_ms: Callable[[], int] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if client.get_connection_kwargs().get("decode_responses"):
            raise ValueError("the Redis client must return bytes: create it with decode_responses=False")
        if max_units_per_call < 1:
            raise ValueError(f"max_units_per_call must be positive, got {max_units_per_call!r}")
        if groups is not None and not is_cluster(client):
            raise ValueError("slot groups are for a Redis Cluster client; on one Redis leave groups=None")
        if is_cluster(client) and groups is None:
            groups = min(DEFAULT_GROUPS, shards)
        self._client = client
        self._redis = RedisCaller(client, retries=retries, backoff_s=backoff_s, metrics=metrics, sleep=sleep)
        self._policy = policy
        self._options = options or StoreOptions()
        self._keys = KeyNames(key_prefix, groups)
        self._wait = wait
        self._max_units = max_units_per_call
        self._metrics = metrics
        self._clock_ms = clock_ms
        self._shards = shards
        self._groups = groups
        self._layouts = {
            name: self.layout_of(ns, self._options, shards, groups) for name, ns in policy.namespaces.items()
        }
        self._ledgers = {name: layout.ledger for name, layout in self._layouts.items()}
        self._scripts = {name: Script(name) for name in ("charge", "reset")}
        self._static_args = {name: self._namespace_args(ledger) for name, ledger in self._ledgers.items()}
        self._claimed: set[str] = set()

    @staticmethod
    def layout_of(
        policy: NamespacePolicy, options: StoreOptions, shards: int = DEFAULT_SHARDS, groups: int | None = None
    ) -> StorageLayout:
        """How this store lays out the units of ``policy``; raises ``ValueError`` when they cannot fit.

        A pure function, so that a configuration can be checked without a server.
        """
        return StorageLayout(NamespaceLedger(policy, options), shards, groups=groups)

    @classmethod
    def from_url(
        cls,
        url: str,
        policy: BudgetPolicy,
        options: StoreOptions | None = None,
        *,
        socket_timeout_s: float = 2.0,
        **kwargs: Any,
    ) -> RedisBudgetStore:
        """A store on a new client for ``url`` (``redis+cluster://`` for a cluster); redis-py's own retries are
        off (the store retries).

        ``socket_timeout_s`` must exceed the time of one batch script (about
        30 ms per 10k units with a few buckets each, a few times more for
        units holding a day of buckets) plus the WAIT timeout.
        """
        client = client_from_url(url, timeout_s=socket_timeout_s, own_retries=False, decode_responses=False)
        return cls(client, policy, options, **kwargs)

    @property
    def policy(self) -> BudgetPolicy:
        return self._policy

    @property
    def options(self) -> StoreOptions:
        return self._options

    @property
    def client(self) -> Any:
        return self._client

    @property
    def keys(self) -> KeyNames:
        return self._keys

    def close(self) -> None:
        self._client.close()

    # -- charging ---------------------------------------------------------

    def _namespace_args(self, ledger: NamespaceLedger) -> list[Any]:
        edges = self._metrics.fraction_buckets if self._metrics else ()
        args: list[Any] = []
        for plan in ledger.horizons:
            args += [plan.horizon_ms, plan.buckets, plan.bucket_ms, plan.limit_units]
            args += list(plan.threshold_units)
            args += list(ledger.edge_units(plan, edges))
        layout = self._layouts[ledger.policy.name]
        return [layout.generation_ms, len(ledger.horizons), ledger.levels, len(edges), *args]

    def charge(
        self, namespace: str, charge_id: str, units: Sequence[str], cost: float, event_time_ms: int,
        *, delta: float = 0.0,
    ) -> ChargeOutcome:
        ledger = self._ledger(namespace)
        if not isinstance(charge_id, str) or not charge_id:
            raise ValueError(
                f"charge_id must be a non-empty str such as 'query/window_start/partition', got {charge_id!r}"
            )
        time_ms = batch.event_time(event_time_ms)
        cost_units = ledger.policy.cost_units(cost, delta)
        unit_list = batch.as_unit_list(units)
        if not unit_list:
            return ChargeOutcome.empty()
        started = time.perf_counter()
        results, ledger = self._charge_parts(ledger, charge_id, unit_list, cost_units, time_ms)
        outcome = charge_call.combine(ledger, unit_list, results, time_ms)
        if self._metrics is not None:
            charge_call.record_metrics(self._metrics, ledger, outcome, results, time.perf_counter() - started)
        return outcome

    def _charge_parts(
        self, ledger: NamespaceLedger, charge_id: str, units: list[str], cost_units: tuple[int, ...], time_ms: int
    ) -> tuple[list[PartResult], NamespaceLedger]:
        namespace = ledger.policy.name
        layout = self._layouts[namespace]
        shards = layout.shard_of(units)
        if self._keys.clustered and namespace not in self._claimed:
            redis_marks.claim_layout(self._redis, self._keys, namespace, layout.fingerprint)
            self._claimed.add(namespace)
        parts = [
            self._part(ledger, charge_id, group, chunk, positions, units, shards, cost_units, time_ms)
            for group, chunk, positions in charge_call.plan_parts(units, shards, self._groups, self._max_units)
        ]
        if self._keys.clustered:
            ttl_ms = ledger.options.record_ttl_ms
            redis_marks.check_manifest(self._redis, self._keys, namespace, charge_id, parts, ttl_ms, self._wait)
        script = self._scripts["charge"]
        calls = [
            Call(script.sha, script.source, p.keys, p.args, self._keys.sync(namespace, p.group)) for p in parts
        ]
        runner = NodeRunner(self._client, calls, self._wait)
        replies = self._redis.call(namespace, "charge", runner.run_pending)
        if any(int(r[0]) == LAYOUT_MISMATCH for r in replies) and not self._keys.clustered:
            stored = next(r[2].decode() for r in replies if int(r[0]) == LAYOUT_MISMATCH)
            if self._adopt_legacy_layout(ledger, stored):
                return self._charge_parts(self._ledgers[namespace], charge_id, units, cost_units, time_ms)
        legacy = ledger.options.max_delay_ms != self._options.max_delay_ms
        fingerprint = self._layouts[namespace].fingerprint
        for reply, part in zip(replies, parts, strict=True):
            if int(reply[0]) < 0:
                charge_call.check_status(reply, charge_id, part, ledger, legacy, fingerprint)
        return [charge_call.decode_reply(r, p) for r, p in zip(replies, parts, strict=True)], ledger

    def _part(
        self, ledger: NamespaceLedger, charge_id: str, group: int, chunk: int, positions: np.ndarray,
        units: list[str], shards: np.ndarray, cost_units: tuple[int, ...], time_ms: int,
    ) -> Part:
        namespace = ledger.policy.name
        part_units = [units[i] for i in positions.tolist()]
        period_ms = ledger.policy.longest_horizon_ms
        period = time_ms // period_ms
        opts = ledger.options
        now_arg = "" if self._clock_ms is None else str(int(self._clock_ms()))
        top_args = [opts.top_capacity, repr(opts.top_min_fraction), (period + 2) * period_ms]
        order, args = charge_call.call_args(
            part_units, shards[positions], cost_units, time_ms, now_arg, ledger,
            self._keys.shard_prefix(namespace, group), top_args, self._layouts[namespace].fingerprint,
            self._static_args[namespace],
        )
        keys = [
            self._keys.record(namespace, charge_id, chunk, group),
            self._keys.top(namespace, period, group),
            self._keys.meta(namespace, group if self._keys.clustered else None),
        ]
        return Part(group, chunk, positions, part_units, order, keys, args)

    def _adopt_legacy_layout(self, ledger: NamespaceLedger, stored: str) -> bool:
        """Keep writing budgets stored before the delay followed the retention as they were (see legacy_layout)."""
        layout = legacy_layout(ledger, self._shards, stored)
        if layout is None:
            return False
        name = ledger.policy.name
        log.warning(
            "namespace %s: budgets in Redis were laid out for charges at most %d ms late; keeping that delay "
            "(backlogs older than it are refused) instead of %d ms",
            name, layout.ledger.options.max_delay_ms, ledger.options.max_delay_ms,
        )
        self._ledgers[name], self._layouts[name] = layout.ledger, layout
        self._static_args[name] = self._namespace_args(layout.ledger)
        return True

    # -- reading and admin ------------------------------------------------

    def _ledger(self, namespace: str) -> NamespaceLedger:
        try:
            return self._ledgers[namespace]
        except KeyError:
            self._policy.namespace(namespace)  # raises with the known names
            raise

    def _read_states(self, namespace: str, units: list[str]) -> list[dict[int, int]]:
        """Current states of ``units``, read from the generations around the store clock."""
        layout = self._stored_layout(namespace)
        shards = layout.shard_of(units).tolist()
        generation = layout.generation_of(self._now_ms(namespace))
        generations = (generation + 1, generation, generation - 1)

        def read() -> list[Any]:
            pipe = self._client.pipeline(transaction=False)
            for unit, shard in zip(units, shards, strict=True):
                for g in generations:
                    pipe.hget(self._keys.shard(namespace, g, shard), batch.encode_unit(unit))
            return pipe.execute()

        raw = self._redis.call(namespace, "read", read)
        states = []
        for k in range(len(units)):
            found = next(
                ((g, v) for g, v in zip(generations, raw[3 * k : 3 * k + 3], strict=True) if v is not None), None
            )
            states.append({} if found is None else layout.decode(found[1], found[0]))
        return states

    def spend(self, namespace: str, unit: str, now_ms: int) -> list[HorizonSpend]:
        ledger = self._ledger(namespace)
        time_ms = batch.event_time(now_ms)
        (state,) = self._read_states(namespace, batch.as_unit_list([unit]))
        return batch.spend_report(ledger, state, time_ms)

    def top(self, namespace: str, n: int, now_ms: int) -> list[tuple[str, float]]:
        ledger = self._ledger(namespace)
        if n < 1:
            raise ValueError(f"n must be a positive integer, got {n!r}")
        now_ms = batch.event_time(now_ms)
        period_ms = ledger.policy.longest_horizon_ms
        current = now_ms // period_ms
        fetch = min(self._options.top_capacity, 4 * n + 16)

        def read_candidates() -> list[Any]:
            # On a cluster each slot group keeps its own top set: the top n are among the groups' top n.
            pipe = self._client.pipeline(transaction=False)
            for group in range(self._groups or 1):
                for period in (current - 1, current, current + 1):
                    pipe.zrevrange(self._keys.top(namespace, period, group), 0, fetch - 1)
            return pipe.execute()

        parts = self._redis.call(namespace, "read", read_candidates)
        candidates = list(dict.fromkeys(batch.decode_unit(u) for part in parts for u in part))
        if not candidates:
            return []
        scored = []
        for unit, state in zip(candidates, self._read_states(namespace, candidates), strict=True):
            score = ledger.top_score(ledger.spent_units(state, now_ms))
            if score > 0:
                scored.append((unit, score))
        scored.sort(key=lambda item: (-item[1], item[0]))
        if self._keys.clustered:
            # Each group keeps top_capacity units; together they still track only that many.
            return scored[: min(n, self._options.top_capacity)]
        return scored[:n]

    def reset(self, namespace: str, unit: str) -> bool:
        ledger = self._ledger(namespace)
        layout = self._stored_layout(namespace)
        (unit,) = batch.as_unit_list([unit])
        shard = int(layout.shard_of([unit])[0])
        group = shard % self._groups if self._groups else 0
        period_ms = ledger.policy.longest_horizon_ms
        # No key is read from KEYS; on a cluster the group's layout mark routes the call to its slot.
        keys: list[Any] = [self._keys.meta(namespace, group)] if self._keys.clustered else []
        args: list[Any] = [
            "" if self._clock_ms is None else str(int(self._clock_ms())),
            self._keys.shard_prefix(namespace, group),
            layout.generation_ms,
            shard,
            batch.encode_unit(unit),
            period_ms,
            self._keys.top_prefix(namespace, group),
        ]
        removed = self._redis.call(
            namespace, "reset", lambda: self._redis.run_script(self._scripts["reset"], keys, args)
        )
        return bool(removed)

    def _stored_layout(self, namespace: str) -> StorageLayout:
        """The layout the namespace's budgets were written with (this store's if none yet)."""
        layout = self._layouts[namespace]
        stored = self._redis.call(namespace, "read", lambda: self._client.get(self._keys.meta(namespace)))
        if stored is None:
            return layout
        try:
            return layout.adopt(stored.decode())
        except ValueError as error:
            raise StoreLayoutMismatch(str(error)) from None

    def _now_ms(self, namespace: str) -> int:
        if self._clock_ms is not None:
            return int(self._clock_ms())
        return self._redis.server_time_ms(namespace)

    def durability_warnings(self) -> list[str]:
        """Server settings under which acknowledged charges could be lost (empty if none), on every master."""
        return self._redis.durability_warnings(self._wait.replicas if self._wait else 0)
