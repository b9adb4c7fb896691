"""The epsilon lower bound against mechanisms whose privacy loss is known exactly.

Samples come from numpy's generator (reference distributions for testing
only; the product draws its noise from OpenDP). Each check holds except with
a probability far below 1e-3 (the bound's own alpha is 1%, and the margins
below are several standard errors wide).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.audit.stats import binary_renyi, clopper_pearson, epsilon_lower_bound, grid, rho_lower_bound

N = 3_000


def discrete_laplace(rng: np.random.Generator, epsilon: float, size: int) -> np.ndarray:
    """Two-sided geometric noise, P[k] proportional to exp(-epsilon |k|): epsilon-DP for a count."""
    p = 1 - math.exp(-epsilon)
    return rng.geometric(p, size) - rng.geometric(p, size)


def test_clopper_pearson_brackets_the_proportion_and_matches_known_values():
    lower, upper = clopper_pearson(50, 100, 0.025)
    assert 0.39 < lower < 0.5 < upper < 0.61
    assert clopper_pearson(0, 10, 0.05) == (0.0, pytest.approx(1 - 0.05 ** (1 / 10)))
    assert clopper_pearson(10, 10, 0.05) == (pytest.approx(0.05 ** (1 / 10)), 1.0)
    with pytest.raises(ValueError):
        clopper_pearson(3, 2, 0.05)


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 2.0])
def test_a_sound_count_release_is_bounded_below_its_epsilon_and_close_to_it(epsilon):
    rng = np.random.default_rng(int(epsilon * 100))
    d = 10 + discrete_laplace(rng, epsilon, N)
    d_prime = 11 + discrete_laplace(rng, epsilon, N)  # one more unit
    bound = epsilon_lower_bound(d, d_prime, list(range(22)))
    assert bound.epsilon <= epsilon
    assert bound.epsilon > 0.55 * epsilon  # the test has power: it sees most of the loss


def test_a_unit_counted_three_times_is_caught():
    rng = np.random.default_rng(3)
    d = 10 + discrete_laplace(rng, 1.0, N)
    d_prime = 13 + discrete_laplace(rng, 1.0, N)  # the release claims epsilon 1 but the unit counts 3
    assert epsilon_lower_bound(d, d_prime, list(range(25))).epsilon > 1.8


def test_identical_mechanisms_give_no_loss():
    rng = np.random.default_rng(4)
    d, d_prime = 10 + discrete_laplace(rng, 1.0, N), 10 + discrete_laplace(rng, 1.0, N)
    assert epsilon_lower_bound(d, d_prime, grid(d, d_prime)).epsilon < 0.25


def test_delta_is_subtracted_for_gaussian_releases():
    """Gaussian noise of sigma = sqrt(2 ln(1.25/delta)) / epsilon is (epsilon, delta)-DP for sensitivity 1."""
    rng = np.random.default_rng(5)
    epsilon, delta = 1.0, 1e-5
    sigma = math.sqrt(2 * math.log(1.25 / delta)) / epsilon
    d, d_prime = rng.normal(0.0, sigma, N), rng.normal(1.0, sigma, N)
    bound = epsilon_lower_bound(d, d_prime, grid(d, d_prime), delta=delta)
    assert bound.epsilon <= epsilon
    shifted = rng.normal(4 * sigma, sigma, N)  # a release far more sensitive than claimed
    assert epsilon_lower_bound(d, shifted, grid(d, shifted), delta=delta).epsilon > epsilon


def test_inputs_are_checked():
    with pytest.raises(ValueError):
        epsilon_lower_bound([], [1.0], [0.0])
    with pytest.raises(ValueError):
        epsilon_lower_bound([1.0], [1.0], [])


def test_binary_renyi_divergence_matches_closed_forms():
    p, q = 0.3, 0.1
    kl = p * math.log(p / q) + (1 - p) * math.log((1 - p) / (1 - q))
    assert binary_renyi(p, q, 1.0) == pytest.approx(kl)
    assert binary_renyi(p, q, 2.0) == pytest.approx(math.log(p * p / q + (1 - p) ** 2 / (1 - q)))
    assert binary_renyi(p, q, 1.0 + 1e-7) == pytest.approx(kl, rel=1e-5)  # KL is the limit at order 1
    assert binary_renyi(0.4, 0.4, 3.0) == pytest.approx(0.0, abs=1e-15)


def test_the_rho_bound_holds_for_gaussian_noise_and_sees_it_halved():
    """Gaussian noise of sd sigma on a value one unit moves by 1 is rho = 1 / (2 sigma^2)-zCDP: the bound stays
    under rho, and sees noise of sigma / 2 (four times the rho) at 12,800 samples (as the audit's controls)."""
    rng = np.random.default_rng(6)
    n, sigma = 12_800, 4.0
    rho = 1 / (2 * sigma**2)
    d, d_prime = rng.normal(0.0, sigma, n), rng.normal(1.0, sigma, n)
    assert rho_lower_bound(d, d_prime, grid(d, d_prime, 12)).rho <= rho
    d, d_prime = rng.normal(0.0, sigma / 2, n), rng.normal(1.0, sigma / 2, n)
    assert rho_lower_bound(d, d_prime, grid(d, d_prime, 12)).rho > rho
    same = rng.normal(0.0, sigma, n)
    assert rho_lower_bound(d, same, [0.0], orders=(2.0,)).rho >= 0.0  # never negative
    with pytest.raises(ValueError):
        rho_lower_bound([], [1.0], [0.0])
