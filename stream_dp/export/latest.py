"""The latest release of each query, bounded by configuration. Pure logic, no I/O.

A query's series are those of its newest window: a record of a newer window replaces the query's groups
(so a group no longer released loses its series), records of older windows (a replay, a restart reading
back) are ignored. What is shown is bounded by the query file alone: under public groups, the groups of the
configured list (and, for a hierarchy, their coarser levels); under selected groups, at most ``max_groups``
groups, those with the largest noisy counts (post-processing of DP outputs); a top-k list ranks at most k.

A public query publishes every window, so its next window replaces its groups. A window in which selection
released no group publishes nothing at all; so under selected groups the groups of a window also go once the
wall clock is ``expire_ms`` past its end with nothing newer (the next window's end, its allowed lateness and
release timeout, and a window more), rather than be shown as if released again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from stream_dp.export.samples import Sample, group_label, group_samples, top_k_samples

#: What became of a record (the exporter counts them by this).
SHOWN, OLDER_WINDOW, UNKNOWN_QUERY, OUTSIDE_GROUPS, NOT_A_RELEASE = (
    "shown", "older_window", "unknown_query", "outside_groups", "not_a_release")


@dataclass(frozen=True)
class QueryBounds:
    """Which groups of one query may have series: ``public`` labels (None: groups are selected, at most
    ``max_groups`` of them)."""

    public: frozenset[str] | None
    max_groups: int
    expire_ms: int | None = None  # selected groups: shown this long after their window's end at most

    @classmethod
    def of(cls, query: Any, max_groups: int) -> QueryBounds:
        """From a ``QueryConfig``: its public keys and every leading part of each (a hierarchy's levels)."""
        keys = query.public_group_keys()
        if keys is None:
            window = query.window
            return cls(None, max_groups, 2 * window.size_ms + window.allowed_lateness_ms + query.release_timeout_ms)
        labels = {",".join(str(v) for v in key[:length]) for key in keys for length in range(1, len(key) + 1)}
        return cls(frozenset(labels), max_groups)


@dataclass
class _Window:
    start_ms: int
    end_ms: int
    epsilon: float
    as_if_empty: bool
    groups: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    top_k: Mapping[str, Any] | None = None


def _window_of(record: Mapping[str, Any]) -> tuple[int, int] | None:
    try:
        start, end = record["window"]["start_ms"], record["window"]["end_ms"]
    except (KeyError, TypeError):
        return None
    return (start, end) if isinstance(start, int) and isinstance(end, int) else None


class LatestReleases:
    """The newest window of each configured query; ``add`` records, ``samples`` renders (thread-safe)."""

    def __init__(self, bounds: Mapping[str, QueryBounds], clock_ms: Callable[[], int] | None = None) -> None:
        self.bounds = dict(bounds)
        self._clock_ms = clock_ms if clock_ms is not None else (lambda: int(time.time() * 1000))
        self._windows: dict[str, _Window] = {}
        self._lock = threading.Lock()

    def add(self, record: Any) -> str:
        """Take one decoded record; what became of it (``SHOWN``, ``OLDER_WINDOW``, ...)."""
        if not isinstance(record, Mapping) or not isinstance(record.get("query"), str):
            return NOT_A_RELEASE
        window = _window_of(record)
        if window is None:
            return NOT_A_RELEASE
        bounds = self.bounds.get(record["query"])
        if bounds is None:
            return UNKNOWN_QUERY
        is_top_k = record.get("kind") == "top_k"
        if not is_top_k:
            if not isinstance(record.get("group"), Mapping):
                return NOT_A_RELEASE
            label = group_label(record["group"])
            if bounds.public is not None and label not in bounds.public:
                return OUTSIDE_GROUPS
        with self._lock:
            current = self._windows.get(record["query"])
            if current is not None and window[0] < current.start_ms:
                return OLDER_WINDOW
            if current is None or window[0] > current.start_ms:
                privacy = record.get("privacy") or {}
                # a top_k record's epsilon is its own share; it states the window's as window_epsilon
                spent = privacy.get("window_epsilon", privacy.get("epsilon"))
                current = _Window(window[0], window[1], float(spent or 0.0), False)
                self._windows[record["query"]] = current
            current.as_if_empty |= "as_if_empty" in record
            if is_top_k:
                current.top_k = record
            else:
                current.groups[label] = record
        return SHOWN

    def add_all(self, records: Iterable[Any]) -> dict[str, int]:
        outcomes: dict[str, int] = {}
        for record in records:
            outcome = self.add(record)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
        return outcomes

    def samples(self) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
        """(metric, labels with ``query`` first, value) of every series to show now."""
        out: list[tuple[str, tuple[tuple[str, str], ...], float]] = []
        now_ms = self._clock_ms()
        with self._lock:
            for query, window in sorted(self._windows.items()):
                expire_ms = self.bounds[query].expire_ms
                expired = expire_ms is not None and now_ms - window.end_ms > expire_ms
                shown = [] if expired else self._shown(query, window)
                labels = (("query", query),)
                out.append(("stream_dp_release_window_end_seconds", labels, window.end_ms / 1000))
                out.append(("stream_dp_release_epsilon", labels, window.epsilon))
                out.append(("stream_dp_release_as_if_empty", labels, float(window.as_if_empty)))
                out.append(("stream_dp_release_groups", labels, float(len(shown))))
                samples: list[Sample] = [s for label in shown for s in group_samples(window.groups[label])]
                if window.top_k is not None and not expired:
                    samples += top_k_samples(window.top_k)
                out += [(s.metric, (("query", query), *s.labels), s.value) for s in samples]
        return out

    def _shown(self, query: str, window: _Window) -> list[str]:
        bounds = self.bounds[query]
        if bounds.public is not None:
            return sorted(window.groups)  # only listed groups were taken

        def largest_first(label: str) -> tuple[float, str]:
            count = window.groups[label].get("count")
            return (-float(count) if isinstance(count, int | float) else float("inf"), label)
        return sorted(window.groups, key=largest_first)[: bounds.max_groups]
