"""ContinualPlan (binary tree mechanism) against Chan, Shi & Song's definition, exact laws and a privacy check.

Statistical tests fail only when a p-value is below P_MIN = 1e-4 (about one
false failure in 10,000 runs per test); at the sample sizes used, a node
scale off by 10% gives p-values far below that (checked by one test).
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
import math
from typing import Any

import numpy as np
import pytest
from scipy import stats

from stream_dp.dp import ClipRange, ContributionBounds, PrivacyLoss
from stream_dp.dp.continual import ContinualPlan, TreeState, max_popcount, tree_depth
from stream_dp.dp.laplace_sums import (
    discrete_laplace_sum_half_width,
    discrete_laplace_sum_tail,
    laplace_sum_quantile,
    laplace_sum_tail,
)
from stream_dp.dp.vectorised_noise import VectorisedExactNoise

P_MIN = 1e-4
BOUNDS = ContributionBounds(2, 3)
CLIP = ClipRange(-2.0, 10.0)


class NoFallback:
    """Fails if the vectorised sampler delegates (its draws would not follow the seeded bits)."""

    def integers(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("unexpected delegation to OpenDP")

    floats = top_k = integers


def seeded_noise(seed: int) -> VectorisedExactNoise:
    """The production sampler on reproducible bits (the laws are those of the kernel CSPRNG bits)."""
    rng = np.random.default_rng(seed)
    return VectorisedExactNoise(bits=lambda n: rng.integers(0, 2**64, n, dtype=np.uint64, endpoint=False),
                                fallback=NoFallback())


class RecordingNoise:
    """A noise source that records every vector it noised and what it returned."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[tuple[str, np.ndarray, np.ndarray, float]] = []

    def integers(self, values: np.ndarray, **kwargs: Any) -> np.ndarray:
        out = self.inner.integers(values, **kwargs)
        self.calls.append(("integers", values.copy(), out.copy(), kwargs["scale"]))
        return out

    def floats(self, values: np.ndarray, **kwargs: Any) -> np.ndarray:
        out = self.inner.floats(values, **kwargs)
        self.calls.append(("floats", values.copy(), out.copy(), kwargs["scale"]))
        return out

    def top_k(self, scores: np.ndarray, **kwargs: Any) -> np.ndarray:
        raise AssertionError("the tree draws no top-k")


def build(**overrides: Any) -> ContinualPlan:
    params: dict[str, Any] = {"epsilon": 2.0, "bounds": BOUNDS, "clip": CLIP,
                              "aggregations": {"count", "sum", "mean"}, "windows_per_period": 16,
                              "max_windows_per_unit": 2}
    params.update(overrides)
    return ContinualPlan.build(**params)


def windows(rng: np.random.Generator, periods: int, groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-window counts and integer-valued clipped sums (exact in float, so p-sums are exact)."""
    counts = rng.integers(0, 30, size=(periods, groups)).astype(np.int64)
    sums = np.round(counts * rng.uniform(CLIP.lo, CLIP.hi, size=counts.shape))
    return counts, sums


def run(plan: ContinualPlan, counts: np.ndarray, sums: np.ndarray | None, noise: Any, state: TreeState | None = None,
        start: int = 1) -> tuple[list[Any], TreeState | None]:
    releases = []
    for t in range(start, counts.shape[0] + 1):
        release, state = plan.step(state, t, counts[t - 1], None if sums is None else sums[t - 1], noise)
        releases.append(release)
    return releases, state


# --- (a) the releases are CSS's binary mechanism ---------------------------------------------------------------


def dyadic_decomposition(t: int) -> list[tuple[int, int]]:
    """[1, t] as CSS's disjoint intervals (start, end]: one of length 2^j for each set bit j, highest first."""
    intervals, start = [], 0
    for j in reversed(range(t.bit_length())):
        if t >> j & 1:
            intervals.append((start, start + 2**j))
            start += 2**j
    return intervals


@pytest.mark.parametrize("seed", range(6))
def test_running_totals_follow_the_binary_mechanism(seed: int) -> None:
    rng = np.random.default_rng(seed)
    periods = int(rng.integers(1, 65))
    groups = int(rng.integers(1, 6))
    per_unit = int(rng.integers(1, periods + 1))
    plan = build(windows_per_period=periods, max_windows_per_unit=per_unit, epsilon=float(rng.uniform(0.5, 5)))
    counts, sums = windows(rng, periods, groups)
    recorder = RecordingNoise(seeded_noise(seed))
    releases, _ = run(plan, counts, sums, recorder)
    assert plan.count_noise is not None and plan.sum_noise is not None

    # each window noises exactly one node: the interval ending at t of length 2^(trailing zeros of t)
    assert len(recorder.calls) == 2 * periods
    noisy_count: dict[tuple[int, int], np.ndarray] = {}
    noisy_sum: dict[tuple[int, int], np.ndarray] = {}
    for t in range(1, periods + 1):
        (kind_c, in_c, out_c, scale_c), (kind_s, in_s, out_s, scale_s) = recorder.calls[2 * t - 2: 2 * t]
        assert (kind_c, kind_s) == ("integers", "floats")
        assert (scale_c, scale_s) == (plan.count_noise.scale, plan.sum_noise.scale)
        node = (t - (t & -t), t)
        np.testing.assert_array_equal(in_c, counts[node[0]:node[1]].sum(axis=0))
        np.testing.assert_array_equal(in_s, sums[node[0]:node[1]].sum(axis=0))
        noisy_count[node], noisy_sum[node] = out_c, out_s

    for t, release in enumerate(releases, start=1):
        nodes = dyadic_decomposition(t)
        assert release.t == t and release.popcount == len(nodes) == bin(t).count("1")
        expected_count = sum(noisy_count[n] for n in nodes)
        expected_sum = sum(noisy_sum[n] for n in nodes)
        np.testing.assert_array_equal(release.count, np.maximum(expected_count, 0))
        np.testing.assert_allclose(release.sum, expected_sum, rtol=1e-12, atol=1e-9)
        mean = np.clip(release.sum / np.maximum(release.count, 1), CLIP.lo, CLIP.hi)
        np.testing.assert_array_equal(release.mean, mean)
        accuracy = plan.accuracy(len(nodes))
        assert (release.count_ci95, release.sum_ci95) == (accuracy["count_ci95"], accuracy["sum_ci95"])
        assert release.loss == plan.loss


def test_count_only_and_sum_only_plans_draw_only_their_noise() -> None:
    rng = np.random.default_rng(11)
    counts, sums = windows(rng, 5, 3)
    recorder = RecordingNoise(seeded_noise(1))
    releases, state = run(build(aggregations={"count"}, clip=None), counts, None, recorder)
    assert [c[0] for c in recorder.calls] == ["integers"] * 5
    assert releases[-1].sum is None and releases[-1].mean is None and releases[-1].sum_ci95 is None
    assert state is not None and state.components() == {"count"}
    recorder = RecordingNoise(seeded_noise(1))
    releases, state = run(build(aggregations={"sum"}), counts, sums, recorder)
    assert [c[0] for c in recorder.calls] == ["floats"] * 5
    assert releases[-1].count is None and releases[-1].count_ci95 is None
    assert state is not None and state.components() == {"sum"}


# --- (b) the error of a running count follows the exact law of popcount(t) node noises -------------------------

GROUPS = 40_000


def convolved_discrete_laplace(scale: float, terms: int) -> tuple[np.ndarray, np.ndarray]:
    """Support and pmf of a sum of ``terms`` discrete Laplace, each truncated where its tail is below 1e-15."""
    q = math.exp(-1.0 / scale)
    reach = math.ceil(math.log(1e-15) / math.log(q))
    support = np.arange(-reach, reach + 1)
    one = (1 - q) / (1 + q) * q ** np.abs(support)
    pmf = one
    for _ in range(terms - 1):
        pmf = np.convolve(pmf, one)
    return np.arange(-reach * terms, reach * terms + 1), pmf


def chi_square_p_value(draws: np.ndarray, support: np.ndarray, pmf: np.ndarray) -> float:
    """Chi-square goodness of fit on the values with >= 5 expected draws, the rest pooled in two tail bins."""
    expected = pmf * draws.size
    inner = support[expected >= 5]
    low, high = inner.min(), inner.max()
    observed = np.concatenate([[np.count_nonzero(draws < low)],
                               np.bincount(draws[(draws >= low) & (draws <= high)] - low, minlength=high - low + 1),
                               [np.count_nonzero(draws > high)]])
    inside = (support >= low) & (support <= high)
    expected = np.concatenate([[pmf[support < low].sum()], pmf[inside], [pmf[support > high].sum()]]) * draws.size
    keep = expected > 0
    return float(stats.chisquare(observed[keep], expected[keep] * observed[keep].sum() / expected[keep].sum()).pvalue)


def running_count_errors(plan: ContinualPlan, at: tuple[int, ...], seed: int) -> dict[int, np.ndarray]:
    """Errors of the running counts of GROUPS independent groups (each window adds 100 events to every group)."""
    per_window = np.full(GROUPS, 100, dtype=np.int64)
    state, errors = None, {}
    for t in range(1, max(at) + 1):
        release, state = plan.step(state, t, per_window, None, seeded_noise(seed * 100 + t))
        if t in at:
            assert release.count is not None
            assert release.count.min() > 0  # far from the clamp at 0, so the error is the raw noise
            errors[t] = release.count - 100 * t
    return errors


def count_plan(scale: float = 3.0) -> ContinualPlan:
    # W * Delta_1 * depth / epsilon = 1 * 1 * 4 / epsilon: epsilon = 4/3 gives node scale 3
    return ContinualPlan.build(epsilon=4.0 / scale, bounds=ContributionBounds(1, 1), aggregations={"count"},
                               windows_per_period=8, max_windows_per_unit=1)


def doctored(plan: ContinualPlan, factor: float) -> ContinualPlan:
    """A broken plan: same claims, node noise scale multiplied by ``factor``."""
    assert plan.count_noise is not None
    return dataclasses.replace(plan, count_noise=dataclasses.replace(plan.count_noise,
                                                                      scale=plan.count_noise.scale * factor))


def test_running_count_error_follows_the_convolution_of_its_node_noises() -> None:
    plan = count_plan()
    assert plan.count_noise is not None and plan.count_noise.scale == pytest.approx(3.0)
    errors = running_count_errors(plan, (7, 8), seed=1)
    for t, terms in ((7, 3), (8, 1)):
        support, pmf = convolved_discrete_laplace(plan.count_noise.scale, terms)
        assert chi_square_p_value(errors[t], support, pmf) > P_MIN
        # the reported 95% interval has the coverage of the exact law
        half_width = plan.accuracy(terms)["count_ci95"]
        assert half_width is not None
        exact = pmf[np.abs(support) <= half_width].sum()
        covered = int(np.count_nonzero(np.abs(errors[t]) <= half_width))
        assert stats.binomtest(covered, GROUPS, exact).pvalue > P_MIN


def test_a_node_scale_off_by_ten_percent_is_detected() -> None:
    # run once with this doctored plan, the test above fails: over 20 seeds its p-values stayed below 1e-50
    honest = count_plan()
    assert honest.count_noise is not None
    errors = running_count_errors(doctored(honest, 1.1), (7, 8), seed=2)
    for t, terms in ((7, 3), (8, 1)):
        support, pmf = convolved_discrete_laplace(honest.count_noise.scale, terms)
        assert chi_square_p_value(errors[t], support, pmf) < P_MIN


# --- the exact laws behind the half-widths ------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [0.4, 2.5, 9.0])
@pytest.mark.parametrize("terms", [1, 2, 3, 5, 6])
def test_count_half_width_is_the_smallest_of_the_convolved_law(terms: int, scale: float) -> None:
    support, pmf = convolved_discrete_laplace(scale, terms)
    for alpha in (0.05, 0.025):
        h = discrete_laplace_sum_half_width(terms, scale, alpha)
        assert h == int(h) >= 0
        assert pmf[np.abs(support) <= h].sum() >= 1 - alpha
        if h >= 1:
            assert pmf[np.abs(support) <= h - 1].sum() < 1 - alpha
    for x in (0, 1, 4, 17):
        assert discrete_laplace_sum_tail(terms, scale, x) == pytest.approx(pmf[support >= x].sum(), rel=1e-9, abs=1e-15)


@pytest.mark.parametrize("terms", [1, 3, 8, 20])
def test_large_scale_half_width_agrees_with_the_continuous_law(terms: int) -> None:
    # Z = floor(E1) - floor(E2) couples a discrete Laplace with a Laplace within 1, so the
    # quantiles of p-term sums differ by less than p (+1 for the integer rounding up)
    scale = 3.7e6
    discrete = discrete_laplace_sum_half_width(terms, scale, 0.05)
    continuous = laplace_sum_quantile(terms, scale, 0.05)
    assert abs(discrete - continuous) <= terms + 1


@pytest.mark.parametrize("terms", [1, 2, 3, 4])
def test_continuous_tail_matches_a_numerical_convolution(terms: int) -> None:
    step = 0.005
    grid = np.arange(-30, 30 + step / 2, step)
    density = 0.5 * np.exp(-np.abs(grid))
    total = density * step
    for _ in range(terms - 1):
        total = np.convolve(total, density * step)
    support = np.arange(total.size) * step - 30 * terms
    for x in (0.0, 0.7, 2.5, 6.0):
        numeric = total[support > x].sum()
        assert laplace_sum_tail(terms, 1.0, x) == pytest.approx(numeric, abs=2e-3)
    assert laplace_sum_tail(2, 1.0, 1.3) == pytest.approx(math.exp(-1.3) * (2 + 1.3) / 4)  # known closed form


def test_sum_half_width_is_the_continuous_quantile_plus_the_grid_slack() -> None:
    plan = build(windows_per_period=64)
    assert plan.sum_noise is not None and plan.sum_noise.float_grid_k is not None
    grid = math.ldexp(1.0, plan.sum_noise.float_grid_k)
    for terms in range(1, max_popcount(64) + 1):
        quantile = laplace_sum_quantile(terms, plan.sum_noise.scale, 0.05)
        assert 2 * laplace_sum_tail(terms, plan.sum_noise.scale, quantile) <= 0.05
        assert 2 * laplace_sum_tail(terms, plan.sum_noise.scale, quantile * (1 - 1e-6)) > 0.05
        assert plan.accuracy(terms)["sum_ci95"] == quantile + 2 * terms * grid
        assert plan.accuracy(terms)["sum_std"] == pytest.approx(math.sqrt(terms) * plan.sum_noise.std)


# --- (c) a state stored after any window resumes the period bit for bit -------------------------------------------


def stored_and_restored(state: TreeState, as_lists: bool) -> TreeState:
    """Through JSON (ints) and an .npz file (vectors), or JSON lists for everything."""
    ints, arrays = state.to_columns()
    ints = json.loads(json.dumps(ints))
    if as_lists:
        return TreeState.from_columns(ints, json.loads(json.dumps({k: v.tolist() for k, v in arrays.items()})))
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    buffer.seek(0)
    with np.load(buffer) as stored:
        return TreeState.from_columns(ints, {name: stored[name] for name in stored.files})


def same_release(first: Any, second: Any) -> bool:
    return all(
        (a is None and b is None) or (isinstance(a, np.ndarray) and a.dtype == b.dtype and a.tobytes() == b.tobytes())
        or a == b
        for a, b in ((getattr(first, f.name), getattr(second, f.name)) for f in dataclasses.fields(first))
    )


@pytest.mark.parametrize("as_lists", [False, True])
def test_resumed_period_equals_the_uninterrupted_one(as_lists: bool) -> None:
    periods, groups = 13, 4
    rng = np.random.default_rng(5)
    counts, _ = windows(rng, periods, groups)
    sums = counts * rng.uniform(CLIP.lo, CLIP.hi, counts.shape)  # not integers: float p-sums must survive storage
    uninterrupted, _ = run(build(windows_per_period=periods), counts, sums, seeded_noise(9))
    for crash_after in range(periods):
        noise = seeded_noise(9)
        before, state = run(build(windows_per_period=periods), counts[:crash_after], sums[:crash_after], noise)
        restored = stored_and_restored(state, as_lists) if state is not None else None
        if state is not None:
            assert restored is not None and restored == state
            for name, values in state.to_columns()[1].items():
                assert restored.to_columns()[1][name].tobytes() == values.tobytes()
        after, _ = run(build(windows_per_period=periods), counts, sums, noise, restored, start=crash_after + 1)
        assert len(before) + len(after) == periods
        assert all(same_release(a, b) for a, b in zip(before + after, uninterrupted, strict=True))


def test_state_holds_the_set_bits_of_t_and_is_read_only() -> None:
    counts, sums = windows(np.random.default_rng(2), 11, 3)
    _, state = run(build(), counts, sums, seeded_noise(3))
    assert state is not None and state.t == 11 and state.n_groups == 3
    ints, arrays = state.to_columns()
    assert ints == {"t": 11, "n_groups": 3}
    names = itertools.product(("count", "sum"), ("true", "noisy"), (0, 1, 3))  # 11 = 0b1011
    assert sorted(arrays) == sorted(f"{c}_{k}_{j}" for c, k, j in names)
    np.testing.assert_array_equal(arrays["count_true_3"], counts[:8].sum(axis=0))
    np.testing.assert_array_equal(arrays["count_true_1"], counts[8:10].sum(axis=0))
    np.testing.assert_array_equal(arrays["count_true_0"], counts[10])
    with pytest.raises(ValueError, match="read-only"):
        arrays["count_true_0"][0] = 1
    assert TreeState.from_columns({"t": 0, "n_groups": 0}, {}) == TreeState.initial()
    assert TreeState.from_columns(ints, arrays) == state
    changed = dict(arrays, sum_noisy_0=np.nextafter(arrays["sum_noisy_0"], np.inf))
    assert TreeState.from_columns(ints, changed) != state  # one ulp apart is not the same state


# --- (d) bad inputs are refused with a way to fix them -----------------------------------------------------------


@pytest.mark.parametrize(("overrides", "message"), [
    ({"mechanism": "gaussian"}, "pass mechanism='laplace'"),
    ({"max_windows_per_unit": 0}, "at least 1.*max_windows_per_unit=1"),
    ({"windows_per_period": 0}, "at least 1.*windows_per_period=1440"),
    ({"windows_per_period": 4, "max_windows_per_unit": 5}, "lower it to at most windows_per_period=4"),
    ({"epsilon": 0.0}, "positive and finite.*epsilon=1.0"),
    ({"clip": None}, "need clip=ClipRange"),
    ({"aggregations": {"count", "top_k"}}, "non-empty subset"),
    ({"max_groups": 0}, "max_groups=1_000_000"),
    ({"max_windows_per_unit": 10_000, "windows_per_period": 10_000, "bounds": ContributionBounds(10**6, 1)},
     "lower max_windows_per_unit or max_groups_per_unit"),
])
def test_bad_plans_are_refused_with_a_fix(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        build(**overrides)
    with pytest.raises(TypeError, match="must be an int"):
        build(windows_per_period=4.0)


def test_windows_out_of_order_are_refused_with_the_expected_t() -> None:
    plan = build()
    counts, sums = windows(np.random.default_rng(1), 4, 2)
    noise = seeded_noise(4)
    _, state = run(plan, counts[:3], sums[:3], noise)
    with pytest.raises(ValueError, match="does not follow the state of window 3.*pass t=4"):
        plan.step(state, 5, counts[3], sums[3], noise)
    with pytest.raises(ValueError, match="pass t=4"):
        plan.step(state, 3, counts[2], sums[2], noise)
    with pytest.raises(ValueError, match="pass t=1"):
        plan.step(None, 2, counts[1], sums[1], noise)
    with pytest.raises(ValueError, match="outside the period's windows 1..16; a new period starts again at t=1"):
        plan.step(None, 17, counts[0], sums[0], noise)
    with pytest.raises(TypeError, match="int index of the window"):
        plan.step(None, 1.0, counts[0], sums[0], noise)  # type: ignore[arg-type]


def test_inconsistent_windows_and_states_are_refused_before_any_noise() -> None:
    plan = build()
    counts, sums = windows(np.random.default_rng(1), 2, 3)
    recorder = RecordingNoise(seeded_noise(4))
    _, state = run(plan, counts[:1], sums[:1], recorder)
    drawn = len(recorder.calls)
    with pytest.raises(ValueError, match="the groups of a period are public and fixed"):
        plan.step(state, 2, counts[1][:2], sums[1][:2], recorder)
    with pytest.raises(ValueError, match="pass the per-group clipped sums"):
        plan.step(state, 2, counts[1], None, recorder)
    with pytest.raises(ValueError, match="values were not clipped"):
        plan.step(state, 2, counts[1], sums[1] + 1e6, recorder)
    with pytest.raises(ValueError, match="same aggregations"):
        build(aggregations={"count"}, clip=None).step(state, 2, counts[1], None, recorder)
    with pytest.raises(ValueError, match="Rebuild the plan with a larger max_groups"):
        build(max_groups=2).step(None, 1, counts[0], sums[0], recorder)
    with pytest.raises(TypeError, match="TreeState returned by the previous step"):
        plan.step({"t": 1}, 2, counts[1], sums[1], recorder)  # type: ignore[arg-type]
    assert len(recorder.calls) == drawn


def test_stored_states_are_checked_when_restored() -> None:
    counts, sums = windows(np.random.default_rng(1), 3, 2)
    _, state = run(build(), counts, sums, seeded_noise(4))
    assert state is not None
    ints, arrays = state.to_columns()
    with pytest.raises(ValueError, match="missing \\['count_noisy_1'\\].*TreeState.to_columns"):
        TreeState.from_columns(ints, {k: v for k, v in arrays.items() if k != "count_noisy_1"})
    with pytest.raises(ValueError, match="unexpected \\['count_true_5'\\]"):
        TreeState.from_columns(ints, {**arrays, "count_true_5": arrays["count_true_0"]})
    with pytest.raises(ValueError, match="store them as float64"):
        TreeState.from_columns(ints, {**arrays, "sum_true_0": arrays["sum_true_0"].astype(np.float32)})
    with pytest.raises(ValueError, match="store them as int64"):
        TreeState.from_columns(ints, {**arrays, "count_true_0": arrays["count_true_0"].astype(float)})
    with pytest.raises(ValueError, match="vector of 2 groups"):
        TreeState.from_columns(ints, {**arrays, "sum_true_0": np.zeros(3)})
    with pytest.raises(ValueError, match="exactly \\{'t', 'n_groups'\\}"):
        TreeState.from_columns({"t": 3}, arrays)
    with pytest.raises(ValueError, match="non-negative int"):
        TreeState.from_columns({"t": -1, "n_groups": 2}, arrays)


# --- (e) the error table against hand-computed values -------------------------------------------------------------


def test_error_table_against_hand_computed_values() -> None:
    # T = 4, W = 2, Delta_1 = 1, epsilon = 3: depth 3, node scale W * Delta_1 * depth / epsilon = 2,
    # naive per-window scale W * Delta_1 / epsilon = 2/3 (both up to the 1e-9 calibration margin)
    plan = ContinualPlan.build(epsilon=3.0, bounds=ContributionBounds(1, 1), windows_per_period=4,
                               max_windows_per_unit=2)
    rows = {row["t"]: row for row in plan.error_table((1, 3, 4, 5))}
    assert [rows[t]["applicable"] for t in (1, 3, 4, 5)] == [True, True, True, False]
    assert [(rows[t]["popcount"], rows[t]["worst_popcount"]) for t in (1, 3, 4)] == [(1, 1), (2, 2), (1, 2)]

    def variance(scale: float) -> float:  # discrete Laplace: 2q / (1 - q)^2
        q = math.exp(-1 / scale)
        return 2 * q / (1 - q) ** 2

    tree_one, naive_one = math.sqrt(variance(2.0)), math.sqrt(variance(2.0 / 3.0))
    assert tree_one == pytest.approx(2.79918, abs=1e-5) and naive_one == pytest.approx(0.85990, abs=1e-5)
    # one node: P(|Z| > h) = 2 q^(h+1) / (1 + q) with q = e^-1/2: 0.0527 at h = 5, 0.0320 at h = 6
    # two nodes: P(S = z) = ((1-q)/(1+q))^2 q^|z| (|z| + (1+q^2)/(1-q^2)): P(|S| <= 7) = 0.9436, P(|S| <= 8) = 0.9590
    q = math.exp(-0.5)
    two = [((1 - q) / (1 + q)) ** 2 * q ** abs(z) * (abs(z) + (1 + q * q) / (1 - q * q)) for z in range(-8, 9)]
    assert sum(two[1:-1]) < 0.95 <= sum(two)
    expected = {1: (tree_one, 6.0, tree_one, 6.0, naive_one),
                3: (math.sqrt(2) * tree_one, 8.0, math.sqrt(2) * tree_one, 8.0, math.sqrt(3) * naive_one),
                4: (tree_one, 6.0, math.sqrt(2) * tree_one, 8.0, 2 * naive_one)}
    for t, (std, ci, worst_std, worst_ci, naive) in expected.items():
        count = rows[t]["count"]
        assert count["tree_std"] == pytest.approx(std, rel=1e-6)
        assert (count["tree_ci95"], count["tree_worst_ci95"]) == (ci, worst_ci)
        assert count["tree_worst_std"] == pytest.approx(worst_std, rel=1e-6)
        assert count["naive_std"] == pytest.approx(naive, rel=1e-6)
        assert rows[t]["sum"] is None
    json.dumps(rows)


def test_error_table_for_sums_and_long_periods() -> None:
    plan = build(windows_per_period=1440, max_windows_per_unit=3)
    rows = plan.error_table()
    assert [row["t"] for row in rows] == [1, 10, 100, 1000]
    assert plan.sum_noise is not None
    naive_scale = 3 * BOUNDS.max_groups_per_unit * BOUNDS.max_events_per_group * 10.0 / plan.component_epsilon["sum"]
    for row in rows:
        assert row["sum"]["naive_scale"] == pytest.approx(naive_scale)
        assert row["sum"]["naive_std"] == pytest.approx(math.sqrt(row["t"]) * math.sqrt(2) * naive_scale)
        p = row["popcount"]
        assert row["sum"]["tree_std"] == pytest.approx(math.sqrt(p) * plan.sum_noise.std)
    # std ratio tree / naive = sqrt(popcount) * depth / sqrt(t): at t = 1000 (popcount 6) sqrt(6) * 11 < sqrt(1000),
    # but the worst window up to then (popcount 9) is still slightly above: 3 * 11 > sqrt(1000)
    assert rows[-1]["count"]["tree_std"] < rows[-1]["count"]["naive_std"] < rows[-1]["count"]["tree_worst_std"]
    assert rows[0]["count"]["tree_std"] > rows[0]["count"]["naive_std"]
    with pytest.raises(ValueError, match="at least 1"):
        plan.error_table((0,))


def test_depth_popcount_loss_and_description() -> None:
    assert [tree_depth(t) for t in (1, 2, 3, 4, 7, 8, 1440, 2**20)] == [1, 2, 2, 3, 3, 4, 11, 21]
    assert [max_popcount(t) for t in (1, 2, 3, 6, 7, 1000)] == [1, 1, 2, 2, 3, 9]
    plan = build(windows_per_period=1440, max_windows_per_unit=3, epsilon=1.0)
    assert plan.count_noise is not None and plan.sum_noise is not None
    assert plan.depth == 11
    assert plan.level_loss == PrivacyLoss.pure(plan.count_noise.cost + plan.sum_noise.cost)
    assert plan.loss == plan.level_loss * 11
    assert plan.loss.epsilon <= 1.0 and plan.loss.epsilon == pytest.approx(1.0, rel=1e-8)
    # each level is calibrated to W * Delta_1 at epsilon_component / depth
    assert plan.count_noise.sensitivity == 3 * 2 * 3
    assert plan.count_noise.scale == pytest.approx(18 * 11 / 0.5, rel=1e-8)
    assert plan.sum_noise.max_groups == 3 * 2  # W * min(L0, max_groups) coordinates certified per level
    description = plan.describe()
    json.dumps(description)
    assert description["mechanism"] == "binary_tree" and description["depth"] == 11
    assert (description["windows_per_period"], description["max_windows_per_unit"]) == (1440, 3)
    assert description["period"]["epsilon"] == pytest.approx(11 * description["per_level"]["epsilon"])
    assert description["count_scale"] == plan.count_noise.scale and description["sum_scale"] == plan.sum_noise.scale
    split = build(budget_split={"count": 1, "sum": 3})
    assert split.budget_split == {"count": 0.25, "sum": 0.75}


def test_a_window_may_hold_more_groups_than_the_certified_coordinates() -> None:
    plan = build(windows_per_period=4, max_windows_per_unit=1, max_groups=1000)
    assert plan.sum_noise is not None and plan.sum_noise.max_groups == 2
    counts, sums = windows(np.random.default_rng(0), 4, 500)
    releases, _ = run(plan, counts, sums, seeded_noise(1))
    assert releases[-1].sum is not None and releases[-1].sum.shape == (500,)


# --- (f) the privacy claim, checked on the exact output distribution ---------------------------------------------


def released_nodes(plan: ContinualPlan, stream: list[int]) -> list[tuple[int, float]]:
    """(true node value, scale) of every noisy node the plan releases over one period of one group."""
    recorder = RecordingNoise(seeded_noise(0))
    run(plan, np.asarray(stream, dtype=np.int64)[:, None], None, recorder)
    return [(int(values[0]), scale) for _, values, _, scale in recorder.calls]


def max_log_ratio(first: list[tuple[int, float]], second: list[tuple[int, float]], reach: int = 10) -> float:
    """max over outputs y of |log P(y | first) - log P(y | second)|, the joint pmf being the product of
    the nodes' discrete Laplace pmfs, on a grid that contains every point where the maximum is reached."""
    axes = [np.arange(min(a, b) - reach, max(a, b) + reach + 1) for (a, _), (b, _) in zip(first, second, strict=True)]
    log_first = log_second = np.zeros([axis.size for axis in axes])
    for i, (axis, (a, scale), (b, scale_b)) in enumerate(zip(axes, first, second, strict=True)):
        assert scale == scale_b
        q = math.exp(-1 / scale)
        shape = [1] * len(axes)
        shape[i] = axis.size
        log_first = log_first + np.log((1 - q) / (1 + q) * q ** np.abs(axis - a)).reshape(shape)
        log_second = log_second + np.log((1 - q) / (1 + q) * q ** np.abs(axis - b)).reshape(shape)
    return float(np.max(np.abs(log_first - log_second)))


def test_exact_output_law_of_all_nodes_respects_the_claimed_epsilon() -> None:
    # T = 4, W = 1, one group, L0 = Linf = 1: the released running counts are post-processing of the four
    # noisy nodes [1,1], [1,2], [3,3], [1,4], so their joint law bounds what any release reveals
    plan = ContinualPlan.build(epsilon=1.0, bounds=ContributionBounds(1, 1), windows_per_period=4,
                               max_windows_per_unit=1)
    claimed = plan.loss.epsilon
    base = [5, 3, 7, 2]
    ratios = {}
    for window in range(4):
        neighbour = list(base)
        neighbour[window] += 1  # the unit present in this window, absent otherwise
        ratios[window + 1] = max_log_ratio(released_nodes(plan, base), released_nodes(plan, neighbour))
    assert max(ratios.values()) <= claimed * (1 + 1e-12)
    # window 1 lies in one node of every level, so the depth-fold accounting is exactly tight there;
    # window 2 lies in 2 of the 3 levels' nodes
    assert ratios[1] == pytest.approx(claimed, rel=1e-8)
    assert ratios[2] == pytest.approx(2 / 3 * claimed, rel=1e-8) and ratios[2] > claimed / (plan.depth * 1.01)


def test_exact_output_law_with_two_windows_per_unit() -> None:
    # W = 2: every pair of windows; the bound W * depth nodes is loose by 1/6 here, because level 1 of a
    # 4-window period releases one node only ([1,2]), so no unit changes W nodes of every level
    plan = ContinualPlan.build(epsilon=1.0, bounds=ContributionBounds(1, 1), windows_per_period=4,
                               max_windows_per_unit=2)
    base = [5, 3, 7, 2]
    worst = 0.0
    for pair in itertools.combinations(range(4), 2):
        neighbour = [v + (i in pair) for i, v in enumerate(base)]
        worst = max(worst, max_log_ratio(released_nodes(plan, base), released_nodes(plan, neighbour), reach=8))
    assert worst <= plan.loss.epsilon * (1 + 1e-12)
    assert worst == pytest.approx(5 / 6 * plan.loss.epsilon, rel=1e-8)
