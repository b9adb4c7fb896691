"""Charging a closed window's units: the journal first, then the budget store, and which units count.

A charge id is ``query/window_start/partition``. The units are journaled
before the charge, so a replay that rebuilds the window from another batch
(an event late the first time may land inside now) charges and releases by
the first list, never a new one; the store's charge is idempotent per id.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import numpy as np

from stream_dp.worker.ledger import LedgerUnavailable, ReleaseLedger


def charge_id(query: str, window_start_ms: int, partition: int) -> str:
    return f"{query}/{window_start_ms}/{partition}"


async def charge_window(journal: ReleaseLedger, budget: Any, query: Any, partial: Any, units: list[str]) -> tuple[list[str], Any]:
    """(units as first charged, the store's outcome) of ``partial``'s window for ``query`` (a ``QueryRuntime``).

    Raises what the store raises (``BudgetUnavailable``, ``ChargeConflict``,
    ``ChargeRejected``) and ``LedgerUnavailable``: the caller holds or drops the window.
    """
    cid = charge_id(query.name, partial.window_start_ms, partial.partition)
    try:
        charged_units = await asyncio.to_thread(journal.remember_units, cid, units)
        journaled = True
    except LedgerUnavailable:
        # Redis is probably down: the charge below fails closed (and is
        # counted as a store error); if it goes through, journal right after.
        charged_units, journaled = units, False
    outcome = await asyncio.to_thread(
        functools.partial(budget.charge, delta=query.delta),
        query.namespace, cid, charged_units, query.cost, partial.window_end_ms,
    )
    if not journaled:
        await asyncio.to_thread(journal.remember_units, cid, units)
    return charged_units, outcome


def excluded_units(units: list[str], charged_units: list[str], excluded: Any) -> tuple[np.ndarray, bool]:
    """Per unit of ``units``, whether it stays out of the release; and whether the window was rebuilt
    with other units than first charged (then only units charged and admitted the first time count)."""
    mask = np.asarray(excluded, dtype=bool)
    if charged_units == units:
        return mask, False
    admitted = {u for u, out in zip(charged_units, mask.tolist()) if not out}
    return np.fromiter((u not in admitted for u in units), dtype=bool, count=len(units)), True
