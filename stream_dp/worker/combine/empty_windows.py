"""Windows of public groups that no partition sent a partial for: published too, in order per home.

For queries with public groups, windows in which no partition had any event are released too (all
counts zero before noise) once every partition's progress has passed them: otherwise the mere
presence of a release would say, without noise, that somebody was active in that window. For the
same reason where a query's publication starts is no data's doing: its first window is
``query_start_ms``, the window holding the query's publication start (the wall clock at its first
start less ``allowed_lateness``, kept in the release ledger, or ``window.publish_from``). Each home
releases its windows in order from its released mark, or from that first window if it has released
none (``WindowCombiner.home_start``); a window before that is never released, data or not
(``WindowCombiner.unreleasable``).

Pure logic over one home's windows: the combiner passes in what it knows (pending windows, progress,
its home function) and gets window starts back.
"""

from __future__ import annotations

from collections.abc import Callable, Container

MAX_EMPTY_WINDOWS_PER_STEP = 1_000  # bounds the work after a long silence


def in_home_order(
    home: int, start: int, data: list[int], *, size: int, through: int | None, pending: Container[int],
    home_of: Callable[[int], int],
) -> list[int]:
    """The windows ``home`` may release now, in window order from ``start``: those of ``data`` (complete
    windows with partials, sorted, none before ``start``) and the empty ones that progress (``through``:
    every input partition closed through it, None: not known for all) shows empty.

    A window with data waits while an earlier window of its home has neither data nor the progress that
    shows it empty, and an empty window is released once progress shows it empty, whether or not any
    window had data. Otherwise the releases (and the gaps between them) would tell without noise which
    windows had activity. At most ``MAX_EMPTY_WINDOWS_PER_STEP`` empty windows per call.
    """
    out: list[int] = []
    last = max(data[-1] if data else start, start)
    added = 0
    while start <= last or (through is not None and start + size <= through):
        if home_of(start) == home:
            if start in pending:
                if start not in data:
                    break  # its data is not ready: later windows of this home wait
                out.append(start)
            elif through is not None and start + size <= through and added < MAX_EMPTY_WINDOWS_PER_STEP:
                out.append(start)
                added += 1
            else:
                break  # not known empty yet (or enough for one step): later windows wait
        start += size
    return out


def first_unaccounted_empty(
    home: int, start: int, *, size: int, through: int | None, pending: Container[int], home_of: Callable[[int], int],
    closed_by_one: int | None, behind: Callable[[int], list[int]],
) -> tuple[int, list[int]] | None:
    """The first window of ``home`` from ``start`` that some input partition has closed (``closed_by_one``:
    the furthest progress of any, None: none reported), that has no partial and that progress does not
    show empty yet, and the input partitions whose progress is behind its end (``behind``); None when there
    is none. Every later window of the home waits for it, as for a window with data (a paused worker's
    partition): the combiner times it from when it first finds it, as it times a window from its first
    partial. Closed by a partition's progress, never by this process's wall clock, which may run ahead."""
    if through is not None and start + size <= through:  # shown empty through ``through``: skip ahead
        start += (through - start) // size * size
    if closed_by_one is None:
        return None
    while start + size <= closed_by_one:
        if home_of(start) == home and start not in pending:
            waiting = behind(start + size)
            if waiting:
                return start, waiting
        start += size
    return None
