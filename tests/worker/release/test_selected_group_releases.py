"""Windows of privately selected groups (``groups: {select: {delta}}``) into which a producer made up many groups.

Every group of a window is a candidate, and nothing at ingest caps their number: one producer can send
events of any number of made-up groups, each from one made-up unit. Selection drops them, but the
release must not pay for them: a vector or sample-and-aggregate window of more groups than its plan's
``max_groups`` used to fail (and failed again on every restart), the quantiles of three kept groups
among 10,000 candidates took a dense histogram of all of them, and the user function ran on the blocks
of dropped groups. Each release here is built by ``build_release``, as the release stage builds it, or
goes through the release stage itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from prometheus_client import CollectorRegistry

from stream_dp.config import parse_config
from stream_dp.dp import ContributionBounds, OpenDPNoise
from stream_dp.dp.histogram import SparseHistogram
from stream_dp.dp.plan import ReleasePlan
from stream_dp.dp.sample_aggregate import SampleAggregatePlan
from stream_dp.dp.vectors import VectorPlan
from stream_dp.windows.partial import BlockValues
from stream_dp.worker.assemble.runtimes import build_runtimes
from stream_dp.worker.combine.combiner import CombinedWindow
from stream_dp.worker.release import draw as release_draw
from stream_dp.worker.release.build import build_release
from stream_dp.worker.release.entry import decode_entry, encode_entry
from stream_dp.worker.release.stage import ReleaseStage, _Unpublished
from stream_dp.worker.store.ledger import MemoryReleaseLedger
from tests.worker._offline_stage import offline_stage

SECRET = b"test-secret-0123456789abcdef"
START, END = 60_000, 120_000
#: The plans' ``max_groups`` here. Production plans are built for ``VectorPlan.build``'s and
#: ``SampleAggregatePlan.build``'s default, 1,000,000 groups (``ReleasePlan.build``'s too); the tests
#: rebuild the same plans for fewer, so that a window of ``max_groups + 1`` groups stays small.
MAX_GROUPS = 40
KEPT_UNITS = 200  # per kept group: far above any selection threshold below
# 1e-9: a one-unit group passes selection with probability about 1e-9 a window; the tests' few
# thousand made-up groups all fail it but once in about 10^5 runs
SELECT = {"select": {"delta": 1e-9}}


def _runtime(aggregations: dict, *, groups: dict | None = None, mechanism: str = "laplace", delta: float = 0.0,
             l0: int = 1, linf: int = 5) -> Any:
    query = {
        "name": "probe", "input_topic": "in", "output_topic": "out",
        "privacy_unit": {"namespace": "users", "field": "user_id"}, "timestamp_field": "ts",
        "window": {"size": "1m"}, "group_by": ["page"], "groups": groups or SELECT,
        "bounds": {"max_groups_per_unit": l0, "max_events_per_group": linf},
        "aggregations": aggregations, "mechanism": mechanism, "epsilon": 10.0,
        **({"delta": delta} if delta else {}),
    }
    config = parse_config({"namespaces": {"users": {"budgets": [{"horizon": "1h", "epsilon": 1000.0, "delta": 1e-3}]}},
                           "queries": [query]})
    (runtime,) = build_runtimes(config, secret=SECRET, clock_ms=lambda: 0)
    return runtime


def _with_max_groups(runtime: Any, max_groups: int) -> Any:
    """The runtime with its plan's parts rebuilt as they are, but certified for ``max_groups`` groups."""
    plan = runtime.plan
    bounds = ContributionBounds(runtime.config.bounds.max_groups_per_unit, runtime.config.bounds.max_events_per_group)
    parts: dict[str, Any] = {}
    if plan.vector is not None:
        v = plan.vector
        parts["vector"] = VectorPlan.build(kind=v.features.kind, fields=v.fields, clip_norm=v.features.clip_norm,
                                           rho=v.noise.cost, delta=v.loss.delta, bounds=bounds, max_groups=max_groups)
    if plan.sample_aggregate is not None:
        sa = plan.sample_aggregate
        parts["sample_aggregate"] = SampleAggregatePlan.build(
            function=sa.function, blocks=sa.blocks, lo=sa.lo, hi=sa.hi, kind=sa.noise.kind, budget=sa.noise.cost,
            delta=sa.loss.delta, bounds=bounds, max_groups=max_groups)
    if plan.base is not None and plan.base.sum_noise is not None:
        base = plan.base
        parts["levels"] = (ReleasePlan.build(
            mechanism=base.mechanism, epsilon=base.requested["epsilon"], bounds=base.bounds, clip=base.clip,
            aggregations=base.aggregations, selection_delta=base.requested["selection_delta"],
            max_groups=max_groups),)
    runtime.plan = dataclasses.replace(plan, **parts)
    return runtime


def _window(units: list[int], *, counts: list[int] | None = None, **columns: Any) -> CombinedWindow:
    """Groups ``p0``, ``p1``, ... with these distinct units (and as many events, unless ``counts``)."""
    distinct = np.asarray(units, dtype=np.int64)
    return CombinedWindow(
        query="probe", window_start_ms=START, window_end_ms=END, home=0,
        groups=[(f"p{i}",) for i in range(len(units))],
        count=np.asarray(units if counts is None else counts, dtype=np.int64), sum=columns.pop("sum", None),
        distinct_units=distinct, partitions_missing=[], units_charged=int(distinct.sum()), units_excluded=0,
        closed_at_ms=END, source_offsets=[(0, 7)], **columns,
    )


def _made_up(kept: int, candidates: int) -> list[int]:
    """``kept`` groups far above the selection threshold, then made-up groups of one unit each."""
    return [KEPT_UNITS] * kept + [1] * (candidates - kept)


def _records(entry: Any) -> list[dict]:
    return [orjson.loads(value) for _, value in entry.render()]


def _one_value_per_block(units: list[int], blocks: int) -> BlockValues:
    """One value in every block of every group: ``1000 * group + block``, so a value tells its group."""
    groups = np.repeat(np.arange(len(units)), blocks)
    block = np.tile(np.arange(blocks), len(units))
    return BlockValues(groups.astype(np.int32), block.astype(np.int32), (1000.0 * groups + block).astype(np.float64))


class _InProcessSandbox:
    """A sandbox's interface run in this process: each block's output is its size; keeps every block handed over."""

    def __init__(self) -> None:
        self.blocks: list[np.ndarray] = []

    def run(self, blocks: list[np.ndarray]) -> np.ndarray:
        self.blocks.extend(blocks)
        return np.array([float(len(values)) for values in blocks])

    def take_failures(self) -> dict[str, int]:
        return {}


# (a) more candidate groups than max_groups


@pytest.mark.parametrize("groups", ["selected", "public"])
def test_a_vector_window_of_more_groups_than_max_groups_is_released(groups):
    n = MAX_GROUPS + 1
    selected = groups == "selected"
    runtime = _with_max_groups(_runtime(
        {"count": {}, "mean_vector": {"fields": ["vx", "vy"], "clip_norm": 4.0,
                                      **({"max_released_groups": 10} if selected else {})}},
        groups=SELECT if selected else {"public": [f"p{i}" for i in range(n)]}, mechanism="gaussian", delta=1e-5,
    ), MAX_GROUPS)
    units = _made_up(3, n) if selected else [KEPT_UNITS] * n
    features = np.array([[u * 1.0, u * 2.0, u * 4.0] for u in units])  # each unit's vector (1, 2), C = 4
    records = _records(build_release(runtime, _window(units, features=features), OpenDPNoise(), 130_000))
    expected = {f"p{i}" for i in range(3)} if selected else {f"p{i}" for i in range(n)}
    assert {r["group"]["page"] for r in records} == expected
    for record in records:
        assert record["mean_vector"]["units"] == pytest.approx(KEPT_UNITS, abs=20)


@pytest.mark.parametrize("groups", ["selected", "public"])
def test_a_sample_aggregate_window_of_more_groups_than_max_groups_is_released(groups):
    n = MAX_GROUPS + 1
    selected = groups == "selected"
    sa = {"function": "statistics:median", "blocks": 4, "output_range": [0, 10], "timeout": "100ms",
          **({"max_released_groups": 10} if selected else {})}
    runtime = _with_max_groups(_runtime(
        {"count": {}, "sample_aggregate": sa}, groups=SELECT if selected else {"public": [f"p{i}" for i in range(n)]},
    ), MAX_GROUPS)
    runtime.sandbox = _InProcessSandbox()
    units = _made_up(3, n) if selected else [KEPT_UNITS] * n
    window = _window(units, blocks=_one_value_per_block(units, 4))
    records = _records(build_release(runtime, window, OpenDPNoise(), 130_000))
    assert len(records) == (3 if selected else n)
    assert {r["sample_aggregate"]["blocks"] for r in records} == {4}


def test_the_release_stage_publishes_a_window_of_more_groups_than_max_groups(monkeypatch):
    runtime = _with_max_groups(_runtime({"count": {}, "covariance": {"fields": ["vx"], "clip_norm": 4.0,
                                                                     "max_released_groups": 10}},
                                        mechanism="gaussian", delta=1e-5), MAX_GROUPS)
    units = _made_up(3, MAX_GROUPS + 1)
    features = np.array([[u * 1.0, u * 4.0, u * 16.0] for u in units])
    stage, ledger, registry, published = _stage(runtime, monkeypatch)
    stage._unpublished.append(_Unpublished(runtime, START, END, window=_window(units, features=features),
                                           sources=[(0, 7)]))
    asyncio.run(stage._publish_pending())
    assert stage._unpublished == [] and ledger.get("probe", START).published
    assert {r["group"]["page"] for r in published} == {"p0", "p1", "p2"}


def test_sums_of_more_kept_groups_than_max_groups_are_released():
    # ReleasePlan noises every kept group's sum in one vector; its certificate covers the sums one unit changes
    runtime = _with_max_groups(_runtime({"count": {}, "sum": {"field": "value", "clip": [0, 1]}}), MAX_GROUPS)
    units = [KEPT_UNITS] * (MAX_GROUPS + 1)  # every group passes selection
    window = _window(units, sum=np.full(len(units), 10.0))
    records = [orjson.loads(v) for _, v in build_release(runtime, window, OpenDPNoise(), 130_000).render()]
    assert len(records) == MAX_GROUPS + 1 and all(np.isfinite(r["sum"]) for r in records)


@pytest.mark.parametrize("groups", ["selected", "public"])
def test_a_window_whose_release_cannot_be_built_is_released_as_if_empty(monkeypatch, caplog, groups):
    """A release that cannot be built fails the same way on every retry, and after a restart the window's
    partials are replayed and it fails again: the worker used to exit, every time (a window of more groups
    than a plan's max_groups did), and later withheld the window, publishing nothing of it. Here building
    raises for the window's data: it is released as if empty -- noise only, flagged, counted, logged,
    stored once -- and the stage goes on."""
    public = {"public": [f"p{i}" for i in range(4)]} if groups == "public" else None
    runtime = _runtime({"count": {}, "sum": {"field": "value", "clip": [0, 1]}}, groups=public)
    units = [KEPT_UNITS] * 4
    window = _window(units, sum=np.full(len(units), 10.0))
    real_build = release_draw.build_release

    def cannot_be_built(query: Any, built: Any, *args: Any, **kwargs: Any) -> Any:
        if built.withheld is None:
            raise ValueError("the release cannot be built from these partials")
        return real_build(query, built, *args, **kwargs)

    monkeypatch.setattr(release_draw, "build_release", cannot_be_built)
    stage, ledger, registry, published = _stage(runtime, monkeypatch)
    stage._unpublished.append(_Unpublished(runtime, START, END, window=window, sources=[(0, 7)]))
    with caplog.at_level(logging.ERROR, logger="stream_dp.worker.release.draw"):
        asyncio.run(stage._publish_pending())
    assert stage._unpublished == [] and stage._holds() == {}  # its partials are committed past
    assert ledger.get("probe", START).published
    # every public group, flagged; with selected groups an empty window selects none
    assert sorted(r["group"]["page"] for r in published) == ([f"p{i}" for i in range(4)] if public else [])
    assert all(r["as_if_empty"] == "release_failed" for r in published)
    assert registry.get_sample_value("stream_dp_internal_errors_total", {"kind": "release_failed"}) == 1
    assert registry.get_sample_value("stream_dp_windows_withheld_total",
                                     {"query": "probe", "reason": "release_failed"}) == 1
    assert any("window 60000 of probe could not be built from its data; it is released as if empty" in r.getMessage()
               for r in caplog.records), caplog.text


def _stage(runtime: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[ReleaseStage, MemoryReleaseLedger,
                                                                   CollectorRegistry, list[dict]]:
    ledger = MemoryReleaseLedger()
    stage, registry, published = offline_stage(runtime, monkeypatch, ledger=ledger, consumer=None, now_ms=130_000)
    return stage, ledger, registry, published


# (b) quantiles of few kept groups among many candidates


class _CountingNoise:
    """The production noise source, counting the quantile draws (one ``top_k`` per group and q)."""

    def __init__(self) -> None:
        self.inner = OpenDPNoise()
        self.top_k_calls = 0

    def top_k(self, *args: Any, **kwargs: Any) -> Any:
        self.top_k_calls += 1
        return self.inner.top_k(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


#: Most memory the release below may take: far below one dense histogram of the candidates (10,000
#: groups x 4,096 bins x 8 bytes = 328 MB), which is what it took; the kept groups' rows are scored a
#: chunk at a time (at most 2^21 cells, 16 MiB, per array: ``QuantilesPlan.release``).
QUANTILE_PEAK_BYTES = 32 * 2**20


def test_quantiles_are_drawn_for_the_kept_groups_only_in_bounded_memory():
    bins, candidates, kept = 4096, 10_000, 3
    # one event per unit and group: rank noise of scale 0.6 (median) and 1.1 (0.9) values
    runtime = _runtime({"count": {}, "quantiles": {"field": "value", "q": [0.5, 0.9], "bounds": [0, 100],
                                                   "bins": bins, "max_released_groups": 10}}, linf=1)
    units = _made_up(kept, candidates)
    # every group has values: the kept ones spread over the bins, each made-up one a value of its own
    group = np.concatenate([np.repeat(np.arange(kept), KEPT_UNITS), np.arange(kept, candidates)])
    cells = np.concatenate([np.tile(np.arange(KEPT_UNITS) * 20, kept), np.arange(kept, candidates) % bins])
    histogram = SparseHistogram.from_cells(candidates, bins, group, cells)
    window = _window(units, histogram=histogram)
    noise = _CountingNoise()
    tracemalloc.start()
    try:
        entry = build_release(runtime, window, noise, 130_000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < QUANTILE_PEAK_BYTES, f"{peak / 2**20:.0f} MiB"
    assert noise.top_k_calls == kept * 2  # one draw per kept group and q, none for the others
    records = _records(entry)
    assert {r["group"]["page"] for r in records} == {"p0", "p1", "p2"}
    for record in records:
        # bins 0, 20, ..., 3980 of 4096 over [0, 100], one value each: the median near 48.6, the 0.9 quantile
        # near 87.5; 6 is 12 values (ranks) away, 10 noise scales of the 0.9 quantile's
        assert record["quantiles"]["0.5"]["value"] == pytest.approx(48.6, abs=6)
        assert record["quantiles"]["0.9"]["value"] == pytest.approx(87.5, abs=6)


# (c) the user function runs on the released groups only


def _probe_runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cap: int) -> tuple[Any, Path]:
    """A sample_aggregate query of the probe function, in a real sandbox; the file it logs its calls to."""
    log = tmp_path / "sample_probe.log"
    log.touch()
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the sandbox's temporary directory, where the probe logs
    runtime = _runtime({"count": {}, "sample_aggregate": {
        "function": "tests.worker._call_probe:logged_size", "blocks": 4, "output_range": [0, 10], "timeout": "1s",
        "max_released_groups": cap}})
    return runtime, log


def _groups_called(log: Path) -> list[int]:
    """The group of every block the function ran on (values are ``1000 * group + block``)."""
    return sorted(int(float(line.split()[0])) // 1000 for line in log.read_text().splitlines())


def test_the_function_never_runs_on_a_group_selection_drops(tmp_path, monkeypatch):
    runtime, log = _probe_runtime(tmp_path, monkeypatch, cap=10)
    try:
        units = _made_up(3, 23)
        records = _records(build_release(runtime, _window(units, blocks=_one_value_per_block(units, 4)),
                                         OpenDPNoise(), 130_000))
    finally:
        runtime.sandbox.close()
    assert {r["group"]["page"] for r in records} == {"p0", "p1", "p2"}
    assert _groups_called(log) == [0] * 4 + [1] * 4 + [2] * 4  # each block of each kept group, once


def test_at_most_max_released_groups_are_released_those_with_the_largest_noisy_counts(tmp_path, monkeypatch,
                                                                                       caplog):
    runtime, log = _probe_runtime(tmp_path, monkeypatch, cap=2)
    units = _made_up(4, 24)
    # kept groups with counts 5 x 80, 5 x 200, 5 x 120, 5 x 160 events: far apart for a count noise of
    # scale Linf / (10 / 3) = 1.5, so the two largest are p1 and p3 whatever is drawn
    counts = [400, 1000, 600, 800] + [1] * 20
    window = _window([80, 200, 120, 160] + units[4:], counts=counts, blocks=_one_value_per_block(units, 4))
    try:
        with caplog.at_level(logging.WARNING, logger="stream_dp.worker.release.build"):
            records = _records(build_release(runtime, window, OpenDPNoise(), 130_000))
    finally:
        runtime.sandbox.close()
    assert sorted(r["group"]["page"] for r in records) == ["p1", "p3"]
    assert _groups_called(log) == [1] * 4 + [3] * 4
    assert any("4 groups passed selection; the 2 with the largest noisy counts are released" in r.getMessage()
               and "other 2 left out" in r.getMessage() for r in caplog.records), caplog.text


def test_a_window_an_earlier_run_stored_is_published_even_if_it_cannot_be_built_again(monkeypatch):
    # An earlier run drew and stored the release, then stopped before publishing: the stored values are the
    # window's release, whatever building it again would do -- the fallback drawn as if empty is never used.
    runtime = _runtime({"count": {}, "sum": {"field": "value", "clip": [0, 1]}})
    window = _window([KEPT_UNITS] * 3, sum=np.full(3, 10.0))
    drawn = encode_entry(build_release(runtime, window, OpenDPNoise(), 130_000))
    real_build = release_draw.build_release

    def cannot_be_built(query: Any, built: Any, *args: Any, **kwargs: Any) -> Any:
        if built.withheld is None:
            raise ValueError("the release cannot be built from these partials")
        return real_build(query, built, *args, **kwargs)

    monkeypatch.setattr(release_draw, "build_release", cannot_be_built)
    stage, ledger, registry, published = _stage(runtime, monkeypatch)
    ledger.claim("probe", START, drawn)
    stage._unpublished.append(_Unpublished(runtime, START, END, window=window, sources=[(0, 7)]))
    asyncio.run(stage._publish_pending())
    expected = [orjson.loads(v) for _, v in decode_entry(drawn).render()]
    assert published == expected and len(published) == 3
    assert not any("as_if_empty" in r for r in published)


def test_an_error_that_may_pass_falls_back_too_rather_than_decide_when_the_window_is_published(monkeypatch):
    # Out of file descriptors, say, while starting a sandbox: a retry might release the window's data, but
    # the error (and whatever caused it) would then decide when the window is published, and an error that
    # does not pass would stop every release after it. The window is released as if empty at once.
    runtime = _runtime({"count": {}, "sum": {"field": "value", "clip": [0, 1]}}, groups={"public": ["p0", "p1", "p2"]})
    window = _window([KEPT_UNITS] * 3, sum=np.full(3, 10.0))
    real_build = release_draw.build_release

    def out_of_descriptors(query: Any, built: Any, *args: Any, **kwargs: Any) -> Any:
        if built.withheld is None:
            raise OSError(24, "Too many open files")
        return real_build(query, built, *args, **kwargs)

    monkeypatch.setattr(release_draw, "build_release", out_of_descriptors)
    stage, ledger, registry, published = _stage(runtime, monkeypatch)
    stage._unpublished.append(_Unpublished(runtime, START, END, window=window, sources=[(0, 7)]))
    asyncio.run(stage._publish_pending())
    assert registry.get_sample_value("stream_dp_internal_errors_total", {"kind": "release_failed"}) == 1
    assert ledger.get("probe", START).published
    assert sorted(r["group"]["page"] for r in published) == ["p0", "p1", "p2"]
    assert all(r["as_if_empty"] == "release_failed" for r in published)
