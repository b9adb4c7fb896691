"""Charging closed windows' units: the journal first, then the budget store, and which units count.

A charge id is ``query/window_start/partition``. Each window's unit list is
journaled before the charge, so a replay that rebuilds the window from another
batch (an event late the first time may land inside now) charges and releases
by the first list, never a new one; the store's charge is idempotent per id.
If the journal is unavailable the charge goes first and fails closed, and the
journal follows.

A window of a continual query (``WindowCharge.continual``) is charged the
period's loss once per unit and admits a unit to at most W windows of a
period: see :mod:`stream_dp.worker.ingest.period_charge`.

Windows are charged oldest first, and an outage stops the round (a unit's
windows are always charged in window order). A charge conflict or refusal only
drops that window.

A whole round runs in one worker thread, one Redis call after the other:
between them it needs the interpreter only for packing, so the event loop keeps
reading and windowing records meanwhile, instead of taking a turn of the loop
(which a busy loop gives out seldom) for every call.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from stream_dp.budget import BudgetStore, BudgetUnavailable, ChargeConflict, ChargeRejected
from stream_dp.budget.store import ChargeOutcome
from stream_dp.worker.ingest.period_charge import charge_period_window
from stream_dp.worker.store.ledger import LedgerUnavailable, ReleaseLedger
from stream_dp.worker.store.period_register import PeriodRegister, PeriodWindow


def charge_id(query: str, window_start_ms: int, partition: int) -> str:
    return f"{query}/{window_start_ms}/{partition}"


@dataclass(frozen=True)
class WindowCharge:
    """What charging one window partial needs."""

    charge_id: str
    namespace: str
    cost: float  # of the window; of the whole period when ``continual`` is set
    delta: float
    window_end_ms: int
    partial_units: Any  # the partial's unit ids (a sequence of str)
    continual: PeriodWindow | None = None  # a continual query's window: charged once per unit and period


@dataclass(frozen=True)
class Charged:
    """The outcome of one window's charge: ``outcome`` and the ``charged_units`` (the journaled
    list), or ``error`` (BudgetUnavailable or LedgerUnavailable, which stopped the round,
    ChargeConflict or ChargeRejected, which dropped the window).

    ``excluded``: per unit of ``charged_units``, left out of the window: the store's
    decision, or for a continual window the decision of the period charge (which also
    counts in ``over_cap`` the units whose windows of the period were used up).
    """

    units: list[str]
    charged_units: list[str] | None = None
    outcome: ChargeOutcome | None = None
    error: Exception | None = None
    seconds: float = 0.0  # the journal, store (and register) calls of this window
    excluded: np.ndarray | None = None
    over_cap: int = 0


def charge_in_order(
    journal: ReleaseLedger, budget: BudgetStore, windows: list[WindowCharge], periods: PeriodRegister | None = None,
) -> list[Charged]:
    """Charge ``windows`` in order; stops after the first unavailable store (its result is the last).

    ``periods``: the period register (``store.period_register``), which continual windows need."""
    if periods is None and any(w.continual is not None for w in windows):
        raise ValueError(
            "windows of a continual query need the period register: pass charge_in_order a PeriodRegister "
            "(the worker builds one on the release ledger's Redis)"
        )
    results: list[Charged] = []
    for window in windows:
        units = list(window.partial_units)
        started = time.perf_counter()
        try:
            if window.continual is None:
                charged_units, outcome = _charge_window(journal, budget, window, units)
                excluded, over_cap = np.asarray(outcome.excluded, dtype=bool), 0
            else:
                assert periods is not None
                period = charge_period_window(
                    journal, budget, periods, charge_id=window.charge_id, namespace=window.namespace, cost=window.cost,
                    delta=window.delta, window_end_ms=window.window_end_ms, window=window.continual, units=units,
                )
                charged_units, outcome, excluded, over_cap = (
                    period.charged_units, period.outcome, period.excluded, period.over_cap)
        except (BudgetUnavailable, LedgerUnavailable) as exc:
            results.append(Charged(units, error=exc, seconds=time.perf_counter() - started))
            break
        except (ChargeConflict, ChargeRejected) as exc:
            results.append(Charged(units, error=exc, seconds=time.perf_counter() - started))
            continue
        seconds = time.perf_counter() - started
        results.append(Charged(units, charged_units=charged_units, outcome=outcome, seconds=seconds, excluded=excluded,
                               over_cap=over_cap))
    return results


def _charge_window(
    journal: ReleaseLedger, budget: BudgetStore, window: WindowCharge, units: list[str]
) -> tuple[list[str], ChargeOutcome]:
    """A window's charge at the window's loss: the journaled unit list and the store's outcome."""
    try:
        charged_units = journal.remember_units(window.charge_id, units)
        journaled = True
    except LedgerUnavailable:
        # Redis is probably down: the charge below fails closed (and is
        # counted as a store error); if it goes through, journal right after.
        charged_units, journaled = units, False
    outcome = budget.charge(window.namespace, window.charge_id, charged_units, window.cost, window.window_end_ms,
                            delta=window.delta)
    if not journaled:
        journal.remember_units(window.charge_id, units)
    return charged_units, outcome


def excluded_units(units: list[str], charged_units: list[str], excluded: Any) -> tuple[np.ndarray, bool]:
    """Per unit of ``units``, whether it stays out of the release; and whether the window was rebuilt
    with other units than first charged (then only units charged and admitted the first time count)."""
    mask = np.asarray(excluded, dtype=bool)
    if charged_units == units:
        return mask, False
    admitted = {u for u, out in zip(charged_units, mask.tolist()) if not out}
    return np.fromiter((u not in admitted for u in units), dtype=bool, count=len(units)), True
