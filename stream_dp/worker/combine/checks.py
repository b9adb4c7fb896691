"""Why the partials of one window cannot be added up soundly.

Each check returns a reason (the label of the window's ``withheld`` and of
its metric) or None. A window whose partials conflict is released as if
empty, noise only: its units stay charged, which errs on the safe side.
"""

from __future__ import annotations

from stream_dp.worker.partials.wire import PartialAggregate


def settings_conflict(partials: list[PartialAggregate], settings: str | None) -> str | None:
    """Why these partials were not charged under ``settings``, the releasing worker's own, or None.

    A unit was charged the loss of the settings its ingest worker ran, and the
    release is noised for the releasing worker's. After a query changed (a
    rolling restart, say) the two can differ: units charged epsilon 1 would be
    released with the noise of epsilon 4, window 3 of one window grid would be
    added up as window 3 of another. A partial without a fingerprint (written
    by an earlier version) may have been charged under anything, so it counts
    as charged under other settings too (``settings_missing``, told apart
    from ``settings_differ``: it is what a rolling upgrade from such a
    version shows, not a changed query). ``settings`` None (a combiner used
    alone, in tools and tests) checks nothing.
    """
    if settings is None:
        return None
    if any(p.settings is not None and p.settings != settings for p in partials):
        return "settings_differ"
    if any(p.settings is None for p in partials):
        return "settings_missing"
    return None


def placement_conflict(partials: list[PartialAggregate]) -> str | None:
    """Why these partials of one window cannot be added up soundly, or None.

    Each input partition bounds the units whose events it holds. That bounds a
    unit once only if all its events sit on one partition, which the ingest
    stage checks against the topic's partition count. When the count changed
    while the window was open, or partitions checked against different counts,
    a unit may have events on two partitions, each bounded on its own: the
    window's data is then left out (its release is noise only; the units stay
    charged). A partial from a worker that did not check placement (count 0)
    is only trusted alone.
    """
    if any(p.placement_changed for p in partials):
        return "partition_count_changed"
    if len(partials) > 1 and any(p.placement_partitions == 0 for p in partials):
        return "placement_unchecked"
    if len({p.placement_partitions for p in partials}) > 1:
        return "partition_counts_differ"
    return None


def histogram_conflict(partials: list[PartialAggregate], bins: int | None) -> str | None:
    """Why these partials' histograms cannot be added up into ``bins`` bins, or None.

    With ``bins`` set (a quantiles query) every partial must carry a histogram
    of that many bins: one without (written by a worker that did not count
    values) or with another bin count (a changed configuration) would make
    the window's quantiles those of part of its data. Without ``bins`` the
    partials that carry histograms must agree with each other.
    """
    held = {p.histogram.bins for p in partials if p.histogram is not None}
    if bins is not None:
        if any(p.histogram is None for p in partials):
            return "histogram_missing"
        held.add(bins)
    return "histogram_bins_differ" if len(held) > 1 else None


def blocks_conflict(partials: list[PartialAggregate], blocks: bool) -> str | None:
    """Why a sample-and-aggregate query's partials cannot be combined (one lacks block values), or None."""
    return "blocks_missing" if blocks and any(partial.blocks is None for partial in partials) else None


def features_conflict(partials: list[PartialAggregate], width: int | None) -> str | None:
    """Why these partials' feature sums cannot be added up into ``width`` columns, or None."""
    if width is None:
        return None
    for partial in partials:
        if partial.features is None:
            return "features_missing"
        if partial.features.shape != (len(partial.groups), width):
            return "features_width_differs"
    return None
