"""ReleasePlan: validation up front, release behaviour, description."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

from stream_dp.dp import ClipRange, ContributionBounds, NoisyRelease, OpenDPNoise, PrivacyLoss, ReleasePlan

BOUNDS = ContributionBounds(3, 2)
CLIP = ClipRange(0.0, 100.0)
ALL = frozenset({"count", "sum", "mean"})


class RecordingNoise:
    """The real noise source, also recording which vectors were noised."""

    def __init__(self) -> None:
        self.inner = OpenDPNoise()
        self.calls: list[tuple[str, int]] = []

    def integers(self, values: np.ndarray, **kwargs: Any) -> np.ndarray:
        self.calls.append(("integers", values.size))
        return self.inner.integers(values, **kwargs)

    def floats(self, values: np.ndarray, **kwargs: Any) -> np.ndarray:
        self.calls.append(("floats", values.size))
        return self.inner.floats(values, **kwargs)

    def top_k(self, scores: np.ndarray, **kwargs: Any) -> np.ndarray:
        self.calls.append(("top_k", scores.size))
        return self.inner.top_k(scores, **kwargs)


def plan(**overrides: Any) -> ReleasePlan:
    params: dict[str, Any] = {"mechanism": "laplace", "epsilon": 1.0, "bounds": BOUNDS, "clip": CLIP,
                              "aggregations": ALL}
    params.update(overrides)
    return ReleasePlan.build(**params)


def window(groups: int = 50, seed: int = 7) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Synthetic per-group aggregates consistent with BOUNDS and CLIP."""
    rng = np.random.default_rng(seed)
    distinct = rng.integers(0, 400, groups)
    counts = distinct + rng.integers(0, distinct + 1)  # at most 2 events per unit
    sums = counts * rng.uniform(0.0, 100.0, groups)
    return counts.astype(np.int64), sums, distinct.astype(np.int64)


def test_public_groups_are_all_released_with_post_processed_values(noise: OpenDPNoise) -> None:
    counts, sums, distinct = window()
    counts[:5] = 0
    sums[:5] = 0.0
    distinct[:5] = 0
    release = plan().release(counts, sums, distinct, noise)
    assert isinstance(release, NoisyRelease)
    assert release.keep.all() and release.index.tolist() == list(range(50))
    assert release.count is not None and release.sum is not None and release.mean is not None
    assert release.count.dtype == np.int64 and np.all(release.count >= 0)
    assert np.all((release.mean >= 0.0) & (release.mean <= 100.0))
    assert release.count_ci95 is not None and release.count_std is not None and release.sum_ci95 is not None
    assert release.mean_ci95 is not None and release.mean_ci95.shape == (50,)
    assert release.loss == plan().loss
    # the noise is real: values differ from the inputs but stay within a plausible range
    assert not np.array_equal(release.count, counts)
    assert np.all(np.abs(release.count - counts) <= 20 * release.count_std + 1)


def test_count_only_plan_needs_no_clip_and_ignores_sums(noise: OpenDPNoise) -> None:
    counts, _, _ = window()
    count_plan = plan(clip=None, aggregations={"count"})
    release = count_plan.release(counts, None, None, noise)
    assert release.sum is None and release.mean is None and release.sum_ci95 is None
    assert count_plan.describe()["sum_scale"] is None


def test_sum_only_plan_spends_nothing_on_counts(noise: OpenDPNoise) -> None:
    counts, sums, _ = window()
    sum_plan = plan(aggregations={"sum"})
    assert sum_plan.count_noise is None and sum_plan.budget_split == {"sum": 1.0}
    release = sum_plan.release(counts, sums, None, noise)
    assert release.count is None and release.sum is not None


def test_selection_noises_only_kept_groups_and_fills_placeholders() -> None:
    recorder = RecordingNoise()
    counts, sums, distinct = window(groups=400)
    distinct[:200] = 1  # tiny groups: released with negligible probability
    counts[:200] = 1
    sums[:200] = 50.0
    selecting = plan(selection_delta=1e-6)
    release = selecting.release(counts, sums, distinct, recorder)
    kept = int(release.keep.sum())
    assert not release.keep[:200].any()
    assert recorder.calls == [("integers", 400), ("integers", kept), ("floats", kept)]
    assert release.count is not None and release.sum is not None and release.mean is not None
    assert np.all(release.count[~release.keep] == 0)
    assert np.all(np.isnan(release.sum[~release.keep]) & np.isnan(release.mean[~release.keep]))
    assert release.mean_ci95 is not None and np.all(np.isnan(release.mean_ci95[~release.keep]))
    assert np.all(np.isfinite(release.sum[release.keep]))


def test_large_groups_pass_selection(noise: OpenDPNoise) -> None:
    selecting = plan(selection_delta=1e-6)
    assert selecting.selection is not None
    big = selecting.selection.threshold + 200
    counts = np.full(20, 2 * big, dtype=np.int64)
    release = selecting.release(counts, counts * 10.0, np.full(20, big, dtype=np.int64), noise)
    assert release.keep.all()


def test_empty_window(noise: OpenDPNoise) -> None:
    empty = np.empty(0, dtype=np.int64)
    release = plan(selection_delta=1e-6).release(empty, np.empty(0), empty, noise)
    assert release.keep.size == 0 and release.count is not None and release.count.size == 0


def test_loss_composition_of_components() -> None:
    laplace = plan(selection_delta=1e-6)
    assert laplace.selection is not None and laplace.count_noise is not None and laplace.sum_noise is not None
    noise_epsilon = laplace.count_noise.cost + laplace.sum_noise.cost
    assert laplace.loss == PrivacyLoss.pure(noise_epsilon) + laplace.selection.loss
    gaussian = plan(mechanism="gaussian", delta=1e-7)
    assert gaussian.count_noise is not None and gaussian.sum_noise is not None
    rho = gaussian.count_noise.cost + gaussian.sum_noise.cost
    assert gaussian.loss == PrivacyLoss.from_zcdp(rho, 1e-7)
    zcdp = plan(mechanism="gaussian", epsilon=None, rho=0.02, delta=1e-7)
    assert zcdp.loss.rho is not None and zcdp.loss.rho <= 0.02
    assert zcdp.loss.rho == pytest.approx(0.02, rel=1e-6)


def test_budget_split_override_moves_noise_between_components() -> None:
    even = plan()
    sum_heavy = plan(budget_split={"count": 1, "sum": 3})
    assert even.count_noise is not None and sum_heavy.count_noise is not None
    assert even.sum_noise is not None and sum_heavy.sum_noise is not None
    assert sum_heavy.count_noise.scale == pytest.approx(2 * even.count_noise.scale)
    assert sum_heavy.sum_noise.scale == pytest.approx(even.sum_noise.scale * 2 / 3)
    assert sum_heavy.loss.epsilon == pytest.approx(1.0)


def test_describe_is_json_and_states_what_is_spent() -> None:
    for built in (plan(selection_delta=1e-6), plan(mechanism="gaussian", delta=1e-6), plan(clip=None,
                                                                                           aggregations={"count"})):
        description = json.loads(json.dumps(built.describe()))
        assert description["mechanism"] == built.mechanism
        assert description["epsilon"] == built.loss.epsilon and description["delta"] == built.loss.delta
        assert description["count_scale"] == built.count_noise.scale  # type: ignore[union-attr]
        assert set(description["budget_split"]) == set(built.budget_split)
    described = plan(selection_delta=1e-6).describe()
    assert described["selection_threshold"] == described["selection"]["threshold"] > 1
    assert described["float_grid_k"] < -30 and 0 <= described["float_rounding_epsilon"] < 1e-8
    assert plan(mechanism="gaussian", delta=1e-6).describe()["float_rounding_rho"] >= 0


def test_accuracy_at_gives_planning_numbers() -> None:
    built = plan(selection_delta=1e-6)
    assert built.selection is not None
    small, large = built.accuracy_at(10), built.accuracy_at(100_000)
    assert small["count_ci95"] == large["count_ci95"] > 0
    assert large["mean_ci95"] is not None and small["mean_ci95"] is not None
    assert large["mean_ci95"] < small["mean_ci95"] <= 100.0
    assert small["keep_probability"] < 1e-5 < 0.999 < large["keep_probability"]  # type: ignore[operator]
    assert plan().accuracy_at(5)["keep_probability"] == 1.0
    with pytest.raises(ValueError, match="non-negative int"):
        built.accuracy_at(-1)


@pytest.mark.parametrize(
    ("overrides", "error", "hint"),
    [
        ({"mechanism": "exponential"}, ValueError, "laplace, gaussian, staircase, geometric"),
        ({"epsilon": 0.0}, ValueError, "positive and finite"),
        ({"epsilon": -1.0}, ValueError, "epsilon=1.0"),
        ({"epsilon": math.nan}, ValueError, "positive and finite"),
        ({"epsilon": None}, TypeError, "per-window budget"),
        ({"delta": 1e-6}, ValueError, "set delta=0.0"),
        ({"rho": 0.1}, ValueError, "pass epsilon"),
        ({"mechanism": "gaussian"}, ValueError, "delta=1e-6"),
        ({"mechanism": "gaussian", "delta": 1.0}, ValueError, "0 < delta < 1"),
        ({"mechanism": "gaussian", "delta": 1e-6, "rho": 0.1}, ValueError, "not both"),
        ({"mechanism": "gaussian", "delta": 1e-6, "epsilon": None}, ValueError, "either epsilon"),
        ({"mechanism": "gaussian", "delta": 1e-6, "epsilon": None, "rho": 0.1, "selection_delta": 1e-6},
         ValueError, "instead of rho"),
        ({"clip": None}, ValueError, r"need clip=ClipRange\(lo, hi\)"),
        ({"clip": (0.0, 1.0)}, TypeError, "ClipRange"),
        ({"bounds": (3, 2)}, TypeError, "ContributionBounds"),
        ({"aggregations": "count"}, TypeError, "a set such as"),
        ({"aggregations": set()}, ValueError, "non-empty subset"),
        ({"aggregations": {"median"}}, ValueError, "non-empty subset"),
        ({"selection_delta": 0.0}, ValueError, "selection_delta must be positive"),
        ({"budget_split": {"count": 1.0}}, ValueError, "missing keys"),
        ({"max_groups": 0}, ValueError, "max_groups must be a positive int"),
        ({"float_grid_k": 10}, ValueError, "float_grid_k <="),
    ],
)
def test_build_rejects_bad_queries_and_says_how_to_fix(overrides: dict, error: type[Exception], hint: str) -> None:
    with pytest.raises(error, match=hint):
        plan(**overrides)


def _bad_inputs() -> list[tuple[str, tuple, str]]:
    counts, sums, distinct = window(groups=10)
    negative = counts.copy()
    negative[0] = -1
    nan_sums = sums.copy()
    nan_sums[3] = np.nan
    unclipped = sums.copy()
    unclipped[2] = counts[2] * 100.0 + 5.0
    too_many_units = distinct.copy()
    too_many_units[1] = counts[1] + 1
    too_many_events = counts.copy()
    too_many_events[4] = distinct[4] * 2 + 1
    return [
        ("negative counts", (negative, sums, distinct), "counts must be >= 0"),
        ("float counts", (counts.astype(float), sums, distinct), "integer dtype"),
        ("matrix counts", (counts.reshape(2, 5), sums, distinct), "1-d array"),
        ("NaN sums", (counts, nan_sums, distinct), "must be finite"),
        ("unclipped sums", (counts, unclipped, distinct), "not clipped"),
        ("short sums", (counts, sums[:-1], distinct), "sums has 9 entries"),
        ("missing sums", (counts, None, distinct), "pass the per-group clipped sums"),
        ("distinct above counts", (counts, sums, too_many_units), "0 <= distinct_units <= counts"),
        ("unbounded events", (too_many_events, sums, distinct), "max_events_per_group=2"),
        ("short distinct", (counts, sums, distinct[:3]), "distinct_units has 3 entries"),
    ]


@pytest.mark.parametrize(("case", "inputs", "hint"), _bad_inputs(), ids=[c[0] for c in _bad_inputs()])
def test_release_fails_closed_before_any_noise(case: str, inputs: tuple, hint: str) -> None:
    recorder = RecordingNoise()
    with pytest.raises(ValueError, match=hint):
        plan().release(*inputs, recorder)
    assert recorder.calls == []


def test_selection_needs_distinct_units() -> None:
    counts, sums, _ = window(groups=10)
    recorder = RecordingNoise()
    with pytest.raises(ValueError, match="pass distinct_units"):
        plan(selection_delta=1e-6).release(counts, sums, None, recorder)
    assert recorder.calls == []


def test_a_window_of_more_groups_than_one_unit_changes_is_certified_however_many(noise: OpenDPNoise) -> None:
    # The float noise's certificate is for the coordinates one unit changes (max_groups_per_unit), not
    # the window's length: a window of more groups than max_groups is released, not refused.
    counts, sums, _ = window(groups=20)
    released = plan(max_groups=10).release(counts, sums, None, noise)
    assert released.sum.shape == (20,) and np.isfinite(released.sum).all()


def test_a_unit_changing_more_sums_than_certified_is_refused() -> None:
    with pytest.raises(ValueError, match="max_groups"):
        plan(bounds=ContributionBounds(20, 2), max_groups=10)


def test_threaded_noise_gives_the_same_shapes(threaded_noise: OpenDPNoise) -> None:
    counts, sums, distinct = window(groups=5_000)
    release = plan().release(counts, sums, distinct, threaded_noise)
    assert release.count is not None and release.count.shape == (5_000,)
    assert release.sum is not None and np.all(np.isfinite(release.sum))
