"""Policy objects: validation with helpful messages, fixed-point rounding, zCDP conversion."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from stream_dp.budget import BudgetPolicy, HorizonLimit, NamespacePolicy
from stream_dp.budget.policy import (
    format_duration_ms,
    policy_from_config,
    to_units_down,
    to_units_up,
    zcdp_to_epsilon,
)
from stream_dp.config import ConfigError, parse_config

HOUR_MS = 3_600_000


def test_fixed_point_rounds_charges_up_and_limits_down() -> None:
    assert to_units_up(0.1) == 100_000
    assert to_units_up(0.3000001) == 300_001
    assert to_units_up(1e-7) == 1  # below one micro-unit still costs one
    assert to_units_up(0.30000000000000004) == 300_001  # the float sum 0.1 + 0.2 is above 0.3
    assert to_units_down(0.9999999) == 999_999
    assert to_units_down(1.0) == 1_000_000


def test_ten_charges_of_a_tenth_fit_a_limit_of_one() -> None:
    # In floats, 0.1 added ten times is 0.9999999999999999; in micro-units it is exactly the limit.
    assert 10 * to_units_up(0.1) == to_units_down(1.0)


def test_zcdp_conversion_matches_bun_steinke() -> None:
    rho, delta = 0.5, 1e-6
    assert zcdp_to_epsilon(rho, delta) == pytest.approx(rho + 2 * math.sqrt(rho * math.log(1 / delta)))
    with pytest.raises(ValueError, match="delta"):
        zcdp_to_epsilon(0.5, 0.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"horizon_ms": 0, "limit": 1.0}, "positive integer number of milliseconds"),
        ({"horizon_ms": 1.5, "limit": 1.0}, "positive integer"),
        ({"horizon_ms": HOUR_MS, "limit": 1.0, "buckets": 7}, "not divisible by buckets=7"),
        ({"horizon_ms": HOUR_MS, "limit": 1.0, "buckets": 0}, r"buckets must be an integer in \[1, 255\]"),
        ({"horizon_ms": HOUR_MS, "limit": 0.0}, "at least 1e-6"),
        ({"horizon_ms": HOUR_MS, "limit": float("inf")}, "finite number"),
        ({"horizon_ms": HOUR_MS, "limit": 5000.0}, "too large"),
    ],
)
def test_horizon_limit_rejects_bad_values(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HorizonLimit(**kwargs)


def test_horizon_limit_derived_values() -> None:
    h = HorizonLimit(HOUR_MS, 1.25, buckets=4)
    assert (h.bucket_ms, h.limit_units, h.label) == (900_000, 1_250_000, "1h")
    assert format_duration_ms(90_000) == "90s"
    assert format_duration_ms(1_500) == "1500ms"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "a:b"}, "no ':'"),
        ({"accounting": "delta"}, "'epsilon' or 'rho'"),
        ({"horizons": []}, "at least one HorizonLimit"),
        ({"horizons": [HorizonLimit(HOUR_MS, 1.0), HorizonLimit(HOUR_MS, 2.0)]}, "share a horizon"),
        ({"alert_at": (1.0, 0.8)}, "strictly increasing"),
        ({"alert_at": (0.5, 1.5)}, r"in \(0, 1\]"),
    ],
)
def test_namespace_policy_rejects_bad_values(kwargs: dict, message: str) -> None:
    args = {"name": "users", "accounting": "epsilon", "horizons": [HorizonLimit(HOUR_MS, 1.0)]} | kwargs
    with pytest.raises(ValueError, match=message):
        NamespacePolicy(**args)


def test_threshold_and_cost_units() -> None:
    ns = NamespacePolicy("users", "epsilon", [HorizonLimit(HOUR_MS, 1.0)], alert_at=(0.8, 1.0))
    assert ns.threshold_units(ns.horizons[0]) == (800_000, 1_000_000)
    assert ns.cost_units(0.25) == (250_000,)
    with pytest.raises(ValueError, match="exceeds the 1h limit"):
        ns.cost_units(1.5)
    with pytest.raises(ValueError, match="finite positive epsilon"):
        ns.cost_units(-0.1)
    with pytest.raises(ValueError, match="finite positive epsilon"):
        ns.cost_units(float("nan"))


def test_rho_namespace_reports_epsilon_delta() -> None:
    ns = NamespacePolicy("devices", "rho", [HorizonLimit(HOUR_MS, 0.5)], report_delta=1e-6)
    epsilon, delta = ns.to_epsilon_delta(0.5)
    assert delta == 1e-6
    assert epsilon == pytest.approx(zcdp_to_epsilon(0.5, 1e-6))
    assert NamespacePolicy("users", "epsilon", [HorizonLimit(HOUR_MS, 1.0)]).to_epsilon_delta(0.5) == (0.5, None)


def test_budget_policy_lookup_names_known_namespaces() -> None:
    policy = BudgetPolicy([NamespacePolicy("users", "epsilon", [HorizonLimit(HOUR_MS, 1.0)])])
    assert policy.namespace("users").name == "users"
    with pytest.raises(KeyError, match="known namespaces: users"):
        policy.namespace("devices")
    with pytest.raises(ValueError, match="defined twice"):
        BudgetPolicy([policy.namespace("users"), policy.namespace("users")])
    with pytest.raises(ValueError, match="at least one namespace"):
        BudgetPolicy([])


def test_delta_limits_are_pico_units_and_labelled_apart() -> None:
    limit = HorizonLimit(3_600_000, 1e-5, delta=True)
    assert limit.limit_units == 10_000_000 and limit.label == "1h-delta"
    ns = NamespacePolicy("users", "epsilon", [HorizonLimit(3_600_000, 1.0), limit])
    assert ns.cost_units(0.25, 1e-6) == (250_000, 1_000_000)
    assert ns.cost_units(0.25) == (250_000, 0)
    with pytest.raises(ValueError, match="exceeds the 1h-delta limit"):
        ns.cost_units(0.25, 2e-5)


@pytest.mark.parametrize(
    ("horizons", "accounting", "message"),
    [
        ([HorizonLimit(3_600_000, 1e-5, delta=True)], "epsilon", "every limit bounds delta"),
        ([HorizonLimit(3_600_000, 0.5), HorizonLimit(3_600_000, 1e-5, delta=True)], "rho", "holds no delta limit"),
        ([HorizonLimit(3_600_000, 1.0), HorizonLimit(3_600_000, 1e-5, delta=True),
          HorizonLimit(3_600_000, 1e-6, delta=True)], "epsilon", "share a horizon"),
    ],
)
def test_delta_limits_are_validated(horizons, accounting, message) -> None:
    with pytest.raises(ValueError, match=message):
        NamespacePolicy("users", accounting, horizons)


def test_delta_limits_fit_the_ledger() -> None:
    with pytest.raises(ValueError, match="delta limits up to 0.00429"):
        HorizonLimit(3_600_000, 0.01, delta=True)
    with pytest.raises(ValueError, match="at least 1e-12"):
        HorizonLimit(3_600_000, 1e-13, delta=True)


def test_the_privacy_page_states_the_report_delta_a_rho_namespace_of_a_file_is_reported_at() -> None:
    """The privacy page's statement of how `budget show` reports a ρ namespace is what a loaded file gives: a
    fixed δ, not a setting of the file (which refuses `report_delta` as an unknown field)."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "privacy" / "index.md").read_text()
    stated = re.search(r"`budget show`\s+states the spend as \(ε, δ\) at δ = ([0-9e.-]+), fixed for every ρ namespace "
                       r"\(not\s+a setting of the file\)", page)
    assert stated is not None, "docs/privacy/index.md no longer states the δ a ρ namespace is reported at"
    document = {"namespaces": {"devices": {"budgets": [{"horizon": "1h", "rho": 0.5}]}},
                "queries": [{"name": "q", "input_topic": "i", "output_topic": "o",
                             "privacy_unit": {"namespace": "devices", "field": "d"}, "timestamp_field": "ts",
                             "window": {"size": "1m"}, "group_by": ["g"], "groups": {"public": ["a"]},
                             "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1},
                             "aggregations": {"count": {}}, "epsilon": 0.5}]}
    namespace = policy_from_config(parse_config(document)).namespace("devices")
    assert namespace.to_epsilon_delta(0.5)[1] == float(stated.group(1))
    document["namespaces"]["devices"]["report_delta"] = 1e-6
    with pytest.raises(ConfigError, match=r"namespaces\.devices\.report_delta: unknown field"):
        parse_config(document)
