"""Sample-and-aggregate: blocks, the neighbouring-dataset bound on the block outputs, noise law, fallbacks.

The reference assigns units to blocks with the README's formula in Python
integers and lists each block's values with plain loops, independently of
``block_of`` and ``split_blocks``.
"""

from __future__ import annotations

import math
import re
import statistics

import numpy as np
import pytest
from scipy import stats

from stream_dp.dp import ContributionBounds, OpenDPNoise
from stream_dp.dp.sample_aggregate import SampleAggregatePlan, block_of, split_blocks

P_MIN = 1e-4


def _plan(blocks: int = 10, lo: float = 0.0, hi: float = 10.0, epsilon: float = 1.0, groups: int = 1):
    return SampleAggregatePlan.build(function="statistics:median", blocks=blocks, lo=lo, hi=hi, kind="laplace",
                                     budget=epsilon, delta=0.0, bounds=ContributionBounds(groups, 5))


class _SumsSeen:
    """The production noise source, keeping the exact sums a release hands it (the release before noise)."""

    def __init__(self) -> None:
        self.inner = OpenDPNoise()
        self.sums: list[np.ndarray] = []

    def integers(self, values: np.ndarray, **kwargs) -> np.ndarray:
        self.sums.append(np.array(values, dtype=np.float64))
        return self.inner.integers(values, **kwargs)

    def floats(self, values: np.ndarray, **kwargs) -> np.ndarray:
        self.sums.append(np.array(values, dtype=np.float64))
        return self.inner.floats(values, **kwargs)


def _reference_block(unit_hash: int, blocks: int) -> int:
    """The README's block of a unit, in Python integers: ((h * 0x9E3779B97F4A7C15 mod 2^64) >> 32) mod blocks."""
    return ((unit_hash * 0x9E3779B97F4A7C15) % 2**64 >> 32) % blocks


def _events(units: dict[int, dict[int, list[float]]], hashes: dict[int, int], blocks: int):
    """Event columns as a window hands them over: units in hash order, each event with its group and its
    unit's block from production ``block_of``."""
    order = sorted(units, key=hashes.__getitem__)
    unit_block = dict(zip(order, block_of(np.array([hashes[u] for u in order], dtype=np.uint64), blocks).tolist()))
    rows = [(g, unit_block[u], v) for u in order for g, vs in sorted(units[u].items()) for v in vs]
    group, block, value = (np.array(column) for column in zip(*rows))
    return group, block, value.astype(np.float64)


def _reference_cells(units, hashes, n_groups: int, blocks: int) -> list[list[list[float]]]:
    """What each (group, block) must hold: the values of its units in that group, units in hash order."""
    cells: list[list[list[float]]] = [[[] for _ in range(blocks)] for _ in range(n_groups)]
    for u in sorted(units, key=hashes.__getitem__):
        for g, vs in sorted(units[u].items()):
            cells[g][_reference_block(hashes[u], blocks)] += vs
    return cells


def test_blocks_are_a_partition_spread_evenly():
    rng = np.random.default_rng(0)
    hashes = rng.integers(0, 2**63, 50_000, dtype=np.uint64)
    blocks = block_of(hashes, 50)
    assert blocks.min() >= 0 and blocks.max() < 50
    assert np.array_equal(blocks, block_of(hashes.copy(), 50))  # a unit's block never changes
    # chi-square against uniform: loose threshold
    counts = np.bincount(blocks, minlength=50)
    assert stats.chisquare(counts).pvalue > P_MIN
    # sorted hashes (the canonical unit order) still spread: no run of one block
    ordered = block_of(np.sort(hashes)[:1000], 50)
    assert len(set(ordered.tolist())) == 50


def test_one_unit_changes_one_block_output_per_group_at_most_by_the_range():
    # Neighbouring windows through the production path: block_of, split_blocks, the function on each
    # non-empty block (empty ones are NaN, as the worker hands them over), release. Adding one unit
    # (touching up to L0 = 3 groups) may change, in each group it touches, only its own block -- both the
    # block's values and its output -- and the pre-noise sum by at most hi - lo; nothing elsewhere.
    rng = np.random.default_rng(1)
    n_groups, blocks = 3, 10
    units = {u: {int(g): rng.uniform(-5, 15, rng.integers(1, 4)).tolist()
                 for g in rng.choice(n_groups, rng.integers(1, n_groups + 1), replace=False)} for u in range(300)}
    hashes = {u: int(h) for u, h in zip(units, rng.integers(0, 2**64, len(units), dtype=np.uint64))}
    plan = _plan(blocks=blocks, groups=n_groups)

    runs = []

    def run(window: dict[int, dict[int, list[float]]]):
        cells = split_blocks(*_events(window, hashes, blocks), n_groups, blocks)
        runs.append((window, dict(hashes), cells))
        outputs = np.array([[statistics.median(c) if len(c) else np.nan for c in row] for row in cells])
        seen = _SumsSeen()
        plan.release(outputs, seen)
        (sums,) = seen.sums
        return cells, outputs, sums

    base_cells, base_outputs, base_sums = run(units)
    for target_values in ({0: [1e9, 1e9]}, {1: [-1e9], 2: [3.0]}, {0: [3.0, 4.0, 5.0], 1: [1e9], 2: [-1e9]}):
        hashes[999] = int(rng.integers(0, 2**64, dtype=np.uint64))
        own = _reference_block(hashes[999], blocks)
        cells, outputs, sums = run({**units, 999: target_values})
        for g in range(n_groups):
            allowed = {own} if g in target_values else set()
            moved_cells = {b for b in range(blocks) if cells[g][b].tolist() != base_cells[g][b].tolist()}
            assert moved_cells == allowed, (g, moved_cells, own)
            moved_outputs = {b for b in range(blocks)
                             if not np.array_equal(outputs[g, b], base_outputs[g, b], equal_nan=True)}
            assert moved_outputs <= allowed, (g, moved_outputs, own)
            assert abs(sums[g] - base_sums[g]) <= plan.hi - plan.lo
        assert np.abs(sums - base_sums).sum() <= plan.noise.sensitivity
    # and every block holds exactly its units' values, in order
    for window, window_hashes, cells in runs:
        assert [[c.tolist() for c in row] for row in cells] == _reference_cells(window, window_hashes, n_groups, blocks)
    assert plan.noise.sensitivity == n_groups * (plan.hi - plan.lo)  # l1 over L0 groups
    assert _plan(groups=1).noise.sensitivity == plan.hi - plan.lo


def test_split_blocks_matches_a_plain_loop():
    rng = np.random.default_rng(2)
    group, block = rng.integers(0, 4, 500), rng.integers(0, 7, 500)
    values = rng.normal(0, 1, 500)
    cells = split_blocks(group, block, values, 4, 7)
    for g in range(4):
        for b in range(7):
            assert cells[g][b].tolist() == [v for gg, bb, v in zip(group, block, values) if gg == g and bb == b]


def test_failed_and_out_of_range_outputs_are_replaced_before_the_noise():
    plan = _plan(blocks=4, lo=0.0, hi=10.0, epsilon=1e6 / 1.0001)  # almost no noise
    outputs = np.array([[np.nan, 20.0, -3.0, 4.0]])
    means, _ = plan.release(outputs, OpenDPNoise())
    assert means[0] == pytest.approx((5.0 + 10.0 + 0.0 + 4.0) / 4, abs=1e-3)


def test_noise_is_laplace_of_the_stated_scale_and_intervals_cover():
    plan = _plan(blocks=5, epsilon=0.7)
    outputs = np.tile([1.0, 2.0, 3.0, 4.0, 5.0], (4000, 1))
    means, half = plan.release(outputs, OpenDPNoise())
    errors = means * 5 - 15.0  # noise on the sum
    assert stats.kstest(errors / plan.noise.scale, stats.laplace().cdf).pvalue > P_MIN
    assert plan.noise.scale == pytest.approx(10.0 / 0.7, rel=1e-6)
    coverage = float(np.mean(np.abs(means - 3.0) <= half))
    assert 0.94 <= coverage <= 0.97  # binomial sd 0.0034 around >= 0.95


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"blocks": 1}, r"blocks must be an integer in \[2"),
    ({"lo": 5.0, "hi": 5.0}, "lo < hi"),
    ({"hi": float("inf")}, "finite"),
])
def test_bad_plans_say_how_to_fix_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _plan(**kwargs)


@pytest.mark.parametrize("kind", ["laplace", "gaussian"])
def test_an_output_range_too_narrow_or_too_wide_to_calibrate_is_refused_naming_it(kind):
    """The mean's sensitivity is (hi - lo) L0 in l1, (hi - lo) sqrt(L0) in l2 (the module's rule); the float
    noise's finest grid 2^-100 serves sensitivities down to n 2^-100 / 0.5 (l1) or 2 sqrt(n) 2^-100 / 0.5 (l2)
    for n certified groups (stream_dp.dp.calibration). A narrower range is refused naming output_range and the
    rescaling, with the narrowest width that builds; a range whose width overflows is refused too."""
    gaussian = kind == "gaussian"
    build = dict(function="statistics:mean", blocks=10, kind=kind, budget=0.5, delta=1e-6 if gaussian else 0.0,
                 bounds=ContributionBounds(2, 5))
    floor = (2 * math.sqrt(1_000_000) if gaussian else 1_000_000) * 2.0**-100 / 0.5
    expected = floor / (math.sqrt(2) if gaussian else 2)
    for hi in (5e-324, 1e-300, 1e-30, expected * 0.99):
        with pytest.raises(ValueError) as info:
            SampleAggregatePlan.build(lo=0.0, hi=hi, **build)
        message = str(info.value)
        found = re.search(rf"output_range \[0, {hi:g}\] is too narrow to calibrate.*rescale the function's output "
                          r"to larger units.*at least ([\d.e+-]+) wide", message)
        assert found, message
        stated = float(found.group(1))
        assert expected <= stated <= 1.02 * expected, (stated, expected)
    assert SampleAggregatePlan.build(lo=0.0, hi=stated, **build).noise.float_grid_k == -100
    with pytest.raises(ValueError, match=r"output_range \[-1e\+308, 1e\+308\] is wider than the largest float"):
        SampleAggregatePlan.build(lo=-1e308, hi=1e308, **build)


@pytest.mark.parametrize("kind", ["laplace", "gaussian"])
def test_a_window_of_more_groups_than_max_groups_is_noised(kind):
    """A unit changes one block output in each of at most ``max_groups_per_unit`` groups, and each group's
    sum is rounded and noised on its own: the certificate for ``max_groups`` groups covers a window of
    ``max_groups + 1``, which used to be refused (and failed again on every retry)."""
    build = dict(function="statistics:median", blocks=4, lo=0.0, hi=10.0, kind=kind, budget=0.5,
                 delta=1e-6 if kind == "gaussian" else 0.0, max_groups=3)
    plan = SampleAggregatePlan.build(**build, bounds=ContributionBounds(2, 5))
    assert plan.changed_groups == 2 <= plan.noise.max_groups == 3
    means, _ = plan.release(np.full((4, 4), 5.0), OpenDPNoise())
    assert means.shape == (4,) and np.isfinite(means).all()
    with pytest.raises(ValueError, match="raise max_groups to at least max_groups_per_unit"):
        SampleAggregatePlan.build(**build, bounds=ContributionBounds(4, 5))


def _median_plan(epsilon: float, bins: int, blocks: int, groups: int = 1) -> SampleAggregatePlan:
    return SampleAggregatePlan.build(function="statistics:median", blocks=blocks, lo=0.0, hi=10.0, kind="laplace",
                                     budget=epsilon, delta=0.0, bounds=ContributionBounds(groups, 5),
                                     aggregate="median", bins=bins)


def test_the_median_of_block_outputs_follows_permute_and_flip_over_the_edges() -> None:
    """aggregate: median, against its law written from the README: candidates are the bins + 1 edges of
    [lo, hi]; edge j scores |2 L_j - n| (L_j outputs below it, n = blocks); a unit replaces one output of
    each of its L0 groups, moving every score by at most 2, so permute-and-flip runs at scale
    2 * L0 * 2 / epsilon in score units. 20,000 draws, chi-square at P_MIN."""
    from tests.dp.test_topk import _permute_and_flip

    outputs = [1.0, 2.0, 2.0, 7.0, 9.0, 9.5]  # failed or empty blocks would be NaN: counted at the midpoint
    epsilon, bins, draws, l0 = 1.0, 4, 20_000, 2
    plan = _median_plan(epsilon, bins, len(outputs), groups=l0)
    edges = [10.0 * j / bins for j in range(bins + 1)]
    below = [sum(o < e for o in outputs) for e in edges]
    law = _permute_and_flip({j: -abs(2 * b - len(outputs)) for j, b in enumerate(below)}, 2 * l0 * 2 / epsilon)
    rows = plan.release_rows(np.tile(outputs, (draws, 1)), OpenDPNoise())
    seen = np.array([edges.index(r["value"]) for r in rows])
    observed = np.bincount(seen, minlength=bins + 1)
    expected = np.array([law[j] * draws for j in range(bins + 1)])
    assert stats.chisquare(observed, expected).pvalue > P_MIN, (observed, expected.round())
    error = plan.median_rank_error()
    assert {tuple(r["q_interval"]) for r in rows} == {(max(0.0, 0.5 - error / 6), min(1.0, 0.5 + error / 6))}


def test_a_failed_block_counts_at_the_midpoint_in_the_median_too() -> None:
    """Two of three blocks failed (NaN): they sit at the midpoint 5 beside the output 1, so at a large epsilon
    the median is an edge of (1, 5] (edges 2 to 5 all score best; with failures at 0 it would be 1)."""
    plan = _median_plan(1000.0, 10, 3)
    rows = plan.release_rows(np.array([[np.nan, 1.0, np.nan]] * 50), OpenDPNoise())
    assert {r["value"] for r in rows} <= {2.0, 3.0, 4.0, 5.0} and rows[0]["aggregate"] == "median"


def test_the_median_needs_pure_dp() -> None:
    with pytest.raises(ValueError, match="mechanism: laplace"):
        SampleAggregatePlan.build(function="statistics:median", blocks=10, lo=0.0, hi=1.0, kind="gaussian",
                                  budget=0.1, delta=1e-6, bounds=ContributionBounds(1, 1), aggregate="median")
