"""Sample-and-aggregate: blocks, the neighbouring-dataset bound on the block outputs, noise law, fallbacks.

The reference splits units into blocks and computes each block's median with
Python's ``statistics`` module, independently of ``split_blocks``.
"""

from __future__ import annotations

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


def _block_medians(units: dict[int, list[float]], hashes: dict[int, int], blocks: int, lo: float, hi: float):
    """Reference: each block's median (the midpoint for an empty block, as a failed function), clipped."""
    members: dict[int, list[float]] = {b: [] for b in range(blocks)}
    for unit, values in units.items():
        members[int(block_of(np.array([hashes[unit]], dtype=np.uint64), blocks)[0])] += values
    return [min(max(statistics.median(v), lo), hi) if v else (lo + hi) / 2 for _, v in sorted(members.items())]


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
    rng = np.random.default_rng(1)
    units = {u: rng.uniform(-5, 15, rng.integers(1, 4)).tolist() for u in range(300)}
    hashes = {u: int(h) for u, h in zip(units, rng.integers(0, 2**63, len(units), dtype=np.uint64))}
    plan = _plan(blocks=10)
    base = _block_medians(units, hashes, 10, plan.lo, plan.hi)
    for target_values in ([1e9, 1e9], [-1e9], [3.0]):
        with_target = {**units, 999: target_values}
        hashes[999] = int(rng.integers(0, 2**63, dtype=np.uint64))
        moved = _block_medians(with_target, hashes, 10, plan.lo, plan.hi)
        changed = [b for b in range(10) if moved[b] != base[b]]
        assert len(changed) <= 1
        assert abs(sum(moved) - sum(base)) <= plan.hi - plan.lo
    assert plan.noise.sensitivity == plan.hi - plan.lo
    assert _plan(groups=3).noise.sensitivity == 3 * (plan.hi - plan.lo)  # l1 over L0 groups


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
