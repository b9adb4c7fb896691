"""Group sums are exact: neighbouring streams' sums differ by exactly the one unit's (bounded) sum.

The reference is exact rational arithmetic (``fractions.Fraction``) over the
partial's own pair sums, never a float sum.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import orjson
import pytest

from stream_dp.dp.bounds import ClipRange, ContributionBounds
from stream_dp.dp.plan import ReleasePlan
from stream_dp.dp.vectorised_noise import round_to_grid
from stream_dp.dp.vectors import FeatureSpec
from stream_dp.windows import EventSchema, WindowPartial
from stream_dp.windows.exact_sums import PairSumGrid, pair_sum_grid_k, truncate_features

from ._support import NOW_MS, batch_of, event, make_engine

W0 = NOW_MS - 5 * 60_000


def _exact(values) -> Fraction:
    return sum((Fraction(float(v)) for v in values), Fraction(0))


@pytest.mark.parametrize("bound", [20.0, 1.0, 3e-7, 7.5e14, 2.0**40, 1e-305])
def test_pair_sums_are_put_on_a_power_of_two_grid_within_their_bound(bound):
    k = pair_sum_grid_k(bound)
    grid = math.ldexp(1.0, k)
    assert bound / 2**27 < grid <= bound / 2**26  # about 2^26 steps per bound, as the module says
    rng = np.random.default_rng(1)
    inside = rng.uniform(-bound, bound, 10_000)
    beyond = np.array([bound, -bound, np.nextafter(bound, np.inf), -np.nextafter(bound, np.inf), 2 * bound])
    values = np.r_[inside, beyond]
    out = PairSumGrid(-bound, bound, 1).quantise(values, np.ones(len(values), dtype=np.int64))
    steps = np.ldexp(out, -k)
    assert np.array_equal(steps, np.round(steps))  # multiples of the grid
    assert np.all(np.abs(out) <= bound)  # a unit's contribution never grows
    assert np.all(np.abs(out[: len(inside)] - inside) <= grid / 2)  # rounded to the nearest grid point
    assert pair_sum_grid_k(0.0) is None
    assert PairSumGrid(0.0, 0.0, 1).quantise(np.array([3.0]), np.array([1])).tolist() == [0.0]
    with pytest.raises(ValueError, match="max_events_per_group"):
        pair_sum_grid_k(math.inf)


def _window_sum(values: list[float], *, with_target: bool) -> tuple[float, list[float]]:
    """The one group's sum of a window of units 0..n-1 with one event each (and the target's two)."""
    engine, clock = make_engine(max_groups=1, max_events=2, clip=(-10.0, 10.0))
    events = [event(i, W0 + 1, "/a", v) for i, v in enumerate(values)]
    if with_target:
        events += [event("target", W0 + 2, "/a", 10.0), event("target", W0 + 3, "/a", 10.0)]
    engine.process(batch_of(events))
    clock.now_ms += 10 * 60_000
    (partial,) = engine.tick()
    (total,) = partial.aggregate().sum
    return float(total), partial.pair_sum.tolist()


def test_neighbouring_group_sums_differ_by_exactly_the_units_bounded_sum():
    # values with all 53 bits in use: added up in float64 they round at almost every step
    rng = np.random.default_rng(7)
    values = (rng.uniform(-10, 10, 20_000) + rng.uniform(0, 1e-9, 20_000)).tolist()
    without, pairs_d = _window_sum(values, with_target=False)
    with_target, pairs_d2 = _window_sum(values, with_target=True)
    assert Fraction(without) == _exact(pairs_d) and Fraction(with_target) == _exact(pairs_d2)
    # the target's two events of 10 make one pair sum of 20, the bound: the neighbours differ by exactly that
    assert Fraction(with_target) - Fraction(without) == 20


def _adversarial_background(target: float, grid: float) -> list[float]:
    """Pair sums (each within [-20, 20]) whose float total drifts by several ``grid`` steps
    depending on whether ``target`` was added first: the sum sits near 2^20, where a value the
    total without the target adds exactly is a rounding tie for the total with it."""
    climb = [20.0] * int((2.0**20 - 30) // 20)
    values = climb + [2.0**20 - 10 - math.fsum(climb)]
    with_t, without = target + math.fsum(values), math.fsum(values)
    up = True
    while (with_t - without) - target < 3 * grid:
        base = (5 * 2**32 + 1) * 2.0**-32 + 2.0**-33
        for v in (base, base + 2.0**-32):
            v = v if up else -v
            if (with_t + v) - (without + v) >= with_t - without:
                break
        values.append(v)
        with_t, without, up = with_t + v, without + v, not up
    return values


def _one_group_partial(pair_sums: list[float]) -> WindowPartial:
    n = len(pair_sums)
    return WindowPartial(0, 60_000, 0, 0, n - 1, n, [f"u{i}" for i in range(n)], [("/a",)],
                         np.arange(n, dtype=np.int32), np.zeros(n, np.int32), np.full(n, 2, np.int64),
                         np.asarray(pair_sums, dtype=np.float64))


def test_staircase_sum_indices_of_neighbours_stay_within_one_stair_on_an_adversarial_background():
    plan = ReleasePlan.build(mechanism="staircase", epsilon=1.0, bounds=ContributionBounds(1, 2),
                             clip=ClipRange(-10.0, 10.0), aggregations={"sum"})
    law = plan.sum_noise.law
    background = _adversarial_background(20.0, law.grid)
    # unrounded, the float totals drift beyond one stair: the hazard this guards against
    raw = [_one_group_partial(p).aggregate().sum for p in ([20.0, *background], background)]
    raw_gap = int(np.diff([round_to_grid(s, law.grid_k)[0][0] for s in reversed(raw)])[0])
    assert raw_gap > law.steps
    # as the window engine builds partials: each pair sum on its grid first
    grid = PairSumGrid(-10.0, 10.0, 2)
    totals = [_one_group_partial(grid.quantise(np.array(p), np.full(len(p), 2)).tolist()).aggregate().sum
              for p in ([20.0, *background], background)]
    gap = int(round_to_grid(totals[0], law.grid_k)[0][0] - round_to_grid(totals[1], law.grid_k)[0][0])
    assert 0 < gap <= law.steps
    assert Fraction(float(totals[0][0])) - Fraction(float(totals[1][0])) == 20


@pytest.mark.parametrize("kind", ["mean_vector", "covariance"])
def test_neighbouring_feature_sums_differ_by_exactly_the_units_feature_vector(kind):
    schema = EventSchema(unit_field="user_id", timestamp_field="ts", group_by=("page",), vector_fields=("x", "y"))
    spec = FeatureSpec(kind, 2, 5.0)
    rng = np.random.default_rng(11)
    xy = rng.normal(0.0, 3.0, (5_000, 2)) + rng.uniform(0, 1e-9, (5_000, 2))

    def features(with_target: bool) -> np.ndarray:
        engine, clock = make_engine(schema=schema, clip=(0.0, 0.0))
        events = [orjson.dumps({"user_id": i, "ts": W0 + 1, "page": "/a", "x": x, "y": y})
                  for i, (x, y) in enumerate(xy.tolist())]
        if with_target:
            events.append(orjson.dumps({"user_id": "target", "ts": W0 + 2, "page": "/a", "x": 30.0, "y": 40.0}))
        engine.process(batch_of(events))
        clock.now_ms += 10 * 60_000
        (partial,) = engine.tick()
        return partial.aggregate(features=spec).features[0]

    without, with_target = features(False), features(True)
    # the target's vector (30, 40) clipped to norm 5 is (3, 4); its feature, from the README's definition
    augmented = [3.0, 4.0, 5.0]
    feature = augmented if kind == "mean_vector" else [augmented[i] * augmented[j] for i in range(3) for j in range(i, 3)]
    for coordinate, (a, b) in enumerate(zip(with_target.tolist(), without.tolist())):
        # on the grid already, the feature is added exactly: the sums differ by it and nothing more
        assert Fraction(a) - Fraction(b) == Fraction(feature[coordinate])
    assert np.array_equal(truncate_features(np.array([feature]), spec.norm_bound)[0], np.array(feature))


# -- sums within their clip range ------------------------------------------------------------------------------

#: Clip ranges with bounds not exact in binary, negative ones, and ranges across 0.
CLIP_RANGES = [(0.0, 0.1), (0.0, 0.3), (0.1, 0.7), (0.0, 3.3), (-12.34, 0.7), (0.0, 99.99), (0.0, 1000 / 3),
               (-0.3, -0.1), (-1000 / 3, -0.7), (-99.99, 12.34), (0.3, 3.3), (-0.7, 0.0)]


def _reference_pair_sum(float_sum: float, count: int, lo: float, hi: float, max_events: int) -> Fraction:
    """The README's pair sum from its definition, in exact arithmetic: the nearest multiple of
    ``g = 2^(floor(log2 Delta) - 26)`` (ties to the even multiple), moved to the nearest multiple inside
    ``[count lo, count hi]`` if it lies outside."""
    delta = Fraction(max_events * max(abs(lo), abs(hi)))
    e = 0
    while Fraction(2) ** e > delta:
        e -= 1
    while Fraction(2) ** (e + 1) <= delta:
        e += 1
    g = Fraction(2) ** (e - 26)
    steps = Fraction(float_sum) / g
    nearest = math.floor(steps)
    if steps - nearest > Fraction(1, 2) or (steps - nearest == Fraction(1, 2) and nearest % 2):
        nearest += 1
    lowest, highest = math.ceil(count * Fraction(lo) / g), math.floor(count * Fraction(hi) / g)
    return min(max(nearest, lowest), highest) * g


@pytest.mark.parametrize("clip", CLIP_RANGES)
@pytest.mark.parametrize("max_events", [1, 3, 10])
def test_pair_sums_stay_within_what_their_clipped_values_add_up_to(clip, max_events):
    lo, hi = clip
    rng = np.random.default_rng(3)
    pairs: list[list[float]] = []
    for count in range(1, max_events + 1):
        pairs += [[hi] * count, [lo] * count, [hi] * (count - 1) + [lo], [lo] * (count - 1) + [hi]]
        pairs += [np.clip(rng.uniform(lo - 1, hi + 1, count), lo, hi).tolist() for _ in range(20)]
    counts = np.array([len(p) for p in pairs])
    # added up as the window engine adds a pair's values: in float64, in order
    float_sums = np.array([float(np.add.reduceat(np.array(p), [0])[0]) for p in pairs])
    out = PairSumGrid(lo, hi, max_events).quantise(float_sums, counts)
    for value, float_sum, count in zip(out.tolist(), float_sums.tolist(), counts.tolist()):
        assert count * Fraction(lo) <= Fraction(value) <= count * Fraction(hi), (value, count)
        assert Fraction(value) == _reference_pair_sum(float_sum, count, lo, hi, max_events), (float_sum, count)


@pytest.mark.parametrize("clip", CLIP_RANGES)
def test_a_windows_group_sums_stay_within_count_times_the_clip_range(clip):
    """Through the window engine: units at, over and under the clip, with fewer events than the bound; in
    group "/top" every unit's values are at the top (or over it), in "/bottom" at the bottom (or under)."""
    lo, hi = clip
    engine, clock = make_engine(max_groups=1, max_events=10, clip=clip)
    events = []
    for unit in range(90):
        n = 1 + unit % 10  # 1 to 10 events: most units below max_events_per_group
        page, values = [("/top", (hi, hi + 1.0)), ("/bottom", (lo, lo - 1.0)), ("/mixed", (hi, lo, hi + 1.0))][unit % 3]
        events += [event(f"u{unit}", W0 + 1 + i, page, values[i % len(values)]) for i in range(n)]
    engine.process(batch_of(events))
    clock.now_ms += 10 * 60_000
    (partial,) = engine.tick()
    totals = partial.aggregate()
    for count, total in zip(totals.count.tolist(), totals.sum.tolist()):
        assert count * Fraction(lo) <= Fraction(total) <= count * Fraction(hi), (count, total)
    # and the release takes them, with every mechanism
    for mechanism in ("laplace", "gaussian", "staircase"):
        plan = ReleasePlan.build(mechanism=mechanism, epsilon=1.0, delta=1e-6 if mechanism == "gaussian" else 0.0,
                                 bounds=ContributionBounds(1, 10), clip=ClipRange(lo, hi),
                                 aggregations={"count", "sum", "mean"})
        from stream_dp.dp import OpenDPNoise

        plan.release(totals.count, totals.sum, None, OpenDPNoise())


def test_a_clip_range_narrower_than_one_grid_step_is_refused():
    # Delta = 10 * 100: steps of 2^-17 (7.6e-6), of which 100 is a multiple and 100.000001..100.000002 holds none
    with pytest.raises(ValueError, match="narrower than one step"):
        PairSumGrid(100.000001, 100.000002, 10)
    PairSumGrid(100.0, 100.000001, 10)  # one that holds a step is taken, however narrow
