"""Closed window partials on their way out of the ingest stage: charged, filtered, published.

Fail closed: a partial whose charge fails is held (and its offsets with it,
see ``ingest.commit_plan.committable_offsets``) and retried with backoff; it is published
only after the charge succeeded. Oldest window first, and an outage stops the
round: a unit's windows are always charged in window order, as they would
be without the outage.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer

from stream_dp.budget import BudgetStore, BudgetUnavailable, ChargeConflict, ChargeRejected
from stream_dp.metrics.worker import WorkerMetrics
from stream_dp.worker.guard.store import StoreGuard
from stream_dp.worker.ingest.charge import Charged, WindowCharge, charge_id, charge_in_order, excluded_units
from stream_dp.worker.ingest.decode import alert_json
from stream_dp.worker.ingest.partials_out import PartialsOut, partial_message
from stream_dp.worker.query.runtime import QueryRuntime, settings_fingerprint
from stream_dp.worker.store.ledger import LedgerUnavailable, ReleaseLedger
from stream_dp.worker.store.period_register import PeriodRegister, PeriodWindow

log = logging.getLogger(__name__)

# Windows charged per round. A backlog is charged over many rounds, each taking the oldest held
# windows: a window of another topic that closes meanwhile (an earlier one, say) waits for one
# round, not for the whole backlog.
MAX_WINDOWS_PER_ROUND = 256


@dataclass
class HeldPartial:
    """A closed window partial not yet charged and published."""

    query: QueryRuntime
    partial: Any  # stream_dp.windows.WindowPartial
    closed_at_ms: int


class Emitter:
    def __init__(
        self,
        queries: list[QueryRuntime],
        producer: AIOKafkaProducer,
        budget: BudgetStore,
        journal: ReleaseLedger,
        metrics: WorkerMetrics,
        partials_out: PartialsOut,
        *,
        alerts_topic: str,
        partition_count: Callable[[str], int],
        retry_backoff_s: float,
        retry_backoff_max_s: float,
        periods: PeriodRegister | None = None,
        store: StoreGuard | None = None,
    ) -> None:
        self.queries = queries
        self.store = store  # charges wait until the store is known to be the one charged so far
        self.producer = producer
        self.budget = budget
        self.journal = journal
        self.metrics = metrics
        self.partials_out = partials_out
        self.alerts_topic = alerts_topic
        self.partition_count = partition_count
        self.retry_backoff_s = retry_backoff_s
        self.retry_backoff_max_s = retry_backoff_max_s
        self.periods = periods  # continual queries' period register
        self.held: list[HeldPartial] = []
        self._charge_attempts = 0
        self._next_charge_s = -math.inf  # due at once, whatever the monotonic clock's zero
        self._next_unverified_count_s = -math.inf

    async def emit(self) -> bool:
        """Charge and publish the held partials (see the module docstring); whether any went out."""
        if not self.held:
            self.set_pending_gauge()
            return False
        now_s = time.monotonic()
        if self.store is not None and not self.store.ready():
            self.set_pending_gauge()  # held, waiting for the store (StreamDpBudgetStoreUnavailable)
            if now_s >= self._next_unverified_count_s:  # counted at the pace of the slowest retries
                self._next_unverified_count_s = now_s + self.retry_backoff_max_s
                for name in sorted({h.query.name for h in self.held}):
                    self.metrics.budget_failures.labels(name, "store_unverified").inc()
            return False
        if now_s < self._next_charge_s:
            return False
        still_held: list[HeldPartial] = []
        sends = []
        # Oldest window first, and an outage stops the round: a unit's windows are
        # always charged in window order, as they would be without the outage.
        ordered = sorted(self.held, key=lambda h: (h.partial.window_start_ms, h.partial.partition))
        ordered = ordered[:MAX_WINDOWS_PER_ROUND]  # the rest stay held for the next rounds
        windows = [window_charge(h.query, h.partial) for h in ordered]
        results = await asyncio.to_thread(charge_in_order, self.journal, self.budget, windows, self.periods)
        for position, (held, window, result) in enumerate(zip(ordered, windows, results)):
            query, cid = held.query, window.charge_id
            exc = result.error
            if isinstance(exc, (BudgetUnavailable, LedgerUnavailable)):
                if self.store is not None:
                    self.store.suspect()  # it may come back empty: check before charging again
                self._charge_attempts += 1
                backoff = min(self.retry_backoff_max_s, self.retry_backoff_s * 2 ** (self._charge_attempts - 1))
                self._next_charge_s = now_s + backoff
                self.metrics.budget_failures.labels(query.name, "unavailable").inc()
                log.warning("budget store unavailable for %s (attempt %d): %s; holding %d windows",
                            cid, self._charge_attempts, exc, len(ordered) - position)
                still_held.extend(ordered[position:])
                break
            if isinstance(exc, ChargeConflict):
                # The journal makes retries repeat the first unit list, so this means
                # another writer used the same charge id: release nothing.
                self.metrics.budget_failures.labels(query.name, "conflict").inc()
                log.error("charge %s conflicts with an earlier one (%s); the window is dropped unreleased", cid, exc)
                continue
            if isinstance(exc, ChargeRejected):
                self.metrics.budget_failures.labels(query.name, "rejected").inc()
                log.error("budget store refused %s: %s; the window is dropped unreleased", cid, exc)
                continue
            self._charge_attempts = 0
            sends += await self._send_charged(held, cid, result)
        if sends:
            # Partials must be in the topic before progress says their window is closed.
            await asyncio.gather(*sends)
        # The ingest loop may have added partials meanwhile (this runs beside it): keep them.
        taken = {id(h) for h in ordered}
        self.held = still_held + [h for h in self.held if id(h) not in taken]
        self.set_pending_gauge()
        return bool(sends)

    async def _send_charged(self, held: HeldPartial, cid: str, result: Charged) -> list:
        """A charged window's partial, its excluded units left out, and its namespace's budget alerts, sent;
        the sends to wait for."""
        query, partial = held.query, held.partial
        assert result.outcome is not None and result.charged_units is not None and result.excluded is not None
        units, outcome = result.units, result.outcome
        excluded, rebuilt = excluded_units(units, result.charged_units, result.excluded)
        if rebuilt:
            self.metrics.internal_errors.labels("replay_rebuilt_differently").inc()
            log.warning("window %s was rebuilt with other units than first charged; releasing only the charged ones", cid)
        totals = partial.aggregate(excluded if excluded.any() else None, histogram=query.histogram,
                                   features=query.features, blocks=query.blocks)
        n_excluded = int(excluded.sum())
        # Counted over the journaled list: a window rebuilt with fewer units can have fewer left out.
        over_cap = min(result.over_cap, n_excluded)
        self.metrics.units_charged.labels(query.name, "charged").inc(len(units) - n_excluded)
        self.metrics.units_charged.labels(query.name, "excluded").inc(n_excluded - over_cap)
        # Incremented by zero too, so the dashboard's excluded-share panel has a series for every query.
        self.metrics.units_charged.labels(query.name, "over_period_cap").inc(over_cap)
        self.metrics.release_stage_seconds.labels(query.name, "charge").observe(result.seconds)
        message = partial_message(
            query, partial, totals, input_partitions=self.partition_count(query.config.input_topic),
            units=len(units), excluded=n_excluded, closed_at_ms=held.closed_at_ms,
        )
        sends = list(await self.partials_out.send(message))
        for alert in outcome.alerts:
            sends.append(await self.producer.send(self.alerts_topic, key=query.namespace.encode(), value=alert_json(alert)))
            self.metrics.alerts_published.labels(query.namespace).inc()
        self.metrics.windows_closed.labels(query.name).inc()
        return sends

    def set_pending_gauge(self) -> None:
        for query in self.queries:
            self.metrics.pending_charges.labels(query.name).set(sum(1 for h in self.held if h.query is query))


def window_charge(query: QueryRuntime, partial: Any) -> WindowCharge:
    """What charging ``partial`` (a ``WindowPartial`` of ``query``) needs; a continual query's window counts in
    its period."""
    period = None
    cid = charge_id(query.name, partial.window_start_ms, partial.partition)
    continual = query.continual
    if continual is not None:
        start, settings = partial.window_start_ms, settings_fingerprint(query)
        period = PeriodWindow(query.name, partial.partition, continual.period_start(start), continual.period_end(start),
                              continual.window_index(start), continual.max_windows_per_unit, settings)
        # The same window charged under other settings is another charge: the store must not answer it with
        # the old charge's outcome (nor refuse it as a conflicting replay), nor the journal with the old lists.
        cid = f"{cid}/{settings}"
    return WindowCharge(cid, query.namespace, query.cost, query.delta, partial.window_end_ms, partial.units, period)
