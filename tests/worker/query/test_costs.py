"""What one window charges a unit, per accounting mode (pure logic)."""

from __future__ import annotations

import pytest

from stream_dp.config import parse_config
from stream_dp.worker.query.costs import WorkerConfigError, build_plan, window_cost


def _query(**settings):
    query = {"name": "q", "input_topic": "i", "output_topic": "o",
             "privacy_unit": {"namespace": "n", "field": "user_id"}, "timestamp_field": "ts",
             "window": {"size": "1m"}, "group_by": ["page"], "groups": {"public": ["a"]},
             "bounds": {"max_groups_per_unit": 1, "max_events_per_group": 1}, "aggregations": {"count": {}},
             "epsilon": 1.0}
    query.update(settings)
    budget = {"horizon": "1h", "epsilon": 100.0, "delta": 1e-3}
    return parse_config({"namespaces": {"n": {"budgets": [budget]}}, "queries": [query]}).queries[0]


def test_epsilon_namespaces_are_charged_epsilon_and_delta():
    assert window_cost(build_plan(_query()), "epsilon", "q") == (pytest.approx(1.0), 0.0)
    cost, delta = window_cost(build_plan(_query(mechanism="gaussian", delta=1e-6)), "epsilon", "q")
    assert cost == pytest.approx(1.0) and delta == pytest.approx(1e-6)
    cost, delta = window_cost(build_plan(_query(groups={"select": {"delta": 1e-6}})), "epsilon", "q")
    assert cost == pytest.approx(1.0) and 0 < delta <= 1e-6


def test_rho_namespaces_are_charged_rho_only():
    plan = build_plan(_query(mechanism="gaussian", delta=1e-6))
    assert window_cost(plan, "rho", "q") == (plan.loss.rho, 0.0)  # the Gaussian's own zCDP loss
    # pure epsilon-DP is (epsilon^2 / 2)-zCDP
    assert window_cost(build_plan(_query(epsilon=0.5)), "rho", "q") == (pytest.approx(0.125), 0.0)
    with pytest.raises(WorkerConfigError, match="partition selection spends delta"):
        window_cost(build_plan(_query(groups={"select": {"delta": 1e-6}})), "rho", "q")


def test_continual_releases_are_refused_in_rho_namespaces():
    """A unit charged the period twice (seen in a second partition) may fill 2W windows of one tree:
    each level moves 2 W Delta, so its pure loss per level doubles (2 eps_l, paid for twice: sound in
    epsilon) while its zCDP bound (2 eps_l)^2 / 2 quadruples (paid for twice: half of it)."""
    query = _query(window={"size": "1h"}, continual={"period": "1d"})
    plan = build_plan(query)
    assert window_cost(plan, "epsilon", "q") == (pytest.approx(1.0), 0.0)
    with pytest.raises(WorkerConfigError, match=r"continual release.*account its namespace in epsilon"):
        window_cost(plan, "rho", "q")
