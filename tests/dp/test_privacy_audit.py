"""Empirical privacy audit of the count release.

Two neighbouring inputs differ by one privacy unit contributing the maximum
(``max_events_per_group`` events in each of ``max_groups_per_unit`` groups).
Each group of a release gets independent noise, so one release of N copies of
a group is N independent releases of it. From the released values (or a
statistic of them, which is post-processing and can only hide loss) we build
histograms and, for every value seen at least MIN_COUNT times on both sides,
a lower confidence bound on ``|log P(value | D) - log P(value | D')|``:

    |r| - z * se,   se^2 = 1/c - 1/n + 1/c' - 1/n'   (delta method),

with ``z`` Bonferroni-corrected so that all bounds hold together with
probability 1 - 1e-4. The largest bound is a lower bound on the true epsilon:
a correct mechanism exceeds its claim with probability below 1e-4, and one
whose scale is halved (true epsilon twice the claim) is caught.
"""

from __future__ import annotations

import dataclasses
from statistics import NormalDist

import numpy as np

from stream_dp.dp import ContributionBounds, OpenDPNoise, ReleasePlan

FAMILY_ERROR = 1e-4
MIN_COUNT = 300
DRAWS = 40_000


def _histogram(sample: np.ndarray, values: np.ndarray) -> np.ndarray:
    seen, counts = np.unique(sample, return_counts=True)
    histogram = np.zeros(values.size)
    histogram[np.searchsorted(values, seen)] = counts
    return histogram


def epsilon_lower_bound(released: np.ndarray, neighbour: np.ndarray) -> float:
    values = np.union1d(released, neighbour)
    counts = _histogram(released, values)
    neighbour_counts = _histogram(neighbour, values)
    usable = (counts >= MIN_COUNT) & (neighbour_counts >= MIN_COUNT)
    counts, neighbour_counts = counts[usable], neighbour_counts[usable]
    assert counts.size >= 5, "too few bins with enough mass to audit"
    n, n_neighbour = released.size, neighbour.size
    log_ratio = np.log(counts / n) - np.log(neighbour_counts / n_neighbour)
    standard_error = np.sqrt(1 / counts - 1 / n + 1 / neighbour_counts - 1 / n_neighbour)
    z = NormalDist().inv_cdf(1 - FAMILY_ERROR / (2 * counts.size))
    return float(np.max(np.abs(log_ratio) - z * standard_error))


def release_counts(plan: ReleasePlan, counts: list[int], noise: OpenDPNoise, draws: int = DRAWS) -> np.ndarray:
    """``draws`` independent releases of the given groups, one row per release."""
    tiled = np.tile(np.asarray(counts, dtype=np.int64), draws)
    release = plan.release(tiled, None, None, noise)
    assert release.count is not None
    return release.count.reshape(draws, len(counts))


def halve_the_noise(plan: ReleasePlan) -> ReleasePlan:
    """A broken plan: same claimed loss, half the count noise."""
    assert plan.count_noise is not None
    broken = dataclasses.replace(plan.count_noise, scale=plan.count_noise.scale / 2)
    return dataclasses.replace(plan, count_noise=broken)


def test_count_release_does_not_leak_more_than_claimed(noise: OpenDPNoise) -> None:
    epsilon = 1.0
    plan = ReleasePlan.build(mechanism="laplace", epsilon=epsilon, bounds=ContributionBounds(1, 2))
    released = release_counts(plan, [50], noise)[:, 0]
    neighbour = release_counts(plan, [52], noise)[:, 0]  # one unit added: +2 events
    assert epsilon_lower_bound(released, neighbour) <= plan.loss.epsilon


def test_audit_detects_a_mechanism_with_half_the_noise(noise: OpenDPNoise) -> None:
    plan = halve_the_noise(ReleasePlan.build(mechanism="laplace", epsilon=1.0, bounds=ContributionBounds(1, 2)))
    released = release_counts(plan, [50], noise)[:, 0]
    neighbour = release_counts(plan, [52], noise)[:, 0]
    assert epsilon_lower_bound(released, neighbour) > plan.loss.epsilon


def test_multi_group_count_release_does_not_leak_more_than_claimed(noise: OpenDPNoise) -> None:
    # the unit touches three groups; the audited statistic is their total (post-processing)
    plan = ReleasePlan.build(mechanism="laplace", epsilon=1.5, bounds=ContributionBounds(3, 1))
    released = release_counts(plan, [30, 40, 50], noise).sum(axis=1)
    neighbour = release_counts(plan, [31, 41, 51], noise).sum(axis=1)
    assert epsilon_lower_bound(released, neighbour) <= plan.loss.epsilon
    broken = halve_the_noise(plan)
    released = release_counts(broken, [30, 40, 50], noise).sum(axis=1)
    neighbour = release_counts(broken, [31, 41, 51], noise).sum(axis=1)
    assert epsilon_lower_bound(released, neighbour) > broken.loss.epsilon
