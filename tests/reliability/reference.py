"""The ground truth of a run: what a fault-free worker must have published for the same input.

The input topic is read back (so the truth covers exactly what the broker
holds, whatever the faults did to the producer) and run through one window
engine per query in a single batch, with the worker's own configuration and
contribution secret, then closed. Messages the worker dead-lettered as late
are left out: lateness depends on timing, everything else does not. Budgets
are charged in an in-memory store, window by window in event-time order with
the worker's charge ids, which is the order in which a unit's windows close
in its partition.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from stream_dp.budget import MemoryBudgetStore
from stream_dp.budget import policy_from_config
from stream_dp.config import PipelineConfig
from stream_dp.windows import RawBatch, RejectReason
from stream_dp.worker.assemble.runtimes import build_runtimes
from tests.reliability.topics import TopicRecord

CLOSE_EVERYTHING_MS = 10**12  # a clock this far ahead makes every partition idle and closes every window


@dataclass(frozen=True)
class ExpectedPartial:
    """What the partials topic must hold for one (query, window, input partition)."""

    query: str
    window_start_ms: int
    window_end_ms: int
    partition: int
    groups: list[tuple]
    count: list[int]
    sum: list[float]
    distinct_units: list[int]
    units: list[str]
    excluded: list[str]
    accepted_events: int
    kept_events: int  # after bounding, before exclusion

    @property
    def charge_id(self) -> str:
        return f"{self.query}/{self.window_start_ms}/{self.partition}"


@dataclass
class Reference:
    partials: dict[tuple[str, int, int], ExpectedPartial] = field(default_factory=dict)
    rejections: dict[tuple[str, int, int], str] = field(default_factory=dict)  # (query, partition, offset) -> reason
    windows: dict[str, set[int]] = field(default_factory=dict)  # query -> window starts with data
    charged_windows: dict[tuple[str, str], int] = field(default_factory=dict)  # (query, unit) -> windows charged
    namespace: dict[str, str] = field(default_factory=dict)
    cost: dict[str, float] = field(default_factory=dict)
    accepted: Counter = field(default_factory=Counter)  # query -> accepted events
    excluded_events: Counter = field(default_factory=Counter)  # query -> accepted events of excluded units

    def totals(self, query: str, window_start_ms: int) -> dict[tuple, tuple[int, float]]:
        """Per group: (count, sum) over the window's partials after exclusion."""
        out: dict[tuple, tuple[int, float]] = {}
        for (q, start, _), partial in self.partials.items():
            if q != query or start != window_start_ms:
                continue
            for group, count, total in zip(partial.groups, partial.count, partial.sum):
                c, s = out.get(group, (0, 0.0))
                out[group] = (c + count, s + total)
        return out


def compute_reference(
    config: PipelineConfig,
    secret: bytes,
    records: list[TopicRecord],
    partitions: int,
    late: dict[str, set[tuple[int, int]]],
) -> Reference:
    """``late``: per query, the (partition, offset) of messages the worker dead-lettered as late."""
    now = [int(time.time() * 1000)]
    runtimes = build_runtimes(config, secret=secret, clock_ms=lambda: now[0])
    store = MemoryBudgetStore(policy_from_config(config))
    reference = Reference()
    for runtime in runtimes:
        name = runtime.name
        reference.namespace[name] = runtime.namespace
        reference.cost[name] = runtime.cost
        skip = late.get(name, set())
        kept = [r for r in records if (r.partition, r.offset) not in skip]
        engine = runtime.engine
        engine.assign(range(partitions))
        engine.set_partition_count(partitions)
        now[0] = int(time.time() * 1000)
        result = engine.process(RawBatch(
            values=[r.value for r in kept],
            partitions=np.array([r.partition for r in kept], dtype=np.int32),
            offsets=np.array([r.offset for r in kept], dtype=np.int64),
            timestamps=np.array([r.timestamp for r in kept], dtype=np.int64),
            keys=[r.key for r in kept],
        ))
        for rejection in result.rejections:
            if rejection.reason != RejectReason.LATE:
                reference.rejections[(name, rejection.partition, rejection.offset)] = rejection.reason.value
        reference.accepted[name] += result.accepted
        now[0] += CLOSE_EVERYTHING_MS
        closed = list(result.partials) + engine.tick()
        for partial in sorted(closed, key=lambda p: (p.window_start_ms, p.partition)):
            outcome = store.charge(runtime.namespace, f"{name}/{partial.window_start_ms}/{partial.partition}",
                                   list(partial.units), runtime.cost, partial.window_end_ms, delta=runtime.delta)
            excluded = np.asarray(outcome.excluded, dtype=bool)
            totals = partial.aggregate(excluded if excluded.any() else None)
            per_unit = partial.unit_totals()
            for unit, is_excluded in zip(partial.units, excluded.tolist()):
                if not is_excluded:
                    key = (name, unit)
                    reference.charged_windows[key] = reference.charged_windows.get(key, 0) + 1
            reference.excluded_events[name] += int(per_unit.count[excluded].sum())
            reference.windows.setdefault(name, set()).add(partial.window_start_ms)
            reference.partials[(name, partial.window_start_ms, partial.partition)] = ExpectedPartial(
                query=name,
                window_start_ms=partial.window_start_ms,
                window_end_ms=partial.window_end_ms,
                partition=partial.partition,
                groups=[tuple(g) for g in totals.groups],
                count=totals.count.tolist(),
                sum=totals.sum.tolist(),
                distinct_units=totals.distinct_units.tolist(),
                units=list(partial.units),
                excluded=[u for u, x in zip(partial.units, excluded.tolist()) if x],
                accepted_events=partial.accepted_events,
                kept_events=int(per_unit.count.sum()),
            )
    return reference
