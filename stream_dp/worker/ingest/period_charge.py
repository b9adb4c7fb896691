"""Charging a window of a continual query: the period's loss once per unit, and at most W windows per period.

For a window ``w`` (charge id ``c``) of a period, on partition ``p`` -- a
period of the query's current settings: ``c`` and the register's key both
name their fingerprint (:func:`stream_dp.worker.query.runtime.settings_fingerprint`),
so nothing charged or registered under other settings counts here:

1. journal the window's unit list under ``c`` (as every window's, see
   :mod:`stream_dp.worker.ingest.charge`);
2. classify those units in the period register (:mod:`stream_dp.worker.store.period_register`);
3. journal the ``FIRST`` units under ``c/first``: a replay charges exactly
   this list, whatever the register says by then;
4. charge that list the period's loss at the window's end (skipped when it is
   empty); the store's charge is idempotent per id;
5. admitted: the journaled first units the store admitted, and the ``MORE``
   and ``REPLAY`` units; the rest -- ``FULL``, refused by the store, or a
   ``FIRST`` unit missing from the journaled first list (its registrations
   expired between a crash and its replay: it was not charged) -- are left out;
6. register ``w`` for the admitted units; a unit the register finds ``FULL``
   by then (a concurrent window took its last place) is left out too.

Every step is idempotent, and none changes what an earlier one decided on a
replay: the journals keep their first lists, the store replays its recorded
outcome, and the register only ever adds ``w`` to units that were admitted.
A crash after any step therefore replays to the same admitted set and
charges nobody twice. Between steps 4 and 6 a unit is charged but not yet
registered; the replay of ``w`` registers it. (Should ``w`` never be
replayed, its next window charges it again: too much, never too little.)

Unlike a per-window charge, a continual one needs its journal: without it a
replay could see other first units. An unavailable journal or register stops
the round like an unavailable store (``LedgerUnavailable``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stream_dp.budget import BudgetStore
from stream_dp.budget.store import ChargeOutcome
from stream_dp.worker.store.ledger import ReleaseLedger
from stream_dp.worker.store.period_register import Participation, PeriodRegister, PeriodWindow


def first_charge_id(charge_id: str) -> str:
    """The journal id of a continual window's first-unit list."""
    return f"{charge_id}/first"


@dataclass(frozen=True)
class PeriodDecision:
    """Per unit of the journaled list: left out of the window, and why (the pure part of step 5)."""

    excluded: np.ndarray  # bool: left out
    over_cap: np.ndarray  # bool: left out because the unit's windows of the period are used up


def first_units(units: list[str], classes: np.ndarray) -> list[str]:
    return [u for u, c in zip(units, classes.tolist(), strict=True) if c == Participation.FIRST]


def admit(units: list[str], classes: np.ndarray, first: list[str], first_excluded: np.ndarray) -> PeriodDecision:
    """Which of ``units`` (the journaled list, classified as ``classes``) stay out of the window.

    ``first`` is the journaled first list and ``first_excluded`` the store's decision on it.
    """
    decided = dict(zip(first, np.asarray(first_excluded, dtype=bool).tolist(), strict=True))
    excluded = np.zeros(len(units), dtype=bool)
    over_cap = np.zeros(len(units), dtype=bool)
    for i, (unit, cls) in enumerate(zip(units, classes.tolist(), strict=True)):
        if unit in decided:
            # Journaled as first: the store decided, whatever the register says since.
            excluded[i] = decided[unit]
        elif cls == Participation.FULL:
            excluded[i] = over_cap[i] = True
        elif cls == Participation.FIRST:
            excluded[i] = True  # not in the charged first list: uncharged, so out
    return PeriodDecision(excluded, over_cap)


@dataclass(frozen=True)
class PeriodCharged:
    """What charging one continual window decided."""

    charged_units: list[str]  # the journaled unit list
    outcome: ChargeOutcome  # the store's charge of the first units (empty if there were none)
    excluded: np.ndarray  # bool over ``charged_units``
    over_cap: int  # units left out because their windows of the period were used up


def charge_period_window(
    journal: ReleaseLedger, budget: BudgetStore, periods: PeriodRegister, *, charge_id: str, namespace: str,
    cost: float, delta: float, window_end_ms: int, window: PeriodWindow, units: list[str],
) -> PeriodCharged:
    """Steps 1-6 of the module docstring; raises what the journal, store and register raise."""
    charged_units = journal.remember_units(charge_id, units)
    classes = periods.classify(window, charged_units)
    # A replay takes the first run's list from here, even where the register has moved on since.
    first = journal.remember_units(first_charge_id(charge_id), first_units(charged_units, classes))
    if first:
        outcome = budget.charge(namespace, charge_id, first, cost, window_end_ms, delta=delta)
    else:
        outcome = ChargeOutcome.empty()
    decision = admit(charged_units, classes, first, outcome.excluded)
    admitted = [u for u, out in zip(charged_units, decision.excluded.tolist(), strict=True) if not out]
    before = periods.register(window, admitted)
    # Units another window filled up since the classification stay out (the register did not take them).
    excluded, over_cap = decision.excluded.copy(), decision.over_cap.copy()
    late_full = np.flatnonzero(before == Participation.FULL)
    if late_full.size:
        positions = np.flatnonzero(~decision.excluded)[late_full]
        excluded[positions] = over_cap[positions] = True
    return PeriodCharged(charged_units, outcome, excluded, int(over_cap.sum()))
