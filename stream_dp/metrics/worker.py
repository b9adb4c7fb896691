"""Prometheus metrics of the worker's ingest and release stages.

Labels are queries, topics, partitions, reasons and namespaces — never privacy
unit ids or group values. The registry is injected.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)
_STAGE_BUCKETS_S = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30)


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.events = Counter(
            "stream_dp_events_total",
            "Input events by outcome: accepted, rejected (invalid), late (window already closed), replayed (skipped "
            "after restart), unlisted (of a group outside the query's public list: set aside before bounding).",
            ["query", "outcome"],
            registry=registry,
        )
        self.rejected = Counter(
            "stream_dp_events_rejected_total", "Input events rejected, by reason code.", ["query", "reason"], registry=registry
        )
        self.dead_letters = Counter(
            "stream_dp_dead_letters_total", "Records written to the dead-letter topic.", ["query"], registry=registry
        )
        self.windows_open = Gauge(
            "stream_dp_windows_open", "Windows open (receiving events) in this worker.", ["query"], registry=registry
        )
        self.open_rows = Gauge(
            "stream_dp_open_rows",
            "Bounded contribution rows held in memory by open windows (about one per open (unit, group) pair).",
            ["query"],
            registry=registry,
        )
        self.windows_closed = Counter(
            "stream_dp_windows_closed_total", "Per-partition window partials emitted by the ingest stage.", ["query"], registry=registry
        )
        self.units_charged = Counter(
            "stream_dp_window_units_total",
            "Privacy units in closed windows, by budget outcome: charged (admitted), excluded (no budget left), "
            "over_period_cap (continual queries: the unit's windows of the period are used up).",
            ["query", "outcome"],
            registry=registry,
        )
        self.budget_failures = Counter(
            "stream_dp_budget_failures_total",
            "Window charges that failed (unavailable: the store did not answer; conflict; rejected: out of range; "
            "store_unverified: held because the store is not verified yet, counted at most every "
            "retry_backoff_max_s); nothing was released for them.",
            ["query", "kind"],
            registry=registry,
        )
        self.pending_charges = Gauge(
            "stream_dp_pending_charges", "Closed window partials waiting for the budget store.", ["query"], registry=registry
        )
        self.windows_released = Counter(
            "stream_dp_windows_released_total", "Windows released (noised and published) once.", ["query"], registry=registry
        )
        self.groups_released = Counter(
            "stream_dp_groups_released_total", "Per-group records published to output topics.", ["query"], registry=registry
        )
        self.republished = Counter(
            "stream_dp_windows_republished_total",
            "Windows whose stored release was published again after a retry or replay (same values, no new noise).",
            ["query"],
            registry=registry,
        )
        self.late_partials = Counter(
            "stream_dp_late_partials_total",
            "Partials that arrived after their window was released (dropped; their units stay charged).",
            ["query"],
            registry=registry,
        )
        self.partials_expired = Counter(
            "stream_dp_partials_expired_total",
            "Partials dropped unreleased because they are older than the release ledger keeps entries (less a "
            "margin): whether their window was released can no longer be known, so it is never noised again.",
            ["query"],
            registry=registry,
        )
        self.partials_unreleasable = Counter(
            "stream_dp_partials_unreleasable_total",
            "Partials of public-groups windows that are never released, data or not (dropped; their units stay "
            "charged): before the query's publication start (before_start; window.publish_from publishes a "
            "backlog), or behind their home's released mark with no release stored (behind_mark).",
            ["query", "reason"], registry=registry,
        )
        self.windows_expired = Counter(
            "stream_dp_windows_expired_total",
            "Windows (mostly empty public-group windows after a long stop) not released because they ended "
            "longer ago than the release ledger keeps entries (less a margin).",
            ["query"],
            registry=registry,
        )
        self.partition_count_changes = Counter(
            "stream_dp_partition_count_changes_total",
            "Changes of an input topic's partition count seen by this worker; windows whose partitions were closed "
            "under different counts are withheld.",
            ["topic"],
            registry=registry,
        )
        self.windows_withheld = Counter(
            "stream_dp_windows_withheld_total",
            "Windows released without data (noise only, records flagged as_if_empty) because their partials cannot "
            "be added up soundly: charged under other query settings (settings_differ, settings_missing), placed "
            "under different partition counts so a unit could sit on two partitions, or missing a part the query "
            "needs; or because their release could not be built from the data (release_failed).",
            ["query", "reason"],
            registry=registry,
        )
        self.sample_aggregate_failures = Counter(
            "stream_dp_sample_aggregate_failed_blocks_total",
            "Blocks whose user function failed (reason: error, not_finite, timeout, crashed, load_error); each counts "
            "as the output range's midpoint. Counts only: no values, no unit ids.",
            ["query", "reason"],
            registry=registry,
        )
        self.partitions_missing = Counter(
            "stream_dp_release_partitions_missing_total",
            "Input partitions left out of a released window: past the release timeout, the broker showed them "
            "to hold nothing more for it (a partition that is behind is waited for, never left out).",
            ["query"],
            registry=registry,
        )
        self.release_waiting_windows = Gauge(
            "stream_dp_release_waiting_windows",
            "Windows past their release timeout waiting for an input partition that has not reported them "
            "closed and may still hold their events (its worker is behind, down, or held by the budget store).",
            ["query"],
            registry=registry,
        )
        self.release_wait_seconds = Gauge(
            "stream_dp_release_wait_seconds",
            "How long the oldest window past its release timeout has waited since its first partial (0: none waits).",
            ["query"],
            registry=registry,
        )
        self.release_latency = Histogram(
            "stream_dp_release_latency_seconds",
            "From a window closing (watermark passing its end) to its last record published.",
            ["query"],
            buckets=_LATENCY_BUCKETS_S,
            registry=registry,
        )
        self.release_stage_seconds = Histogram(
            "stream_dp_release_stage_seconds",
            "Time of one window in each stage between its close and its last record: charge and partial_send "
            "(ingest), decode, combine, noise, encode, ledger, render and publish (release).",
            ["query", "operation"],
            buckets=_STAGE_BUCKETS_S,
            registry=registry,
        )
        self.noise_seconds = Histogram(
            "stream_dp_noise_seconds", "Time spent drawing noise for one window release.", ["query"], registry=registry
        )
        self.epsilon_spent = Counter(
            "stream_dp_epsilon_released_total",
            "Sum over released windows of the per-unit privacy loss (epsilon) each window spent, counted by the "
            "worker that releases the window (not by one that republishes a stored release). A continual query's "
            "per-period epsilon counts once for each period in which it releases a window, at the first window "
            "of the period it releases, whichever that is (its units are charged at their first window of the "
            "period); not again where its running total restarts within the period, nor when a change of its "
            "settings within the period charges its units again.",
            ["query", "namespace"],
            registry=registry,
        )
        self.watermark = Gauge(
            "stream_dp_closed_through_seconds", "Event time through which every window of a query is closed.", ["query"], registry=registry
        )
        self.consumer_lag = Gauge(
            "stream_dp_consumer_lag", "Records between the consumer position and the end of each input partition.",
            ["topic", "partition"], registry=registry,
        )
        self.internal_errors = Counter(
            "stream_dp_internal_errors_total",
            "Unexpected internal records or failures, by kind (corrupt_partial, ledger_unavailable, unknown_query, ...).",
            ["kind"],
            registry=registry,
        )
        self.store_checks = Counter(
            "stream_dp_store_checks_total",
            "Checks that Redis is the store the group's progress was charged on (stream_dp.worker.guard.store), by "
            "outcome: verified, unanswered (Redis did not answer: nothing is charged or released until it does), "
            "replaced (it lost its data or is another server: the worker stops).",
            ["outcome"],
            registry=registry,
        )
        self.alerts_published = Counter(
            "stream_dp_budget_alerts_published_total", "Budget threshold alerts written to the alerts topic.", ["namespace"], registry=registry
        )
