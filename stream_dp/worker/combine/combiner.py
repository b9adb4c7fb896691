"""Combine per-partition partials of a window into one total, and decide when
a window can be released. Pure logic: no Kafka, no Redis, no clock of its own.

Each window of a query has a **home**, one partition of the partials topic
(``partials.homes``): the release consumer that owns the home releases the window,
and judges its completeness only with the progress read from that partition.

A window is **complete** when every input partition has either sent its
partial or reported progress through the window's end (a partition with no
events in a window sends no partial), or has been shown by the broker to hold
nothing more for it. The input partitions are those the partials and
progress name and those the topic's metadata lists (``note_input_partitions``),
so partitions added to the topic are waited for as soon as either knows them.
A window is never released because a partition is late: one that has waited
``release_timeout_ms`` (wall clock, from its first partial) is **overdue**, and
the release stage asks the broker about its missing partitions
(``stream_dp.worker.release.partition_lag``): those whose records show nothing more
for the window are left out (``leave_out``); the others are waited for, with
a metric, an alert and a log line. Partials that come after their window was
released are counted and dropped (the budget they charged stays charged,
which errs on the safe side).

Windows of public groups without any partial are released too, in order per home from the query's
publication start (``combine.empty_windows``).

A window is added up only from partials charged under the settings it is
noised for: each partial names its ingest worker's settings fingerprint, and
a window with a partial of other settings, or of none, is released as if
empty (``combine.checks.settings_conflict``; logged here with the
fingerprints).

A quantiles query's partials carry per-group value histograms; the combined
window adds them up cell by cell into ``CombinedWindow.histogram``, a sparse
``(len(groups), bins)`` matrix aligned with its groups (a public group without
data is an all-zero row, i.e. no cell).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

from stream_dp.worker.combine.checks import (
    blocks_conflict,
    features_conflict,
    histogram_conflict,
    placement_conflict,
    settings_conflict,
)
from stream_dp.worker.combine.empty_windows import first_unaccounted_empty, in_home_order
from stream_dp.worker.combine.totals import CombinedWindow, merge_partials
from stream_dp.worker.partials.homes import window_home
from stream_dp.worker.partials.wire import GroupKey, PartialAggregate, Progress

log = logging.getLogger(__name__)
COMBINE_FAILED = "combine_failed"  # the ``withheld`` reason of a window whose partials raised when added up


@dataclass
class _Pending:
    window_end_ms: int
    first_seen_ms: int
    partials: dict[int, PartialAggregate] = field(default_factory=dict)
    source_offsets: list[tuple[int, int]] = field(default_factory=list)  # (partials-topic partition, offset)
    left_out: set[int] = field(default_factory=set)  # input partitions shown to hold nothing more for it


@dataclass(frozen=True)
class Overdue:
    """A window waiting past the release timeout, and the input partitions it still waits for."""

    window_start_ms: int
    window_end_ms: int
    first_seen_ms: int
    home: int
    partitions: list[int]


class WindowCombiner:
    """Pending windows of one query, for the home partitions this process owns."""

    def __init__(
        self,
        query: str,
        *,
        window_size_ms: int,
        window_offset_ms: int,
        release_timeout_ms: int,
        public_groups: list[GroupKey] | None,
        has_sum: bool,
        partials_partitions: int = 1,
        period: tuple[int, int] | None = None,
        quantile_bins: int | None = None,
        feature_width: int | None = None,
        blocks: bool = False,
        settings: str | None = None,
    ) -> None:
        """``quantile_bins``: the bin count of a quantiles query's histograms; then every combined
        window has a histogram, empty and withheld windows an all-zero one. ``feature_width``: the
        width of a vector query's feature sums; then every combined window has them (zeros when empty).
        ``settings``: the fingerprint of the settings the window is noised for, which its partials must
        carry; a ``QueryRuntime`` sets its own (None checks nothing: for a combiner used alone)."""
        if window_size_ms <= 0:
            raise ValueError(f"window_size_ms must be positive, got {window_size_ms}")
        if release_timeout_ms <= 0:
            raise ValueError(f"release_timeout_ms must be positive, got {release_timeout_ms}")
        if partials_partitions < 1:
            raise ValueError(f"partials_partitions must be at least 1, got {partials_partitions}")
        if quantile_bins is not None and (isinstance(quantile_bins, bool) or not isinstance(quantile_bins, int)
                                          or quantile_bins < 1):
            raise ValueError(
                f"quantile_bins must be a positive int or None, got {quantile_bins!r}; pass the query's quantiles.bins"
            )
        self.quantile_bins = quantile_bins
        if feature_width is not None and (isinstance(feature_width, bool) or not isinstance(feature_width, int)
                                          or feature_width < 1):
            raise ValueError(f"feature_width must be a positive int or None, got {feature_width!r}")
        self.feature_width = feature_width
        self.blocks = blocks  # a sample-and-aggregate query: partials carry block values
        self.settings = settings
        self.query = query
        self.window_size_ms = window_size_ms
        self.window_offset_ms = window_offset_ms
        self.release_timeout_ms = release_timeout_ms
        self.public_groups = public_groups
        self._public_index = {g: i for i, g in enumerate(public_groups)} if public_groups is not None else None
        self.has_sum = has_sum
        self.partials_partitions = partials_partitions
        self.period = period  # (period_ms, offset_ms) of a continual query: windows of a period share a home
        self.input_partitions = 0
        self.released_through_ms: dict[int, int] = {}  # per home partition
        # Homes whose released mark could not be read from the ledger: they release nothing until it is.
        self.unknown_homes: set[int] = set()
        # Start of a public-groups query's first published window, the one holding its publication start (set by
        # the release stage, ``release.publication_start``); None: not known yet, and nothing of the query is released.
        self.query_start_ms: int | None = None
        self.progress: dict[int, dict[int, int]] = {}  # home partition -> input partition -> closed through
        self._pending: dict[int, _Pending] = {}
        # empty window -> when first found holding up its home: timed from then, as a window from its first partial
        self._empty_seen: dict[int, int] = {}

    def home(self, window_start_ms: int) -> int:
        return window_home(self.query, window_start_ms, self.partials_partitions, self.period)

    # -- input ---------------------------------------------------------------------------

    def add_partial(
        self, partial: PartialAggregate, now_ms: int, source: tuple[int, int] | None = None, *, unreleased: bool = False
    ) -> bool:
        """Add a partial; False when its window may have been released already (a late or replayed partial).

        ``released_through_ms`` only says that *some* window up to it was
        released; the caller asks the ledger and passes ``unreleased=True``
        when this window was in fact never released (a later one of selected
        groups went first). A public-groups window before its home's start
        (``unreleasable``) is refused whatever ``unreleased`` says.
        """
        self.note_input_partitions(partial.input_partitions)
        pending = self._pending.get(partial.window_start_ms)
        if pending is None:
            if self.unreleasable(partial.window_start_ms):
                return False  # before its home's start: never released (``unreleased`` only serves selected groups)
            if not unreleased and self.is_released(partial.window_start_ms, partial.window_end_ms):
                return False
            pending = self._pending[partial.window_start_ms] = _Pending(partial.window_end_ms, now_ms)
        # A replay of the same partition's partial carries the same values; keep the first.
        pending.partials.setdefault(partial.partition, partial)
        if source is not None:
            pending.source_offsets.append(source)
        return True

    def add_progress(self, progress: Progress, home: int) -> None:
        """Progress read from partials partition ``home``."""
        self.note_input_partitions(progress.input_partitions)
        seen = self.progress.setdefault(home, {})
        if progress.closed_through_ms > seen.get(progress.partition, -1):
            seen[progress.partition] = progress.closed_through_ms

    def note_input_partitions(self, count: int) -> None:
        """The input topic has (at least) ``count`` partitions: every window waits for each of them.
        A topic's partitions are only ever added, so the count never goes down."""
        self.input_partitions = max(self.input_partitions, count)

    def leave_out(self, window_start_ms: int, partitions: set[int]) -> None:
        """The broker showed these input partitions to hold nothing more for the window (``release.partition_lag``).
        An empty window of public groups gets a pending entry without partials, released once accounted for."""
        pending = self._pending.get(window_start_ms)
        if pending is None and self.public_groups is not None:
            end = window_start_ms + self.window_size_ms
            if self.unreleasable(window_start_ms) or self.is_released(window_start_ms, end):
                return
            pending = self._pending[window_start_ms] = _Pending(end, end)
        if pending is not None:
            pending.left_out |= partitions

    def is_released(self, window_start_ms: int, window_end_ms: int) -> bool:
        through = self.released_through_ms.get(self.home(window_start_ms))
        return through is not None and window_end_ms <= through

    def restore_released_through(self, home: int, window_end_ms: int) -> None:
        if window_end_ms > self.released_through_ms.get(home, -1):
            self.released_through_ms[home] = window_end_ms

    def home_start(self, home: int) -> int | None:
        """A public-groups query's first window that ``home`` may still release: its released mark, or the
        query's first window if it has released none. None while either is unknown (nothing is released)."""
        if home in self.unknown_homes:
            return None
        released = self.released_through_ms.get(home)
        return released if released is not None else self.query_start_ms

    def unreleasable(self, window_start_ms: int) -> bool:
        """Whether a public-groups window lies before where its home releases from: never released, data or not.

        The window clock and the publication start decide it, so a partial's data never makes such a window
        published while the empty windows beside it are not.
        """
        if self.public_groups is None:
            return False
        start = self.home_start(self.home(window_start_ms))
        return start is not None and window_start_ms < start

    def discard_unreleasable(self, owned: set[int] | None = None) -> list[tuple[int, int]]:
        """Drop the pending windows (of the homes in ``owned``) that ``unreleasable`` now says are never
        released: added before the query's start or a home's mark was known. Returns (window start, partials)."""
        dropped = [(start, len(pending.partials)) for start, pending in self._pending.items()
                   if (owned is None or self.home(start) in owned) and self.unreleasable(start)]
        for start, _ in dropped:
            del self._pending[start]
        return sorted(dropped)

    def revoke(self, homes: set[int]) -> None:
        """Forget windows and progress of partials partitions now owned elsewhere."""
        for start in [s for s in self._pending if self.home(s) in homes]:
            del self._pending[start]
        for home in homes:
            self.progress.pop(home, None)
            self.released_through_ms.pop(home, None)
            self.unknown_homes.discard(home)

    # -- decisions -----------------------------------------------------------------------

    def _progress_of(self, home: int, partition: int) -> int:
        return self.progress.get(home, {}).get(partition, -1)

    def _waiting_for(self, window_start_ms: int, pending: _Pending) -> list[int]:
        """Input partitions that neither sent the window's partial, nor reported it closed, nor were left out."""
        home = self.home(window_start_ms)
        return [
            p for p in range(self.input_partitions)
            if p not in pending.partials and p not in pending.left_out
            and self._progress_of(home, p) < pending.window_end_ms
        ]

    def _complete(self, window_start_ms: int, pending: _Pending) -> bool:
        return self.input_partitions > 0 and not self._waiting_for(window_start_ms, pending)

    def overdue(self, now_ms: int, owned: set[int] | None = None) -> list[Overdue]:
        """Windows of the homes in ``owned`` (None: all) that waited ``release_timeout_ms`` or longer and are
        not complete, oldest first, each with the partitions it waits for."""
        out = []
        for start in sorted(self._pending):
            pending = self._pending[start]
            home = self.home(start)
            if (owned is not None and home not in owned) or now_ms - pending.first_seen_ms < self.release_timeout_ms:
                continue
            waiting = self._waiting_for(start, pending) if self.input_partitions else []
            if waiting:
                out.append(Overdue(start, pending.window_end_ms, pending.first_seen_ms, home, waiting))
        if self.public_groups is not None and self.input_partitions:
            homes = sorted(owned) if owned is not None else range(self.partials_partitions)
            blocking = [w for home in homes if (w := self._empty_blocking(home, now_ms)) is not None]
            self._empty_seen = {w.window_start_ms: self._empty_seen.get(w.window_start_ms, now_ms) for w in blocking}
            out += [replace(w, first_seen_ms=self._empty_seen[w.window_start_ms]) for w in blocking
                    if now_ms - self._empty_seen[w.window_start_ms] >= self.release_timeout_ms]
        return sorted(out, key=lambda w: w.window_start_ms)

    def _empty_blocking(self, home: int, now_ms: int) -> Overdue | None:
        """The first ended window of ``home`` without a partial that progress does not show empty
        (``combine.empty_windows``), with ``first_seen_ms`` left to the caller."""
        start = self.home_start(home)
        if start is None:
            return None
        found = first_unaccounted_empty(
            home, start, size=self.window_size_ms, through=self._min_progress(home), pending=self._pending,
            home_of=self.home, closed_by_one=max(self.progress.get(home, {}).values(), default=None),
            behind=lambda end: [p for p in range(self.input_partitions) if self._progress_of(home, p) < end],
        )
        if found is None:
            return None
        start, waiting = found
        return Overdue(start, start + self.window_size_ms, now_ms, home, waiting)

    def _min_progress(self, home: int) -> int | None:
        seen = self.progress.get(home, {})
        if self.input_partitions == 0 or any(p not in seen for p in range(self.input_partitions)):
            return None
        return min(seen[p] for p in range(self.input_partitions))

    def ready(self, owned: set[int] | None = None) -> list[int]:
        """Start times of the windows this process may release now, oldest first: no clock takes part,
        a window is ready once every input partition is accounted for (see the module docstring).

        ``owned``: the partials partitions assigned to this process (None: all).
        """
        starts = [start for start, pending in self._pending.items()
                  if (owned is None or self.home(start) in owned) and self._complete(start, pending)]
        if self.public_groups is not None:
            starts = self._with_empty_windows(starts, owned)
        return sorted(set(starts))

    def _with_empty_windows(self, starts: list[int], owned: set[int] | None) -> list[int]:
        """Add the empty windows each home may release, and keep every home in order (``combine.empty_windows``).
        Pending windows before ``home_start`` are never released (``discard_unreleasable`` drops them)."""
        by_home: dict[int, list[int]] = {}
        for start in starts:
            by_home.setdefault(self.home(start), []).append(start)
        homes = owned if owned is not None else set(range(self.partials_partitions))
        out: list[int] = []
        for home in sorted(homes):
            start = self.home_start(home)
            if start is None:
                continue  # the query's start or the home's mark is not known yet: nothing is released
            data = sorted(w for w in by_home.get(home, ()) if w >= start)
            out += in_home_order(home, start, data, size=self.window_size_ms, through=self._min_progress(home),
                                 pending=self._pending, home_of=self.home)
        return out

    def pending_source_offsets(self) -> list[tuple[int, int]]:
        """(partials partition, offset) of every partial still pending: the consumer may not commit past them."""
        return [source for pending in self._pending.values() for source in pending.source_offsets]

    @property
    def pending_windows(self) -> int:
        return len(self._pending)

    # -- output --------------------------------------------------------------------------

    def take(self, window_start_ms: int) -> CombinedWindow:
        """Remove a window from the pending set and return its combined totals."""
        pending = self._pending.pop(window_start_ms, None)
        home = self.home(window_start_ms)
        window_end_ms = window_start_ms + self.window_size_ms if pending is None else pending.window_end_ms
        partials = [] if pending is None else [pending.partials[p] for p in sorted(pending.partials)]
        # Other settings first: they explain whatever else the partials disagree on (bins, widths, ...).
        withheld = (settings_conflict(partials, self.settings) or placement_conflict(partials)
                    or histogram_conflict(partials, self.quantile_bins)
                    or features_conflict(partials, self.feature_width) or blocks_conflict(partials, self.blocks))
        if withheld in ("settings_differ", "settings_missing"):
            log.warning(
                "window %d of %s: its partials were charged under settings %s (by input partition; None: not "
                "stated), this worker releases under %s; it is released as if empty (noise only) and its units "
                "stay charged -- expected while workers restart onto a changed query",
                window_start_ms, self.query, {p.partition: p.settings for p in partials}, self.settings,
            )
        try:
            groups, count, sums, distinct, histogram, features, blocks = self._merge([] if withheld else partials)
        except Exception:  # a fault the partials hit: released as if empty, never silent (``release.draw``)
            log.exception("window %d of %s: its partials cannot be added up; it is released as if empty",
                          window_start_ms, self.query)
            withheld = COMBINE_FAILED
            groups, count, sums, distinct, histogram, features, blocks = self._merge([])
        reported = {p.partition for p in partials}
        missing = [
            p for p in range(self.input_partitions)
            if p not in reported and self._progress_of(home, p) < window_end_ms
        ]
        self.restore_released_through(home, window_end_ms)
        return CombinedWindow(
            query=self.query,
            window_start_ms=window_start_ms,
            window_end_ms=window_end_ms,
            home=home,
            groups=groups,
            count=count,
            sum=sums,
            distinct_units=distinct,
            partitions_missing=missing,
            units_charged=sum(p.units_charged for p in partials),
            units_excluded=sum(p.units_excluded for p in partials),
            closed_at_ms=min((p.closed_at_ms for p in partials), default=None),
            source_offsets=[] if pending is None else list(pending.source_offsets),
            withheld=withheld,
            histogram=histogram,
            features=features,
            blocks=blocks,
        )

    def as_if_empty(self, window: CombinedWindow, reason: str) -> CombinedWindow:
        """``window`` without its partials' data (every public group at zero, no selected group), to be
        released as if empty for ``reason``: configuration and noise alone decide what it publishes."""
        groups, count, sums, distinct, histogram, features, blocks = self._merge([])
        return replace(window, groups=groups, count=count, sum=sums, distinct_units=distinct, withheld=reason,
                       histogram=histogram, features=features, blocks=blocks)

    def _merge(self, partials: list[PartialAggregate]) -> tuple:
        """The totals of ``partials`` under this query's groups and options (``combine.totals.merge_partials``)."""
        return merge_partials(partials, public_groups=self.public_groups, public_index=self._public_index,
                              has_sum=self.has_sum, quantile_bins=self.quantile_bins,
                              feature_width=self.feature_width, blocks=self.blocks)
