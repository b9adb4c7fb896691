"""A continual query's closed windows through the emitter, on the real Redis journal, budget store and register.

A unit in more windows of a period than the query allows is charged once and
its events leave the published partials after its W-th window; an outage of
the register holds the windows, and the retry publishes what an uninterrupted
round would have.
"""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from stream_dp.config import parse_config
from stream_dp.metrics.worker import WorkerMetrics
from stream_dp.windows.partial import WindowPartial
from stream_dp.worker.assemble.runtimes import build_runtimes
from stream_dp.worker.ingest.closed_windows import Emitter, HeldPartial, window_charge
from stream_dp.worker.query.runtime import ContinualCharging
from stream_dp.worker.store.ledger import LedgerUnavailable

from tests.worker._periods import Backend, backends_fixture

WINDOW_MS = 60_000
PERIOD_MS = 10 * WINDOW_MS
COST = 1.0
W = 2

backends = backends_fixture(["redis", "redis-cluster"])


def visits_runtime(**options):
    config = parse_config({
        "namespaces": {"users": {"budgets": [{"horizon": "1d", "epsilon": 10.0}]}},
        "queries": [{
            "name": "visits", "input_topic": "in", "output_topic": "out",
            "privacy_unit": {"namespace": "users", "field": "user_id"}, "timestamp_field": "ts",
            "window": {"size": "1m"}, "group_by": ["page"], "groups": {"public": ["a", "b"]},
            "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 3}, "aggregations": {"count": {}},
            "epsilon": 1.0, **options,
        }],
    })
    (runtime,) = build_runtimes(config, secret=b"k" * 32, clock_ms=lambda: 0)
    return runtime


def continual_runtime(w: int = W):
    runtime = visits_runtime()
    # The configuration's continual block is turned into these by the worker's builder; here by hand.
    return dataclasses.replace(runtime, cost=COST, continual=ContinualCharging(PERIOD_MS, 0, WINDOW_MS, w))


def partial(start_ms: int, contributions: list[tuple[str, str, int]], partition: int = 0) -> WindowPartial:
    """A closed window's partial: (unit, page, events) per contributing pair."""
    units = sorted({u for u, _, _ in contributions})
    groups = sorted({(p,) for _, p, _ in contributions})
    return WindowPartial(
        window_start_ms=start_ms, window_end_ms=start_ms + WINDOW_MS, partition=partition, first_offset=0,
        last_offset=len(contributions), accepted_events=sum(n for _, _, n in contributions), units=units, groups=groups,
        pair_unit=np.array([units.index(u) for u, _, _ in contributions], dtype=np.int32),
        pair_group=np.array([groups.index((p,)) for _, p, _ in contributions], dtype=np.int32),
        pair_count=np.array([n for _, _, n in contributions], dtype=np.int64),
        pair_sum=np.zeros(len(contributions), dtype=np.float64),
    )


class Published:
    """Stands in for both the partials topic (``PartialsOut.send``) and the producer of alerts."""

    def __init__(self) -> None:
        self.partials: list = []

    async def send(self, message, *args, **kwargs):
        if args or kwargs:  # an alert record
            future = asyncio.get_running_loop().create_future()
            future.set_result(None)
            return future
        self.partials.append(message)
        return []


class DownOnce:
    """The period register, down for one call."""

    def __init__(self, inner) -> None:
        self.inner, self.down = inner, True

    def classify(self, window, units):
        if self.down:
            self.down = False
            raise LedgerUnavailable("period register unavailable (test)")
        return self.inner.classify(window, units)

    def register(self, window, units):
        return self.inner.register(window, units)


def emitter(backend: Backend, runtime, published: Published, registry: CollectorRegistry, periods) -> Emitter:
    return Emitter([runtime], published, backend.budget, backend.journal, WorkerMetrics(registry), published,
                   alerts_topic="alerts", partition_count=lambda topic: 1, retry_backoff_s=0.0,
                   retry_backoff_max_s=0.0, periods=periods)


def page_counts(message) -> dict[str, int]:
    return {group[0]: int(count) for group, count in zip(message.groups, message.count, strict=True)}


@pytest.mark.parametrize("outage", [False, True], ids=["steady", "register-outage"])
def test_over_the_cap_a_units_events_leave_the_published_partials(backends, outage):
    b, now = backends.make(), backends.clock.now_ms
    runtime, registry, published = continual_runtime(), CollectorRegistry(), Published()
    first = now // PERIOD_MS * PERIOD_MS - 2 * PERIOD_MS
    windows = [partial(first + i * WINDOW_MS, [("heavy", "a", 3), (f"light-{i}", "b", 1)]) for i in range(W + 3)]
    windows.append(partial(first + PERIOD_MS, [("heavy", "a", 2)]))  # the next period
    emit = emitter(b, runtime, published, registry, DownOnce(b.periods) if outage else b.periods)

    async def scenario():
        emit.held = [HeldPartial(runtime, p, now) for p in windows]
        rounds = 0
        while emit.held:
            await emit.emit()
            rounds += 1
        return rounds

    rounds = asyncio.run(scenario())
    assert rounds == (2 if outage else 1)
    by_window = {m.window_start_ms: m for m in published.partials}
    assert sorted(by_window) == [p.window_start_ms for p in windows]  # each published once
    counts = [page_counts(by_window[p.window_start_ms]) for p in windows]
    assert counts == [{"a": 3, "b": 1}] * W + [{"b": 1}] * 3 + [{"a": 2}]
    assert [by_window[p.window_start_ms].units_excluded for p in windows] == [0] * W + [1] * 3 + [0]
    (day,) = b.budget.spend("users", "heavy", now)
    assert day.spent == pytest.approx(2 * COST)  # one charge per period
    labels = {"query": "visits"}
    assert registry.get_sample_value("stream_dp_window_units_total", {**labels, "outcome": "over_period_cap"}) == 3
    assert registry.get_sample_value("stream_dp_window_units_total", {**labels, "outcome": "excluded"}) == 0
    assert registry.get_sample_value("stream_dp_window_units_total", {**labels, "outcome": "charged"}) == 2 * W + 3 + 1
    # The register's key lives as long as the period's charges can come.
    key = b.periods.key(window_charge(runtime, windows[0]).continual)
    assert b.budget.options.record_ttl_ms + first + PERIOD_MS == backends.client.pexpiretime(key)



def test_a_backlog_is_charged_in_bounded_rounds_and_a_window_closing_meanwhile_goes_next(backends):
    """A round takes the oldest MAX_WINDOWS_PER_ROUND held windows; one of another topic that closes while a
    backlog is charged waits one round, not the whole backlog (it once waited minutes behind one)."""
    from stream_dp.worker.ingest.closed_windows import MAX_WINDOWS_PER_ROUND

    b, now = backends.make(), backends.clock.now_ms
    runtime, registry, published = continual_runtime(), CollectorRegistry(), Published()
    runtime = dataclasses.replace(runtime, continual=None)  # per-window charges
    first = (now - (2 * MAX_WINDOWS_PER_ROUND + 20) * WINDOW_MS) // WINDOW_MS * WINDOW_MS  # all in the past
    backlog = [partial(first + (10 + i) * WINDOW_MS, [(f"u{i}", "a", 1)]) for i in range(2 * MAX_WINDOWS_PER_ROUND + 5)]
    earlier = partial(first, [("late-topic", "b", 1)])
    emit = emitter(b, runtime, published, registry, b.periods)

    async def scenario():
        emit.held = [HeldPartial(runtime, p, now) for p in backlog]
        await emit.emit()
        assert len(published.partials) == MAX_WINDOWS_PER_ROUND
        emit.held.append(HeldPartial(runtime, earlier, now))  # closes while the backlog is charged
        await emit.emit()
        assert published.partials[MAX_WINDOWS_PER_ROUND].window_start_ms == earlier.window_start_ms
        while emit.held:
            await emit.emit()

    asyncio.run(scenario())
    starts = [m.window_start_ms for m in published.partials]
    assert sorted(starts) == sorted(p.window_start_ms for p in [*backlog, earlier])  # each once
    assert starts[:MAX_WINDOWS_PER_ROUND] == [p.window_start_ms for p in backlog[:MAX_WINDOWS_PER_ROUND]]


def test_a_query_restarted_with_other_settings_charges_its_units_again(backends):
    """Charged at epsilon 1 for W = 1, then restarted with epsilon 4 and W = 4 within the period: the unit pays
    the new period's loss at its next window and counts in 4 windows from there."""
    b, now = backends.make(), backends.clock.now_ms
    first = now // PERIOD_MS * PERIOD_MS - 2 * PERIOD_MS
    before = visits_runtime(continual={"period": "10m", "max_windows_per_unit": 1})
    after = visits_runtime(epsilon=4.0, continual={"period": "10m", "max_windows_per_unit": 4})
    published = Published()

    async def scenario():
        for runtime, windows in ((before, range(1)), (after, range(1, 7))):
            emit = emitter(b, runtime, published, CollectorRegistry(), b.periods)
            emit.held = [HeldPartial(runtime, partial(first + i * WINDOW_MS, [("heavy", "a", 3)]), now)
                         for i in windows]
            while emit.held:
                await emit.emit()

    asyncio.run(scenario())
    assert [page_counts(m) for m in published.partials] == [{"a": 3}] * 5 + [{}] * 2
    (day,) = b.budget.spend("users", "heavy", now)
    assert day.spent == pytest.approx(before.cost + after.cost) and after.cost == pytest.approx(4.0)
