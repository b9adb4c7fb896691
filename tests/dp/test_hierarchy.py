"""Consistent hierarchical estimates against constrained generalised least squares, and rollup helpers.

The statistical test compares mean squared errors over 3,000 repetitions and
fails only beyond 5 standard errors (about one false failure in 3.5 million
runs), while the improvement it checks for is about 100 standard errors.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from stream_dp.dp.hierarchy import aggregate_to_levels, consistent_estimates, rollup_levels
from stream_dp.dp.vectorised_noise import VectorisedExactNoise


def random_tree(rng: np.random.Generator, depth: int) -> tuple[list[int], list[np.ndarray]]:
    """Level sizes and parent arrays with random fan-out (0 to 5 children: some upper nodes have none)."""
    sizes, parents = [int(rng.integers(1, 4))], []
    for _ in range(1, depth):
        fan_out = rng.integers(0, 6, size=sizes[-1])
        if fan_out.sum() == 0:
            fan_out[0] = 1
        parent = np.repeat(np.arange(sizes[-1]), fan_out)
        parents.append(parent[rng.permutation(parent.size)])  # children need not be grouped by parent
        sizes.append(parent.size)
    return sizes, parents


def incidence(sizes: list[int], parents: list[np.ndarray]) -> np.ndarray:
    """Matrix A with x = A theta: node (row, all levels stacked) by leaf (node without children)."""
    has_children = [np.zeros(n, dtype=bool) for n in sizes]
    for level, parent in enumerate(parents, start=1):
        has_children[level - 1][parent] = True
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    leaves = [(level, i) for level, n in enumerate(sizes) for i in range(n) if not has_children[level][i]]
    matrix = np.zeros((offsets[-1], len(leaves)))
    for column, (level, i) in enumerate(leaves):
        while True:
            matrix[offsets[level] + i, column] = 1.0
            if level == 0:
                break
            i, level = parents[level - 1][i], level - 1
    return matrix


def gls_reference(values: list[np.ndarray], variances: list[np.ndarray], parents: list[np.ndarray]) -> list[np.ndarray]:
    """argmin sum_v (x_v - y_v)^2 / var_v over x = A theta, by the normal equations."""
    sizes = [v.size for v in values]
    matrix = incidence(sizes, parents)
    weights = 1.0 / np.concatenate(variances)
    y = np.concatenate(values)
    theta = np.linalg.solve(matrix.T @ (weights[:, None] * matrix), matrix.T @ (weights * y))
    return np.split(matrix @ theta, np.cumsum(sizes)[:-1])


def assert_consistent(estimates: list[np.ndarray], parents: list[np.ndarray]) -> None:
    for level, parent in enumerate(parents, start=1):
        sums = np.bincount(parent, weights=estimates[level], minlength=estimates[level - 1].size)
        has_children = np.bincount(parent, minlength=estimates[level - 1].size) > 0
        scale = max(1.0, float(np.abs(estimates[level]).max(initial=0.0)))
        np.testing.assert_allclose(estimates[level - 1][has_children], sums[has_children], rtol=0, atol=1e-12 * scale)


@pytest.mark.parametrize("seed", range(40))
def test_two_pass_estimates_equal_the_constrained_least_squares_solution(seed: int) -> None:
    rng = np.random.default_rng(seed)
    sizes, parents = random_tree(rng, int(rng.integers(1, 5)))
    values = [rng.normal(0, 50, n) for n in sizes]
    if seed % 2:  # one variance per level, as the releases have
        variances = [np.full(n, rng.uniform(0.1, 100)) for n in sizes]
        given: list = [float(v[0]) for v in variances]
    else:  # or one per node
        variances = [rng.uniform(0.1, 100, n) for n in sizes]
        given = variances
    estimates = consistent_estimates(values, given, parents)
    reference = gls_reference(values, variances, parents)
    for ours, theirs in zip(estimates, reference, strict=True):
        assert ours.dtype == np.float64
        np.testing.assert_allclose(ours, theirs, rtol=1e-9, atol=1e-9)
    assert_consistent(estimates, parents)


def test_consistent_inputs_are_returned_unchanged() -> None:
    rng = np.random.default_rng(3)
    for _ in range(20):
        sizes, parents = random_tree(rng, 4)
        # every node without children gets a free value; the others are the sums of their children
        levels = [rng.normal(0, 1000, n) for n in sizes]
        for level in range(len(sizes) - 1, 0, -1):
            has_children = np.bincount(parents[level - 1], minlength=sizes[level - 1]) > 0
            sums = np.bincount(parents[level - 1], weights=levels[level], minlength=sizes[level - 1])
            levels[level - 1] = np.where(has_children, sums, levels[level - 1])
        estimates = consistent_estimates(levels, [rng.uniform(1, 9) for _ in sizes], parents)
        for ours, given in zip(estimates, levels, strict=True):
            np.testing.assert_allclose(ours, given, rtol=1e-12, atol=1e-9)


def test_single_level_and_worked_example() -> None:
    np.testing.assert_array_equal(consistent_estimates([np.array([3.0, -1.0])], [2.0], [])[0], [3.0, -1.0])
    # root y=10 (variance 1), children y=3, 4 (variance 1 each): z_root = (10 + 7/2) / (1 + 1/2) = 9,
    # residual 9 - 7 = 2 split equally: children 4 and 5
    root, children = consistent_estimates([[10.0], [3.0, 4.0]], [1.0, 1.0], [[0, 0]])
    assert root.tolist() == [9.0] and children.tolist() == [4.0, 5.0]
    # a childless root keeps its value; a parent much noisier than its children follows them
    roots, leaves = consistent_estimates([[7.0, 100.0], [1.0, 2.0]], [1e6, 1.0], [[1, 1]])
    assert roots[0] == 7.0 and roots[1] == pytest.approx(3.0, abs=1e-3)
    assert leaves.sum() == roots[1]


def test_consistency_lowers_the_leaf_error() -> None:
    # country -> region -> city: 3 countries, 4 regions each, 5 cities each; discrete Laplace noise of
    # scale 2 at every level (variance 2q/(1-q)^2, q = e^-1/2)
    parents = [np.repeat(np.arange(3), 4), np.repeat(np.arange(12), 5)]
    truth = aggregate_to_levels(np.random.default_rng(0).integers(0, 500, 60), parents)
    scale = 2.0
    q = math.exp(-1 / scale)
    variance = 2 * q / (1 - q) ** 2
    noise, repetitions = VectorisedExactNoise(), 3000
    draws = [noise.integers(np.tile(level, repetitions), kind="laplace", scale=scale).reshape(repetitions, -1)
             for level in truth]
    raw, consistent = [], []
    for repetition in range(repetitions):
        noisy = [draw[repetition] for draw in draws]
        estimates = consistent_estimates(noisy, [variance] * 3, parents)
        raw.append(np.mean((noisy[-1] - truth[-1]) ** 2.0))
        consistent.append(np.mean((estimates[-1] - truth[-1]) ** 2))
    gain = np.asarray(raw) - np.asarray(consistent)
    standard_error = gain.std(ddof=1) / math.sqrt(gain.size)
    assert gain.mean() - 5 * standard_error > 0
    # and the consistent error is the BLUE's variance (trace of the GLS covariance of the leaves)
    matrix = incidence([3, 12, 60], parents)
    covariance = np.linalg.inv(matrix.T @ matrix / variance)
    expected = float(np.mean(np.diag(covariance)))
    assert expected < variance
    spread = np.std(consistent, ddof=1) / math.sqrt(len(consistent))
    assert abs(np.mean(consistent) - expected) <= 5 * spread


def discrete_laplace_half_width(scale: float, alpha: float = 0.05) -> int:
    """Smallest h with P(|Z| <= h) >= 1 - alpha for P(Z = z) proportional to q^|z|, q = e^(-1/scale):
    P(|Z| > h) = 2 q^(h+1) / (1 + q)."""
    q = math.exp(-1 / scale)
    h = 0
    while 2 * q ** (h + 1) / (1 + q) > alpha:
        h += 1
    return h


def test_each_levels_own_interval_still_covers_its_consistent_count() -> None:
    """Records carry each level's ci95 of its own noisy count; the consistent count, a weighted least
    squares mix of all levels, must fall within it at least 95% of the time at every level (here with
    unequal levels, as a split of [1, 1, 2] gives: scales 8, 8, 4). 4,000 repetitions; fails only below
    95% by more than 5 standard errors of the observed coverage."""
    parents = [np.repeat(np.arange(3), 4), np.repeat(np.arange(12), 5)]
    truth = aggregate_to_levels(np.random.default_rng(1).integers(0, 500, 60), parents)
    scales = [8.0, 8.0, 4.0]
    variances = [2 * math.exp(-1 / b) / (1 - math.exp(-1 / b)) ** 2 for b in scales]
    noise, repetitions = VectorisedExactNoise(), 4000
    draws = [noise.integers(np.tile(level, repetitions), kind="laplace", scale=b).reshape(repetitions, -1)
             for level, b in zip(truth, scales)]
    inside = [0, 0, 0]
    for repetition in range(repetitions):
        estimates = consistent_estimates([d[repetition] for d in draws], variances, parents)
        for level in range(3):
            inside[level] += int(np.sum(np.abs(estimates[level] - truth[level]) <= discrete_laplace_half_width(scales[level])))
    for level in range(3):
        trials = repetitions * truth[level].size
        coverage = inside[level] / trials
        assert coverage >= 0.95 - 5 * math.sqrt(0.95 * 0.05 / trials), (level, coverage)


def test_rollup_levels_sorts_prefixes_and_links_parents() -> None:
    keys = [("fr", "idf", "paris"), ("de", "by", "munich"), ("fr", "ara", "lyon"), ("fr", "idf", "evry"),
            (1, 2, 3), ("de", "be", "berlin")]
    rollup = rollup_levels(keys, 3)
    assert rollup.keys[0] == ((1,), ("de",), ("fr",))  # integers before strings, then in order
    assert rollup.keys[1] == ((1, 2), ("de", "be"), ("de", "by"), ("fr", "ara"), ("fr", "idf"))
    assert rollup.keys[2][-2:] == (("fr", "idf", "evry"), ("fr", "idf", "paris"))
    for level in (1, 2):
        for child, parent in zip(rollup.keys[level], rollup.parents[level - 1], strict=True):
            assert rollup.keys[level - 1][parent] == child[:-1]
    assert [rollup.keys[2][i] for i in rollup.leaf_index] == keys
    assert rollup_levels(list(reversed(keys)), 3).keys == rollup.keys  # the input order does not matter
    # a shallower rollup of the same keys: the leaves are the distinct prefixes
    two = rollup_levels(keys, 2)
    assert len(two.keys) == 2 and two.keys[1] == rollup.keys[1]
    assert [two.keys[1][i] for i in two.leaf_index] == [k[:2] for k in keys]


def test_aggregate_to_levels_sums_leaves_exactly() -> None:
    rollup = rollup_levels([("a", "x"), ("a", "y"), ("b", "z")], 2)
    values = np.array([2**62, 1, 5], dtype=np.int64)
    top, leaves = aggregate_to_levels(values, rollup.parents)
    assert top.dtype == np.int64 and top.tolist() == [2**62 + 1, 5]
    assert leaves is values or np.array_equal(leaves, values)
    levels = aggregate_to_levels(np.array([1.5, 2.5]), [np.array([0, 2])], top_size=4)
    assert levels[0].tolist() == [1.5, 0.0, 2.5, 0.0]
    assert aggregate_to_levels(np.array([1, 2]), [])[0].tolist() == [1, 2]


@pytest.mark.parametrize(("call", "message"), [
    (lambda: rollup_levels([("a", "b")], 0), "positive int"),
    (lambda: rollup_levels([("a",)], 2), "at least depth=2 parts"),
    (lambda: rollup_levels([("a", 1.5)], 2), "strings or integers"),
    (lambda: rollup_levels([("a", True)], 2), "strings or integers"),
    (lambda: rollup_levels("ab", 1), "list of tuples"),
    (lambda: aggregate_to_levels(np.array([1, 2]), [np.array([0])]), "one entry per node of level 1"),
    (lambda: aggregate_to_levels(np.array([1, 2]), [np.array([0, 3])], top_size=2), "must index the 2 nodes"),
    (lambda: aggregate_to_levels(np.array(["a"]), []), "numeric vector"),
    (lambda: consistent_estimates([], [], []), "non-empty list"),
    (lambda: consistent_estimates([[1.0], [1.0, 2.0]], [1.0], [[0, 0]]), "one entry per level"),
    (lambda: consistent_estimates([[1.0], [1.0, 2.0]], [1.0, 0.0], [[0, 0]]), "positive and finite"),
    (lambda: consistent_estimates([[1.0], [1.0, 2.0]], [1.0, [1.0]], [[0, 0]]), "one per node"),
    (lambda: consistent_estimates([[1.0], [1.0, 2.0]], [1.0, 1.0], []), "need 1 parent arrays"),
    (lambda: consistent_estimates([[1.0], [1.0, 2.0]], [1.0, 1.0], [[0, 1]]), "must index the 1 nodes"),
    (lambda: consistent_estimates([[1.0], [1.0, 2.0]], [1.0, 1.0], [[0.0, 0.0]]), "integer vector"),
    (lambda: consistent_estimates([[1.0], [np.nan, 2.0]], [1.0, 1.0], [[0, 0]]), "NaN"),
])
def test_bad_inputs_are_refused_with_a_fix(call: object, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        call()  # type: ignore[operator]


def _gaussian_hierarchy_rho_shortfall(l0: int, linf: int) -> list[float]:
    """Per level of a Gaussian count hierarchy: the zCDP a worst-case unit needs, over what the level states.

    Needed: ``Delta_2^2 / (2 sigma^2)`` (Bun & Steinke 2016) with the worst unit from the README: all its
    ``L0 * Linf`` events under one parent at a coarser level, ``L0`` groups of ``Linf`` at the finest.
    """
    from stream_dp.dp.bounds import ContributionBounds
    from stream_dp.dp.query_plan import QueryPlan

    plan = QueryPlan.build(mechanism="gaussian", epsilon=1.0, delta=1e-6, bounds=ContributionBounds(l0, linf),
                           clip=None, aggregations=["count"], hierarchy_split=[1, 1, 2])
    worst_l2 = [l0 * linf, l0 * linf, math.sqrt(l0) * linf]
    ratios = []
    for level, delta_2 in zip(plan.levels, worst_l2, strict=True):
        sigma = level.describe()["count_scale"]
        ratios.append(delta_2**2 / (2 * sigma**2) / level.loss.rho)
    assert sum(level.loss.rho for level in plan.levels) == pytest.approx(plan.loss.rho, rel=1e-12)
    assert plan.loss.epsilon <= 1.0 and plan.loss.delta <= 1e-6 * (1 + 1e-12)
    return ratios


@pytest.mark.parametrize(("l0", "linf"), [(1, 1), (3, 2), (10, 1)])
def test_gaussian_levels_cover_a_unit_with_all_its_events_under_one_parent(l0: int, linf: int) -> None:
    assert max(_gaussian_hierarchy_rho_shortfall(l0, linf)) <= 1 + 1e-9


def test_the_level_check_catches_coarse_levels_calibrated_at_the_finest_bounds(monkeypatch) -> None:
    from stream_dp.dp import query_plan

    monkeypatch.setattr(query_plan, "_coarse_bounds", lambda bounds: bounds)  # the doctored calibration
    ratios = _gaussian_hierarchy_rho_shortfall(3, 2)
    assert ratios[0] == pytest.approx(3.0, rel=1e-6) and ratios[-1] <= 1 + 1e-9  # (3*2)^2 / (sqrt(3)*2)^2


@pytest.mark.parametrize(("l0", "linf"), [(1, 1), (3, 2), (10, 1)])
def test_laplace_levels_cover_the_worst_unit_and_add_up_to_the_query_epsilon(l0: int, linf: int) -> None:
    """Laplace counts: a unit moves every level by at most ``L0 * Linf`` in l1 (its events in L0 leaves, or all
    under one parent), so level ``l`` needs a scale of at least ``L0 * Linf / epsilon_l``, and the levels'
    epsilons add up to the query's (basic composition)."""
    from stream_dp.dp.bounds import ContributionBounds
    from stream_dp.dp.query_plan import QueryPlan

    plan = QueryPlan.build(mechanism="laplace", epsilon=1.0, delta=0.0, bounds=ContributionBounds(l0, linf),
                           clip=None, aggregations=["count"], hierarchy_split=[1, 1, 2])
    for level in plan.levels:
        assert l0 * linf / level.describe()["count_scale"] <= level.loss.epsilon * (1 + 1e-9)
    assert [level.loss.epsilon for level in plan.levels] == pytest.approx([0.25, 0.25, 0.5])
    assert sum(level.loss.epsilon for level in plan.levels) <= 1.0 * (1 + 1e-12)
