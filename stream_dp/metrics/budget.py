"""Prometheus metrics of the budget store.

No metric carries a unit id: labels are ``namespace``, ``horizon`` (e.g.
``1h``), ``threshold`` (e.g. ``0.8``), ``operation`` and ``kind``.

``stream_dp_budget_units_at_threshold`` approximates how many units reached a
threshold of a horizon's limit within the last horizon. It is kept from the
charge results, never by scanning Redis: a unit entering a threshold adds one
and schedules a decrement at the entry's lapse time (one horizon later, the
same lapse the store records for the unit); expired entries are removed on
every charge and on :meth:`BudgetMetrics.expire_levels`. Each worker counts
the entries it observed, so sum the gauge over workers. A unit still at the
threshold when its entry lapses is counted again at its next charge, not
before; a reset unit stays counted until its entry lapses.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

DEFAULT_FRACTION_BUCKETS: tuple[float, ...] = (0.1, 0.25, 0.5, 0.75, 0.8, 0.9, 0.95, 1.0)
DEFAULT_LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)


class BulkHistogram(Collector):
    """A labelled histogram fed whole bucket counts at once.

    Charging 10k units observes 10k fractions per horizon; adding precomputed
    bucket counts costs one numpy addition instead of 10k ``observe`` calls.
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        edges = tuple(float(b) for b in buckets)
        if not edges or any(b >= c for b, c in zip(edges, edges[1:], strict=False)):
            raise ValueError(f"histogram buckets must be strictly increasing and non-empty, got {list(buckets)}")
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.buckets = edges
        self._counts: dict[tuple[str, ...], np.ndarray] = {}
        self._sums: dict[tuple[str, ...], float] = {}
        self._lock = threading.Lock()
        registry.register(self)

    def observe_counts(self, labels: Sequence[str], counts: np.ndarray, total: float) -> None:
        """Add per-bucket counts (``len(buckets) + 1`` of them, the last for +Inf) and their sum."""
        counts = np.asarray(counts, dtype=np.int64)
        if counts.shape != (len(self.buckets) + 1,):
            raise ValueError(f"expected {len(self.buckets) + 1} bucket counts, got shape {counts.shape}")
        key = tuple(labels)
        with self._lock:
            if key in self._counts:
                self._counts[key] += counts
                self._sums[key] += total
            else:
                self._counts[key] = counts.copy()
                self._sums[key] = float(total)

    def observe_values(self, labels: Sequence[str], values: np.ndarray) -> None:
        """Observe many values (bucketed with numpy)."""
        values = np.asarray(values, dtype=np.float64)
        index = np.searchsorted(np.asarray(self.buckets), values, side="left")
        counts = np.bincount(index, minlength=len(self.buckets) + 1)
        self.observe_counts(labels, counts, float(values.sum()))

    def _family(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def describe(self) -> Iterator[Metric]:
        yield self._family()

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        with self._lock:
            items = [(k, v.copy(), self._sums[k]) for k, v in self._counts.items()]
        for labels, counts, total in items:
            cumulative = np.cumsum(counts)
            buckets = [(_format_le(le), float(c)) for le, c in zip(self.buckets, cumulative[:-1], strict=True)]
            buckets.append(("+Inf", float(cumulative[-1])))
            family.add_metric(list(labels), buckets, total)
        yield family


def _format_le(value: float) -> str:
    return repr(float(value))


class BudgetMetrics:
    """All budget-store metrics, registered in the given registry."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        fraction_buckets: Sequence[float] = DEFAULT_FRACTION_BUCKETS,
        latency_buckets_s: Sequence[float] = DEFAULT_LATENCY_BUCKETS_S,
    ) -> None:
        if any(not 0.0 < b <= 1.0 for b in fraction_buckets):
            raise ValueError(f"fraction_buckets must lie in (0, 1], got {list(fraction_buckets)}")
        self.units_charged = Counter(
            "stream_dp_budget_units_charged",
            "Units charged for a released window.",
            ["namespace"],
            registry=registry,
        )
        self.units_excluded = Counter(
            "stream_dp_budget_units_excluded",
            "Units excluded from a window because they could not afford its charge.",
            ["namespace"],
            registry=registry,
        )
        self.refusals = Counter(
            "stream_dp_budget_refusals",
            "Charges refused by a horizon's limit (a unit refused by two horizons counts in both).",
            ["namespace", "horizon"],
            registry=registry,
        )
        self.charge_replays = Counter(
            "stream_dp_budget_charge_replays",
            "Charges whose id was already charged: the stored decision was returned.",
            ["namespace"],
            registry=registry,
        )
        self.charge_latency = Histogram(
            "stream_dp_budget_charge_seconds",
            "Time to check and charge one batch, including retries.",
            ["namespace"],
            buckets=tuple(latency_buckets_s),
            registry=registry,
        )
        self.store_errors = Counter(
            "stream_dp_budget_store_errors",
            "Errors talking to the budget store (kind: connection, timeout, loading, replication, cluster, "
            "out_of_memory, script).",
            ["namespace", "operation", "kind"],
            registry=registry,
        )
        self.spend_fraction = BulkHistogram(
            "stream_dp_budget_spend_fraction",
            "Per-unit spend as a fraction of the horizon's limit, observed at charge time.",
            ["namespace", "horizon"],
            fraction_buckets,
            registry,
        )
        self.units_at_threshold = Gauge(
            "stream_dp_budget_units_at_threshold",
            "Units that reached an alert threshold of a horizon's limit within the last horizon (per worker).",
            ["namespace", "horizon", "threshold"],
            registry=registry,
        )
        self._lapses: list[tuple[int, str, str, str]] = []
        self._lock = threading.Lock()

    @property
    def fraction_buckets(self) -> tuple[float, ...]:
        return self.spend_fraction.buckets

    def record_charge(
        self,
        namespace: str,
        *,
        charged: int,
        excluded: int,
        refusals: Mapping[str, int],
        latency_s: float,
    ) -> None:
        self.units_charged.labels(namespace).inc(charged)
        self.units_excluded.labels(namespace).inc(excluded)
        for horizon, count in refusals.items():
            if count:
                self.refusals.labels(namespace, horizon).inc(count)
        self.charge_latency.labels(namespace).observe(latency_s)

    def record_replay(self, namespace: str, latency_s: float) -> None:
        self.charge_replays.labels(namespace).inc()
        self.charge_latency.labels(namespace).observe(latency_s)

    def record_error(self, namespace: str, operation: str, kind: str) -> None:
        self.store_errors.labels(namespace, operation, kind).inc()

    def enter_levels(self, namespace: str, entries: Sequence[tuple[str, float, int]]) -> None:
        """Units entered thresholds: (horizon label, threshold, lapse_ms) per entry."""
        with self._lock:
            for horizon, threshold, lapse_ms in entries:
                label = repr(float(threshold))
                self.units_at_threshold.labels(namespace, horizon, label).inc()
                heapq.heappush(self._lapses, (lapse_ms, namespace, horizon, label))

    def expire_levels(self, now_ms: int) -> int:
        """Remove entries whose lapse time has passed; returns how many."""
        removed = 0
        with self._lock:
            while self._lapses and self._lapses[0][0] <= now_ms:
                _, namespace, horizon, label = heapq.heappop(self._lapses)
                self.units_at_threshold.labels(namespace, horizon, label).dec()
                removed += 1
        return removed
