"""The Redis budget store: packed unit states in sharded hashes, one Lua script per batch.

Keys (``prefix`` defaults to ``dp:``; namespaces contain no ``:``):

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

Redis must keep what it acknowledged: run it with ``appendonly yes`` and
``appendfsync always`` (with ``everysec`` a crash of Redis can forget up to a
second of charges that were already released) and ``maxmemory-policy
noeviction`` (an evicted unit would start again with a full budget).
:meth:`RedisBudgetStore.durability_warnings` checks both, and recommends
``lazyfree-lazy-expire yes`` so that a whole generation expiring does not
stall Redis. The batch script touches many keys, so Redis Cluster is not
supported.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from stream_dp.budget import batch
from stream_dp.budget.layout import StorageLayout, legacy_layout
from stream_dp.budget.ledger import NamespaceLedger
from stream_dp.budget.policy import BudgetPolicy, NamespacePolicy
from stream_dp.budget.redis_calls import RedisCaller, Script
from stream_dp.budget.store import (
    ChargeConflict,
    ChargeOutcome,
    ChargeOutOfRange,
    HorizonSpend,
    StoreLayoutMismatch,
    StoreOptions,
)
from stream_dp.metrics.budget import BudgetMetrics

log = logging.getLogger(__name__)

DEFAULT_SHARDS = 64
"""Hashes per namespace and generation (see ``RedisBudgetStore``)."""


class RedisBudgetStore:
    """Budget store backed by a real Redis server (the default backend).

    ``client`` must return bytes (``decode_responses=False``). ``retries`` and
    ``backoff_s`` govern retries after connection errors and timeouts (waiting
    ``backoff_s * 2**attempt``); retrying a charge is safe because of its
    charge id. ``max_units_per_call`` splits very large batches into several
    script calls so one call does not block Redis for long: each chunk is
    atomic and idempotent on its own (its record is ``{charge_id}#{index}``),
    so a retry must use the same chunk size. ``shards`` is the number of
    hashes per namespace and generation (fewer: fewer Redis calls per batch;
    more: smaller hashes to expire at once). ``clock_ms`` replaces the Redis
    server clock (tests only); by default every worker uses the server's
    ``TIME``, so worker clock skew cannot weaken the rule.
    """

    def __init__(
        self,
        client: redis.Redis,
        policy: BudgetPolicy,
        options: StoreOptions | None = None,
        *,
        key_prefix: str = "dp:",
        retries: int = 2,
        backoff_s: float = 0.05,
        max_units_per_call: int = 20_000,
        shards: int = DEFAULT_SHARDS,
        metrics: BudgetMetrics | None = None,
        clock_ms: Callable[[], int] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if client.connection_pool.connection_kwargs.get("decode_responses"):
            raise ValueError("the Redis client must return bytes: create it with decode_responses=False")
        if max_units_per_call < 1:
            raise ValueError(f"max_units_per_call must be positive, got {max_units_per_call!r}")
        self._client = client
        self._redis = RedisCaller(client, retries=retries, backoff_s=backoff_s, metrics=metrics, sleep=sleep)
        self._policy = policy
        self._options = options or StoreOptions()
        self._prefix = key_prefix
        self._max_units = max_units_per_call
        self._metrics = metrics
        self._clock_ms = clock_ms
        self._shards = shards
        self._layouts = {name: self.layout_of(ns, self._options, shards) for name, ns in policy.namespaces.items()}
        self._ledgers = {name: layout.ledger for name, layout in self._layouts.items()}
        self._scripts = {name: Script(name) for name in ("charge", "reset")}
        self._static_args = {name: self._namespace_args(ledger) for name, ledger in self._ledgers.items()}

    @staticmethod
    def layout_of(policy: NamespacePolicy, options: StoreOptions, shards: int = DEFAULT_SHARDS) -> StorageLayout:
        """How this store lays out the units of ``policy``; raises ``ValueError`` when they cannot fit.

        A pure function, so that a configuration can be checked without a server.
        """
        return StorageLayout(NamespaceLedger(policy, options), shards)

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
        """A store on a new client for ``url``; redis-py's own retries are off (the store retries).

        ``socket_timeout_s`` must exceed the time of one batch script: about
        30 ms per 10k units with a few buckets each, a few times more for
        units holding a day of buckets.
        """
        client = redis.Redis.from_url(
            url,
            socket_timeout=socket_timeout_s,
            socket_connect_timeout=socket_timeout_s,
            retry=Retry(NoBackoff(), 0),
            decode_responses=False,
        )
        return cls(client, policy, options, **kwargs)

    @property
    def policy(self) -> BudgetPolicy:
        return self._policy

    @property
    def options(self) -> StoreOptions:
        return self._options

    @property
    def client(self) -> redis.Redis:
        return self._client

    def close(self) -> None:
        self._client.close()

    # -- keys -------------------------------------------------------------

    def _shard_prefix(self, namespace: str) -> str:
        return f"{self._prefix}s:{namespace}:"

    def _shard_key(self, namespace: str, generation: int, shard: int) -> str:
        return f"{self._shard_prefix(namespace)}{generation}:{shard}"

    def _meta_key(self, namespace: str) -> str:
        return f"{self._prefix}m:{namespace}"

    def _record_key(self, namespace: str, charge_id: str, chunk: int) -> str:
        suffix = f"#{chunk}" if chunk else ""
        return f"{self._prefix}c:{namespace}:{charge_id}{suffix}"

    def _top_key(self, namespace: str, period: int) -> str:
        return f"{self._prefix}t:{namespace}:{period}"

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
        parts = []
        for chunk, first in enumerate(range(0, len(unit_list), self._max_units)):
            chunk_units = unit_list[first : first + self._max_units]
            parts.append(self._charge_chunk(ledger, charge_id, chunk, chunk_units, cost_units, time_ms))
        outcome = batch.combine_chunks(parts)
        if self._metrics is not None:
            elapsed = time.perf_counter() - started
            if outcome.replayed:
                self._metrics.record_replay(namespace, elapsed)
            else:
                refusals = {ledger.horizons[i].label: c for i, c in enumerate(batch.refusal_counts(parts))}
                self._metrics.record_charge(
                    namespace,
                    charged=outcome.charged,
                    excluded=int(outcome.excluded.sum()),
                    refusals=refusals,
                    latency_s=elapsed,
                )
        return outcome

    def _charge_chunk(
        self,
        ledger: NamespaceLedger,
        charge_id: str,
        chunk: int,
        units: list[str],
        cost_units: tuple[int, ...],
        time_ms: int,
    ) -> batch.ChunkResult:
        namespace = ledger.policy.name
        # The script takes the units sorted by shard, so it reads and writes
        # each shard hash once; positions in its reply refer to that order.
        shards = self._layouts[namespace].shard_of(units)
        order = np.argsort(shards, kind="stable")
        sorted_blob, sorted_lengths = batch.pack_units([units[i] for i in order.tolist()])
        digest = batch.charge_digest(cost_units, time_ms, sorted_blob, sorted_lengths, order.astype("<u4").tobytes())
        group_shards, group_sizes = np.unique(shards[order], return_counts=True)
        period_ms = ledger.policy.longest_horizon_ms
        period = time_ms // period_ms
        now_arg = "" if self._clock_ms is None else str(int(self._clock_ms()))
        opts = ledger.options
        layout = self._layouts[namespace]
        keys = [
            self._record_key(namespace, charge_id, chunk),
            self._top_key(namespace, period),
            self._meta_key(namespace),
        ]
        args: list[Any] = [
            now_arg,
            batch.cost_argument(cost_units),
            time_ms,
            opts.max_delay_ms,
            opts.max_lead_ms,
            opts.record_ttl_ms,
            digest,
            self._shard_prefix(namespace),
            sorted_blob,
            sorted_lengths,
            group_shards.astype("<u2").tobytes(),
            group_sizes.astype("<u4").tobytes(),
            len(units),
        ]
        static = self._static_args[namespace]
        top_args = [opts.top_capacity, repr(opts.top_min_fraction), (period + 2) * period_ms]
        args = args + static[:4] + top_args + [layout.fingerprint] + static[4:]
        reply = self._redis.call(
            namespace, "charge", lambda: self._redis.run_script(self._scripts["charge"], keys, args)
        )
        status, now_ms = int(reply[0]), int(reply[1])
        if status == -4 and self._adopt_legacy_layout(ledger, reply[2].decode()):
            return self._charge_chunk(self._ledgers[namespace], charge_id, chunk, units, cost_units, time_ms)
        if status == -1:
            legacy = opts.max_delay_ms != self._options.max_delay_ms
            raise ChargeOutOfRange(
                f"charge {charge_id!r}: event time {time_ms} is more than max_delay_ms={opts.max_delay_ms} behind "
                f"the store clock ({now_ms}); its buckets may be forgotten. "
                + (
                    f"Namespace {namespace}'s budgets were laid out for that delay by an earlier version; "
                    "buckets older than it may be pruned, so it is kept (see README, budget store)"
                    if legacy
                    else "Raise StoreOptions.max_delay_ms (the worker: STREAM_DP_INPUT_RETENTION_MS) if windows "
                    "close this late"
                )
            )
        if status == -2:
            raise ChargeOutOfRange(
                f"charge {charge_id!r}: event time {time_ms} is more than max_lead_ms={opts.max_lead_ms} ahead of "
                f"the store clock ({now_ms}); check producer clocks or raise StoreOptions.max_lead_ms"
            )
        if status == -4:
            raise StoreLayoutMismatch(
                f"namespace {namespace}: budgets in Redis were written with layout {reply[2].decode()!r}, this "
                f"store uses {layout.fingerprint!r} (v1|generation_ms|shards|horizon_ms:buckets). Every worker must "
                "use the same StoreOptions, shards and horizons; changing them needs a new key prefix"
            )
        if status == -3:
            raise ChargeConflict(
                f"charge id {charge_id!r} (chunk {chunk}) was already charged with different units, cost or "
                "event time; a retry must repeat the original call, a new window needs a new charge id"
            )
        replayed = status == 1
        excluded = np.zeros(len(units), dtype=bool)
        excluded[order[np.frombuffer(reply[3], dtype="<u4")]] = True
        refusals = [int(x) for x in reply[4]]
        transitions = np.frombuffer(reply[5] if replayed else reply[7], dtype=batch.ALERT_DTYPE).copy()
        transitions["position"] = order[transitions["position"]]
        transitions = transitions[np.argsort(transitions["position"], kind="stable")]
        alerts = batch.alert_records(ledger, units, transitions, time_ms)
        if self._metrics is not None:
            if not replayed:
                self._metrics.enter_levels(namespace, batch.level_entries(ledger, transitions))
                width = len(self._metrics.fraction_buckets) + 1
                hist = np.asarray(reply[5], dtype=np.int64).reshape(len(ledger.horizons), width)
                for i, plan in enumerate(ledger.horizons):
                    total = int(reply[6][i]) / plan.limit_units
                    self._metrics.spend_fraction.observe_counts((namespace, plan.label), hist[i], total)
            self._metrics.expire_levels(now_ms)
        outcome = ChargeOutcome(
            excluded=excluded,
            charged=int(reply[2]),
            alerts=alerts,
            replayed=replayed,
            excluded_by_horizon={p.label: c for p, c in zip(ledger.horizons, refusals, strict=True)},
        )
        return batch.ChunkResult(outcome, refusals)

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
                    pipe.hget(self._shard_key(namespace, g, shard), batch.encode_unit(unit))
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
            pipe = self._client.pipeline(transaction=False)
            for period in (current - 1, current, current + 1):
                pipe.zrevrange(self._top_key(namespace, period), 0, fetch - 1)
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
        return scored[:n]

    def reset(self, namespace: str, unit: str) -> bool:
        ledger = self._ledger(namespace)
        layout = self._stored_layout(namespace)
        (unit,) = batch.as_unit_list([unit])
        shard = int(layout.shard_of([unit])[0])
        period_ms = ledger.policy.longest_horizon_ms
        keys: list[Any] = []
        args: list[Any] = [
            "" if self._clock_ms is None else str(int(self._clock_ms())),
            self._shard_prefix(namespace),
            layout.generation_ms,
            shard,
            batch.encode_unit(unit),
            period_ms,
            f"{self._prefix}t:{namespace}:",
        ]
        removed = self._redis.call(
            namespace, "reset", lambda: self._redis.run_script(self._scripts["reset"], keys, args)
        )
        return bool(removed)

    def _stored_layout(self, namespace: str) -> StorageLayout:
        """The layout the namespace's budgets were written with (this store's if none yet)."""
        layout = self._layouts[namespace]
        stored = self._redis.call(namespace, "read", lambda: self._client.get(self._meta_key(namespace)))
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
        """Server settings under which acknowledged charges could be lost (empty if none)."""
        return self._redis.durability_warnings()
