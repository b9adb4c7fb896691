"""A continual query's window: the running totals of its period, continuing the stored tree.

The binary tree's state after each window (true and noisy partial sums) is
stored with that window's release in the ledger, so the next window -- on
this worker, or after a restart or rebalance on another -- adds its node to
the very noise already published. With no state for the previous window of
the period (it expired before it was released), the tree restarts at this
window: records then say so in ``continual.tree_restarted_ms``, and the
loss stays the period's (a unit still counts in at most
``max_windows_per_unit`` windows of the period, and the restarted tree has no
more levels).

The stored state names the settings it was made under
(:func:`stream_dp.worker.query.runtime.settings_fingerprint`). Under other settings
-- another epsilon, W, window grid, list or order of public groups, ... -- the
period is a new one, as it is for charging: the tree restarts at this window
and ``tree_restarted_ms`` says so. Continuing it would add the new windows to
p-sums of other groups under the same labels, or to noise calibrated for
another W and epsilon; a group list of another length would not even fit.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from stream_dp.dp.continual import TreeState
from stream_dp.wire import WireFormatError
from stream_dp.worker.query.runtime import settings_fingerprint
from stream_dp.worker.release.entry import ReleaseEntry, build_entry, decode_entry
from stream_dp.worker.release.ids import iso_utc

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Running:
    """The running totals in the shape ``build_entry`` reads."""

    keep: np.ndarray
    count: Any
    sum: Any
    mean: Any
    mean_ci95: Any
    count_std: float | None
    sum_std: float | None
    count_ci95: float | None
    sum_ci95: float | None


def period_of(query: Any, window_start_ms: int) -> tuple[int, int]:
    """(period start, 1-based index of the window in its period)."""
    period_ms, offset_ms = query.combiner.period
    start = offset_ms + (window_start_ms - offset_ms) // period_ms * period_ms
    return start, (window_start_ms - start) // query.config.window.size_ms + 1


def opens_period(ledger: Any, query: Any, window_start_ms: int) -> bool:
    """Whether releasing this window, where no tree state continues, adds the period's epsilon to
    ``stream_dp_epsilon_released_total``: whether no earlier window of its period was released.

    Units are charged the period's loss at their first window of the period, whichever that is (the query
    may start within the period, its first windows may expire), so the metric counts the period once, at
    the first window the query releases -- not again where the tree restarts after windows that were never
    released. The ledger's released-through of the period's home tells whether an earlier window of the
    period was released, on any worker: every window of a period is homed there, and the mark is durable.
    """
    period_start, index = period_of(query, window_start_ms)
    if index == 1:
        return True
    through = ledger.released_through(query.name, query.combiner.home(window_start_ms))
    return through is None or through <= period_start


class PreviousTrees:
    """The tree state each continual query's next window continues: the one stored with its latest
    published window, else (after a restart or a rebalance) the one the ledger stores."""

    def __init__(self, ledger: Any) -> None:
        self.ledger = ledger
        self._latest: dict[str, tuple[int, Any]] = {}  # per query: (window start, tree state after it)

    def published(self, query_name: str, window_start_ms: int, state: Any) -> None:
        """What the ledger holds for this window, which an earlier run may have drawn."""
        self._latest[query_name] = (window_start_ms, state)

    async def before(self, query: Any, window_start_ms: int) -> Any:
        """The binary tree state stored with the previous window of this window's period, or None.

        None starts the period's tree at this window: at the period's first window, or when the
        previous window was never released (it expired). A restarted tree stays within the period's
        loss: a unit still contributes to at most ``max_windows_per_unit`` windows of the period,
        and the new tree has no more levels than the period's.
        """
        period_start, _ = period_of(query, window_start_ms)
        if window_start_ms == period_start:
            return None
        previous = window_start_ms - query.config.window.size_ms
        cached = self._latest.get(query.name)
        if cached is not None and cached[0] == previous:
            return cached[1]
        stored = await asyncio.to_thread(self.ledger.get, query.name, previous)  # LedgerUnavailable: held
        if stored is None:
            return None
        try:
            return decode_entry(stored.payload).state
        except WireFormatError:
            return None


def _resumed(query: Any, window: Any, previous: Any, settings: str, period_start: int) -> tuple[Any, Any] | None:
    """(tree state, restarted_ms) to continue from ``previous``, or None when the tree must restart here."""
    if previous is None:
        return None
    fields, arrays = previous
    plan = query.plan.continual
    if fields.get("settings") == settings:
        state = TreeState.from_columns(fields["tree"], arrays)
        # Equal settings make equal groups and components; a state that fits no longer is restarted, not fed
        # to the plan (which refuses it, and would refuse it again after every restart of the worker).
        components = {c for c, noise in (("count", plan.count_noise), ("sum", plan.sum_noise)) if noise is not None}
        if state.n_groups == len(window.groups) and state.components() == components:
            return state, fields.get("restarted_ms")
    log.warning(
        "continual settings of query %s changed within the period starting at %d (stored %s, now %s): a new "
        "running total starts at window %d, and units are charged the period again at their next window",
        query.name, period_start, fields.get("settings"), settings, window.window_start_ms,
    )
    return None


def build_continual(query: Any, window: Any, noise: Any, released_at_ms: int, previous: Any) -> ReleaseEntry:
    plan = query.plan.continual
    settings = settings_fingerprint(query)
    period_start, index = period_of(query, window.window_start_ms)
    resumed = _resumed(query, window, previous, settings, period_start)
    if resumed is None:
        state, restarted_ms = None, (window.window_start_ms if index > 1 else None)
    else:
        state, restarted_ms = resumed
    step = 1 if state is None else state.t + 1
    counts = np.asarray(window.count, dtype=np.int64)
    sums = None if window.sum is None else np.asarray(window.sum, dtype=np.float64)
    released, state = plan.step(state, step, counts, sums, noise)
    running = _Running(
        keep=np.ones(len(window.groups), dtype=bool),
        count=released.count, sum=released.sum, mean=released.mean, mean_ci95=released.mean_ci95,
        count_std=released.count_std, sum_std=released.sum_std,
        count_ci95=released.count_ci95, sum_ci95=released.sum_ci95,
    )
    block = {
        "period_start": iso_utc(period_start), "period_start_ms": period_start,
        "period_end_ms": period_start + query.config.continual.period_ms,
        "window_index": index, "windows_per_period": plan.windows_per_period,
        "max_windows_per_unit": plan.max_windows_per_unit, "tree_restarted_ms": restarted_ms,
    }
    entry = build_entry(query, window, running, released_at_ms, extra_prefix=b',"continual":' + orjson.dumps(block))
    tree_fields, arrays = state.to_columns()
    stored = {"tree": tree_fields, "restarted_ms": restarted_ms, "settings": settings}
    return ReleaseEntry(**{**entry.__dict__, "state": (stored, arrays)})
