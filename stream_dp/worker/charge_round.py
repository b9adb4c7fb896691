"""The budget charges of one round of closed windows, made in one go off the event loop.

Each window partial is charged as the ingest stage always charged it: its unit
list is journaled first (so that a replay charges the same list), then the
budget store charges the list under the partial's charge id; if the journal is
unavailable the charge goes first and fails closed, and the journal follows.
Windows are charged oldest first, and an outage stops the round (a unit's
windows are always charged in window order). A charge conflict or refusal only
drops that window.

The whole round runs in one worker thread, one Redis call after the other:
between them it needs the interpreter only for packing, so the event loop keeps
reading and windowing records meanwhile, instead of taking a turn of the loop
(which a busy loop gives out seldom) for every call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stream_dp.budget import BudgetStore, BudgetUnavailable, ChargeConflict, ChargeRejected
from stream_dp.budget.store import ChargeOutcome
from stream_dp.worker.ledger import LedgerUnavailable, ReleaseLedger


@dataclass(frozen=True)
class WindowCharge:
    """What charging one window partial needs."""

    charge_id: str
    namespace: str
    cost: float
    delta: float
    window_end_ms: int
    partial_units: Any  # the partial's unit ids (a sequence of str)


@dataclass(frozen=True)
class Charged:
    """The outcome of one window's charge: ``outcome`` and the ``charged_units`` (the journaled
    list), or ``error`` (BudgetUnavailable or LedgerUnavailable, which stopped the round,
    ChargeConflict or ChargeRejected, which dropped the window)."""

    units: list[str]
    charged_units: list[str] | None = None
    outcome: ChargeOutcome | None = None
    error: Exception | None = None


def charge_in_order(journal: ReleaseLedger, budget: BudgetStore, windows: list[WindowCharge]) -> list[Charged]:
    """Charge ``windows`` in order; stops after the first unavailable store (its result is the last)."""
    results: list[Charged] = []
    for window in windows:
        units = list(window.partial_units)
        try:
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
        except (BudgetUnavailable, LedgerUnavailable) as exc:
            results.append(Charged(units, error=exc))
            break
        except (ChargeConflict, ChargeRejected) as exc:
            results.append(Charged(units, error=exc))
            continue
        results.append(Charged(units, charged_units=charged_units, outcome=outcome))
    return results
