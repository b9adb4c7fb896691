"""One charge.lua call of a batch: its arguments, and its reply as a partial outcome (no I/O).

A batch is charged by one call per chunk of ``max_units_per_call`` units on one
Redis, and by one call per slot group and chunk on a Redis Cluster
(:mod:`stream_dp.budget.keys`). Each call is atomic and idempotent on its own:
its record (keyed by charge id, group and chunk) holds its decision and the
digest of its arguments. ``positions`` ties a call's units back to the
caller's batch, so the parts combine into one outcome in the caller's order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from stream_dp.budget import batch
from stream_dp.budget.ledger import NamespaceLedger
from stream_dp.budget.store import ChargeConflict, ChargeOutcome, ChargeOutOfRange, StoreLayoutMismatch
from stream_dp.metrics.budget import BudgetMetrics

LAYOUT_MISMATCH = -4


@dataclass
class Part:
    """The units of one script call: ``positions`` in the caller's batch, ``order`` sorting them by shard."""

    group: int
    chunk: int
    positions: np.ndarray
    units: list[str]
    order: np.ndarray
    keys: list[str]
    args: list[Any]


def plan_parts(
    units: list[str], shards: np.ndarray, groups: int | None, max_units: int
) -> list[tuple[int, int, np.ndarray]]:
    """(group, chunk, positions) of every call: chunks of ``max_units`` in input order, per slot group on a cluster."""
    if groups is None:
        split = [(0, np.arange(len(units)))]
    else:
        from stream_dp.budget.keys import split_by_group

        split = split_by_group(shards, groups)
    return [
        (group, chunk, positions[first : first + max_units])
        for group, positions in split
        for chunk, first in enumerate(range(0, len(positions), max_units))
    ]


def call_args(
    part_units: list[str],
    part_shards: np.ndarray,
    cost_units: tuple[int, ...],
    time_ms: int,
    now_arg: str,
    ledger: NamespaceLedger,
    shard_prefix: str,
    top_args: list[Any],
    fingerprint: str,
    static: list[Any],
) -> tuple[np.ndarray, list[Any]]:
    """charge.lua's ARGV for one call, and the order (by shard) its units are sent in."""
    # The script takes the units sorted by shard, so it reads and writes each
    # shard hash once; positions in its reply refer to that order.
    order = np.argsort(part_shards, kind="stable")
    sorted_blob, sorted_lengths = batch.pack_units([part_units[i] for i in order.tolist()])
    digest = batch.charge_digest(cost_units, time_ms, sorted_blob, sorted_lengths, order.astype("<u4").tobytes())
    group_shards, group_sizes = np.unique(part_shards[order], return_counts=True)
    opts = ledger.options
    args: list[Any] = [
        now_arg,
        batch.cost_argument(cost_units),
        time_ms,
        opts.max_delay_ms,
        opts.max_lead_ms,
        opts.record_ttl_ms,
        digest,
        shard_prefix,
        sorted_blob,
        sorted_lengths,
        group_shards.astype("<u2").tobytes(),
        group_sizes.astype("<u4").tobytes(),
        len(part_units),
    ]
    return order, args + static[:4] + top_args + [fingerprint] + static[4:]


def check_status(
    reply: list[Any], charge_id: str, part: Part, ledger: NamespaceLedger, legacy: bool, fingerprint: str
) -> None:
    """Raise the ``BudgetError`` a failed call stands for (status < 0; -4 after any legacy adoption was tried)."""
    status, now_ms = int(reply[0]), int(reply[1])
    opts = ledger.options
    time_ms = int(part.args[2])
    namespace = ledger.policy.name
    if status == -1:
        raise ChargeOutOfRange(
            f"charge {charge_id!r}: event time {time_ms} is more than max_delay_ms={opts.max_delay_ms} behind "
            f"the store clock ({now_ms}); its buckets may be forgotten. "
            + (
                f"Namespace {namespace}'s budgets were laid out for that delay by an earlier version; "
                "buckets older than it may be pruned, so it is kept (see docs/concepts/how-it-works.md, Budget)"
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
    if status == LAYOUT_MISMATCH:
        from stream_dp.budget.layout import fingerprint_groups, key_layout_mismatch

        stored = reply[2].decode()
        if fingerprint_groups(stored) != fingerprint_groups(fingerprint):
            raise StoreLayoutMismatch(key_layout_mismatch(namespace, stored, fingerprint))
        raise StoreLayoutMismatch(
            f"namespace {namespace}: budgets in Redis were written with layout {stored!r}, this "
            f"store uses {fingerprint!r} (v1|generation_ms|shards|horizon_ms:buckets). Every worker must "
            "use the same StoreOptions, shards and horizons; changing them needs a new key prefix"
        )
    if status == -3:
        where = f"chunk {part.chunk}" + (f", slot group {part.group}" if part.group else "")
        raise ChargeConflict(
            f"charge id {charge_id!r} ({where}) was already charged with different units, cost or "
            "event time; a retry must repeat the original call, a new window needs a new charge id"
        )


@dataclass
class PartResult:
    """A successful call's decision, positions already in the caller's batch."""

    now_ms: int
    replayed: bool
    charged: int
    excluded_positions: np.ndarray
    refusals: list[int]
    transitions: np.ndarray
    histogram: list[int] | None
    sums: list[int] | None


def decode_reply(reply: list[Any], part: Part) -> PartResult:
    replayed = int(reply[0]) == 1
    local = np.frombuffer(reply[3], dtype="<u4")
    transitions = np.frombuffer(reply[5] if replayed else reply[7], dtype=batch.ALERT_DTYPE).copy()
    transitions["position"] = part.positions[part.order[transitions["position"]]]
    return PartResult(
        now_ms=int(reply[1]),
        replayed=replayed,
        charged=int(reply[2]),
        excluded_positions=part.positions[part.order[local]],
        refusals=[int(x) for x in reply[4]],
        transitions=transitions,
        histogram=None if replayed else [int(x) for x in reply[5]],
        sums=None if replayed else [int(x) for x in reply[6]],
    )


def combine(ledger: NamespaceLedger, units: list[str], results: list[PartResult], time_ms: int) -> ChargeOutcome:
    """One outcome for the batch, in the caller's order (alerts too)."""
    excluded = np.zeros(len(units), dtype=bool)
    for r in results:
        excluded[r.excluded_positions] = True
    transitions = np.concatenate([r.transitions for r in results]) if results else np.zeros(0, batch.ALERT_DTYPE)
    transitions = transitions[np.argsort(transitions["position"], kind="stable")]
    refusals = [sum(r.refusals[i] for r in results) for i in range(len(ledger.horizons))]
    return ChargeOutcome(
        excluded=excluded,
        charged=sum(r.charged for r in results),
        alerts=batch.alert_records(ledger, units, transitions, time_ms),
        replayed=all(r.replayed for r in results),
        excluded_by_horizon={p.label: c for p, c in zip(ledger.horizons, refusals, strict=True)},
    )


def record_metrics(
    metrics: BudgetMetrics, ledger: NamespaceLedger, outcome: ChargeOutcome, results: list[PartResult], elapsed: float
) -> None:
    """Count a charge made of ``results`` (its replayed parts are not counted again)."""
    namespace = ledger.policy.name
    if outcome.replayed:
        metrics.record_replay(namespace, elapsed)
    else:
        fresh = [r for r in results if not r.replayed]
        refusals = {p.label: sum(r.refusals[i] for r in fresh) for i, p in enumerate(ledger.horizons)}
        metrics.record_charge(
            namespace,
            charged=outcome.charged,
            excluded=int(outcome.excluded.sum()),
            refusals=refusals,
            latency_s=elapsed,
        )
    for r in results:
        if r.replayed or r.histogram is None or r.sums is None:
            continue
        metrics.enter_levels(namespace, batch.level_entries(ledger, r.transitions))
        width = len(metrics.fraction_buckets) + 1
        hist = np.asarray(r.histogram, dtype=np.int64).reshape(len(ledger.horizons), width)
        for i, plan in enumerate(ledger.horizons):
            metrics.spend_fraction.observe_counts((namespace, plan.label), hist[i], r.sums[i] / plan.limit_units)
    metrics.expire_levels(max(r.now_ms for r in results))
