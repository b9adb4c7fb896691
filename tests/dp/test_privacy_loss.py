"""PrivacyLoss: composition and conversions, checked against OpenDP's own maps."""

from __future__ import annotations

import math

import opendp.prelude as dp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream_dp.dp import PrivacyLoss, cdp_delta, zcdp_epsilon, zcdp_rho


def _gaussian_with_rho(rho: float) -> tuple[object, float]:
    """An OpenDP Gaussian measurement and the rho its map certifies at d_in=1."""
    dp.enable_features("contrib")
    measurement = dp.m.make_gaussian(
        dp.atom_domain(T=float, nan=False), dp.absolute_distance(T=float), scale=1.0 / math.sqrt(2.0 * rho)
    )
    return measurement, float(measurement.map(1.0))


def _laplace_with_epsilon(epsilon: float) -> object:
    dp.enable_features("contrib")
    return dp.m.make_laplace(dp.atom_domain(T=float, nan=False), dp.absolute_distance(T=float), scale=1.0 / epsilon)


rhos = st.floats(1e-4, 10.0)
deltas = st.floats(1e-12, 1e-2)


@settings(max_examples=40, deadline=None)
@given(rhos, st.floats(0.01, 20.0))
def test_cdp_delta_matches_opendps_profile(rho: float, epsilon: float) -> None:
    measurement, certified_rho = _gaussian_with_rho(rho)
    profile = dp.c.make_zCDP_to_approxDP(measurement).map(1.0)
    assert cdp_delta(certified_rho, epsilon) == pytest.approx(profile.delta(epsilon), rel=1e-6, abs=1e-300)


@settings(max_examples=40, deadline=None)
@given(rhos, deltas)
def test_zcdp_epsilon_matches_opendps_fix_delta(rho: float, delta: float) -> None:
    measurement, certified_rho = _gaussian_with_rho(rho)
    fixed = dp.c.make_fix_delta(dp.c.make_zCDP_to_approxDP(measurement), delta)
    opendp_epsilon, opendp_delta = fixed.map(1.0)
    assert opendp_delta == delta
    assert zcdp_epsilon(certified_rho, delta) == pytest.approx(opendp_epsilon, rel=1e-6)
    assert PrivacyLoss.from_zcdp(certified_rho, delta).epsilon == pytest.approx(opendp_epsilon, rel=1e-6)


@settings(max_examples=40, deadline=None)
@given(st.floats(0.01, 20.0), deltas)
def test_zcdp_rho_is_the_largest_rho_within_the_budget(epsilon: float, delta: float) -> None:
    rho = zcdp_rho(epsilon, delta)
    assert cdp_delta(rho, epsilon) <= delta
    assert cdp_delta(rho * (1 + 1e-6), epsilon) > delta
    assert zcdp_epsilon(rho, delta) <= epsilon * (1 + 1e-9)


def test_zcdp_conversion_is_tighter_than_bun_steinke() -> None:
    # Bun & Steinke 2016 Prop. 1.3: rho + 2 sqrt(rho ln(1/delta)) is valid but looser
    rho, delta = 0.5, 1e-6
    assert zcdp_epsilon(rho, delta) < rho + 2 * math.sqrt(rho * math.log(1 / delta))


@pytest.mark.parametrize("epsilon", [0.01, 0.5, 3.0])
def test_pure_dp_is_half_epsilon_squared_zcdp_like_opendp(epsilon: float) -> None:
    dp.enable_features("contrib")
    opendp_rho = dp.c.make_pureDP_to_zCDP(_laplace_with_epsilon(epsilon)).map(1.0)
    assert PrivacyLoss.pure(epsilon).rho == pytest.approx(opendp_rho, rel=1e-12)


def test_sequential_composition_matches_opendp() -> None:
    dp.enable_features("contrib")
    laplaces = [_laplace_with_epsilon(0.3), _laplace_with_epsilon(0.7)]
    composed_epsilon = dp.c.make_composition(laplaces).map(1.0)
    assert (PrivacyLoss.pure(0.3) + PrivacyLoss.pure(0.7)).epsilon == pytest.approx(composed_epsilon)
    gaussians = [_gaussian_with_rho(0.02)[0], _gaussian_with_rho(0.05)[0]]
    composed_rho = dp.c.make_composition(gaussians).map(1.0)
    total = PrivacyLoss.from_zcdp(0.02, 1e-6) + PrivacyLoss.from_zcdp(0.05, 1e-6)
    assert total.rho == pytest.approx(composed_rho, rel=1e-9)
    assert total.delta == pytest.approx(2e-6)


def test_adding_a_loss_without_rho_drops_the_zcdp_statement() -> None:
    total = PrivacyLoss.pure(0.5) + PrivacyLoss(0.2, 1e-7)
    assert (total.epsilon, total.delta, total.rho) == (0.7, 1e-7, None)


def test_basic_composition_by_multiplication() -> None:
    loss = 3 * PrivacyLoss(0.1, 1e-7, rho=0.005)
    assert loss.epsilon == pytest.approx(0.3)
    assert loss.delta == pytest.approx(3e-7)
    assert loss.rho == pytest.approx(0.015)
    assert loss == PrivacyLoss(0.1, 1e-7, rho=0.005) * 3


def test_advanced_composition_known_value() -> None:
    # Dwork & Roth Thm 3.20 by hand: sqrt(2*100*ln(1e6))*0.1 + 100*0.1*(e^0.1 - 1) = 5.25652 + 1.05171 = 6.30823
    loss = PrivacyLoss(0.1, 1e-8).advanced_composition(100, 1e-6)
    assert loss.epsilon == pytest.approx(6.308231, rel=1e-6)
    assert loss.delta == pytest.approx(100 * 1e-8 + 1e-6)


def test_advanced_composition_beats_basic_only_for_many_small_steps() -> None:
    small = PrivacyLoss(0.01)
    assert small.advanced_composition(10_000, 1e-6).epsilon < (small * 10_000).epsilon
    large = PrivacyLoss(1.0)
    assert large.advanced_composition(3, 1e-6).epsilon > (large * 3).epsilon


def test_to_approx_dp_takes_the_tighter_statement() -> None:
    many_windows = PrivacyLoss.pure(0.1) * 1000  # epsilon 100, rho 5
    at_delta = many_windows.to_approx_dp(1e-6)
    assert at_delta.epsilon == pytest.approx(zcdp_epsilon(5.0, 1e-6))
    assert at_delta.epsilon < 100
    single = PrivacyLoss.pure(0.1)
    assert single.to_approx_dp(1e-6).epsilon == pytest.approx(0.1)


def test_to_approx_dp_refuses_a_smaller_delta_without_rho() -> None:
    with pytest.raises(ValueError, match="ask for delta >= 1e-06"):
        PrivacyLoss(1.0, 1e-6).to_approx_dp(1e-9)


@pytest.mark.parametrize(
    ("kwargs", "error", "hint"),
    [
        ({"epsilon": -0.1}, ValueError, "never negative"),
        ({"epsilon": math.nan}, ValueError, "must be finite"),
        ({"epsilon": math.inf}, ValueError, "must be finite"),
        ({"epsilon": "1"}, TypeError, "real number"),
        ({"epsilon": 1.0, "delta": 1.0}, ValueError, "delta must be in"),
        ({"epsilon": 1.0, "delta": -1e-9}, ValueError, "small"),
        ({"epsilon": 1.0, "rho": -0.1}, ValueError, "rho must be >= 0"),
    ],
)
def test_privacy_loss_validation(kwargs: dict, error: type[Exception], hint: str) -> None:
    with pytest.raises(error, match=hint):
        PrivacyLoss(**kwargs)


def test_conversions_need_a_positive_delta() -> None:
    with pytest.raises(ValueError, match="pass a small delta"):
        zcdp_epsilon(0.1, 0.0)
    with pytest.raises(ValueError, match="mechanism='laplace'"):
        zcdp_rho(1.0, 0.0)
    with pytest.raises(ValueError, match="positive int"):
        PrivacyLoss(0.1).advanced_composition(0, 1e-6)


def test_to_dict_is_plain_data() -> None:
    assert PrivacyLoss.pure(0.5).to_dict() == {"epsilon": 0.5, "delta": 0.0, "rho": 0.125}
