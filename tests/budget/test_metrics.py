"""Budget metrics: what a charge records, the incremental threshold gauge, no unit ids anywhere."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from stream_dp.metrics.budget import BudgetMetrics, BulkHistogram

from .support import DAY_MS, HOUR_MS, Clock, StoreFactory


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_bulk_histogram_exposes_cumulative_buckets() -> None:
    registry = CollectorRegistry()
    hist = BulkHistogram("demo_fraction", "A demo.", ["namespace"], [0.5, 1.0], registry)
    hist.observe_values(("users",), np.array([0.1, 0.5, 0.7, 1.0, 2.0]))
    hist.observe_counts(("users",), np.array([1, 0, 0]), 0.2)
    text = generate_latest(registry).decode()
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == "demo_fraction"]
    values = {(s.name, s.labels.get("le")): s.value for s in family.samples}
    assert values[("demo_fraction_bucket", "0.5")] == 3
    assert values[("demo_fraction_bucket", "1.0")] == 5
    assert values[("demo_fraction_bucket", "+Inf")] == 6
    assert values[("demo_fraction_count", None)] == 6
    assert values[("demo_fraction_sum", None)] == pytest.approx(4.5)
    with pytest.raises(ValueError, match="expected 3 bucket counts"):
        hist.observe_counts(("users",), np.array([1, 2]), 0.0)
    with pytest.raises(ValueError, match="strictly increasing"):
        BulkHistogram("bad", "Bad.", [], [1.0, 0.5], CollectorRegistry())


def test_fraction_buckets_must_be_fractions() -> None:
    with pytest.raises(ValueError, match=r"fraction_buckets must lie in \(0, 1\]"):
        BudgetMetrics(CollectorRegistry(), fraction_buckets=(0.5, 2.0))


def test_a_charge_is_counted_per_namespace_and_horizon(make_store: StoreFactory, clock: Clock) -> None:
    registry = CollectorRegistry()
    store = make_store(metrics=BudgetMetrics(registry))
    t = clock.now_ms
    store.charge("users", "pre", ["u1"], 0.95, t)
    store.charge("users", "q/1", ["u1", "u2", "u3"], 0.1, t)
    store.charge("users", "q/1", ["u1", "u2", "u3"], 0.1, t)  # a replay
    assert sample(registry, "stream_dp_budget_units_charged_total", namespace="users") == 3
    assert sample(registry, "stream_dp_budget_units_excluded_total", namespace="users") == 1
    assert sample(registry, "stream_dp_budget_refusals_total", namespace="users", horizon="1h") == 1
    assert sample(registry, "stream_dp_budget_refusals_total", namespace="users", horizon="1d") is None
    assert sample(registry, "stream_dp_budget_charge_replays_total", namespace="users") == 1
    assert sample(registry, "stream_dp_budget_charge_seconds_count", namespace="users") == 3
    # Spend fractions at charge time: 0.95 then (0.95 refused, 0.1, 0.1) on the hour; a quarter of that a day.
    hour = {"namespace": "users", "horizon": "1h"}
    assert sample(registry, "stream_dp_budget_spend_fraction_count", **hour) == 4
    assert sample(registry, "stream_dp_budget_spend_fraction_bucket", le="0.1", **hour) == 2
    assert sample(registry, "stream_dp_budget_spend_fraction_bucket", le="0.9", **hour) == 2
    assert sample(registry, "stream_dp_budget_spend_fraction_bucket", le="0.95", **hour) == 4
    assert sample(registry, "stream_dp_budget_spend_fraction_sum", **hour) == pytest.approx(2.1)
    day = {"namespace": "users", "horizon": "1d"}
    assert sample(registry, "stream_dp_budget_spend_fraction_sum", **day) == pytest.approx(2.1 / 4)


def test_threshold_gauge_rises_on_crossings_and_falls_at_lapse(make_store: StoreFactory, clock: Clock) -> None:
    registry = CollectorRegistry()
    metrics = BudgetMetrics(registry)
    store = make_store(metrics=metrics)
    t = clock.now_ms
    store.charge("users", "q/1", ["u1", "u2"], 0.85, t)
    store.charge("users", "q/2", ["u1"], 0.2, t)  # refused: u1 reaches 1.0 as well
    at = {"namespace": "users", "horizon": "1h"}
    assert sample(registry, "stream_dp_budget_units_at_threshold", threshold="0.8", **at) == 2
    assert sample(registry, "stream_dp_budget_units_at_threshold", threshold="1.0", **at) == 1
    clock.advance(HOUR_MS)  # the entries lapse one horizon after they were made
    store.charge("users", "q/3", ["u3"], 0.1, clock.now_ms)
    assert sample(registry, "stream_dp_budget_units_at_threshold", threshold="0.8", **at) == 0
    assert sample(registry, "stream_dp_budget_units_at_threshold", threshold="1.0", **at) == 0
    assert metrics.expire_levels(clock.now_ms + DAY_MS) == 0


def test_no_metric_names_a_unit(make_store: StoreFactory, clock: Clock) -> None:
    registry = CollectorRegistry()
    store = make_store(metrics=BudgetMetrics(registry))
    units = ["secret-alice", "secret-bob"]
    store.charge("users", "q/1", units, 0.9, clock.now_ms)
    store.charge("users", "q/2", units, 0.9, clock.now_ms)
    text = generate_latest(registry).decode()
    assert "secret" not in text
    labels = {k for f in text_string_to_metric_families(text) for s in f.samples for k in s.labels}
    assert labels <= {"namespace", "horizon", "threshold", "operation", "kind", "le"}
