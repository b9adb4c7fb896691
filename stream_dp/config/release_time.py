"""How long a window's release may take, and the cap on released groups that bounds it.

A worker's release stage releases every query's windows one after another, the whole file's, so one
slow release holds up every other query's. Most releases are vectorised and take milliseconds however
many groups they hold; four options work group by group: ``quantiles`` (one exponential-mechanism draw
through OpenDP per group and quantile), ``mean_vector`` and ``covariance`` (Gaussian noise through
OpenDP on every coordinate of every group, then per-group post-processing) and ``sample_aggregate``
(the user function on every block of every group). With privately selected groups nothing else bounds
how many groups they run over -- a producer can make up any number of groups and units that pass
selection -- so such a query must set ``max_released_groups`` on its option: a window releases at most
that many groups, those with the largest noisy counts (``stream_dp.worker.release.build``). ``check-config`` then
holds each query's release time within its window, and all of them together within the release
stage's time; the worker gives its release consumer a poll interval that covers them.
"""

from __future__ import annotations

from typing import Any

#: The largest ``max_released_groups`` accepted (the options' field bound).
MAX_RELEASED_GROUPS = 1_000_000

#: What ``max_released_groups`` means, for the options that hold it (their field's description).
MAX_RELEASED_GROUPS_DESCRIPTION = ("With groups.select, the most groups a window releases, those with the largest "
                                   "noisy counts; required then, refused with public groups.")

#: The options whose release works group by group, in the order a query is searched for one.
CAPPED_KINDS = ("quantiles", "mean_vector", "covariance", "sample_aggregate")

# Release time per group, measured through ``build_release`` (noise, post-processing, records) with
# ``tests/perf/bench_group_release.py`` on a 2-core machine shared with other work: a quantile draw
# took 106-230 us per group (from 64 to 4096 bins; OpenDP's FFI call dominates, the scores grow with
# the bins), a vector 12-30 us per noised coordinate plus 30-50 us per group (numpy's eigenvalues of
# a covariance included). The figures below are the upper end of those runs, rounded up: an
# estimate for a CPU of that class, not a bound; a slower or busier one takes longer.
QUANTILE_DRAW_US = 200.0
QUANTILE_DRAW_US_PER_BIN = 0.025
# value_interval: a noisy histogram of each group, read once per q: 0.94-1.9 us per bin and group at 3 q's
# (64 to 4096 bins, measured on the same loaded machine), i.e. about 0.5 us per bin plus 0.5 per bin and q.
QUANTILE_INTERVAL_US_PER_BIN = 0.5
QUANTILE_INTERVAL_US_PER_BIN_AND_Q = 0.5
VECTOR_GROUP_US = 60.0
VECTOR_COORDINATE_US = 17.0


def capped_option(query: Any) -> tuple[str, Any] | None:
    """``(kind, options)`` of the query's option that releases group by group, or None."""
    aggregations = query.aggregations
    for kind in CAPPED_KINDS:
        options = getattr(aggregations, kind)
        if options is not None:
            return kind, options
    return None


def max_released_groups(query: Any) -> int | None:
    """The query's ``max_released_groups`` (on its quantiles, vector or sample_aggregate), or None."""
    capped = capped_option(query)
    return None if capped is None else capped[1].max_released_groups


def worst_case_release_ms(sa: Any, groups: int) -> int:
    """How long a window's blocks take if every one runs out its timeout (each runs in turn, in the sandbox)."""
    return groups * sa.blocks * sa.timeout_ms


def coordinates(kind: str, fields: int) -> int:
    """Noised coordinates per group: the vector and the unit count, or the upper triangle of ``x̃x̃ᵀ``."""
    return fields + 1 if kind == "mean_vector" else (fields + 1) * (fields + 2) // 2


def group_release_ms(kind: str, options: Any) -> float:
    """Estimated release time of one group (at worst, for sample_aggregate: every block timing out)."""
    if kind == "sample_aggregate":
        return float(worst_case_release_ms(options, 1))
    if kind == "quantiles":
        return (len(options.q) * (QUANTILE_DRAW_US + QUANTILE_DRAW_US_PER_BIN * options.bins)
                + _interval_us(options)) / 1000
    return (VECTOR_GROUP_US + VECTOR_COORDINATE_US * coordinates(kind, len(options.fields))) / 1000


def _interval_us(options: Any) -> float:
    if not getattr(options, "value_interval", False):
        return 0.0
    return options.bins * (QUANTILE_INTERVAL_US_PER_BIN + QUANTILE_INTERVAL_US_PER_BIN_AND_Q * len(options.q))


def cost_basis(kind: str, options: Any) -> str:
    """What a group's release time is made of, for messages: e.g. ``3 quantiles x 4096 bins``."""
    if kind == "sample_aggregate":
        return f"{options.blocks} blocks x timeout {options.timeout_ms} ms"
    if kind == "quantiles":
        per_draw = (QUANTILE_DRAW_US + QUANTILE_DRAW_US_PER_BIN * options.bins) / 1000
        interval = (f" + about {_interval_us(options) / 1000:.3g} ms of value intervals"
                    if getattr(options, "value_interval", False) else "")
        return f"{len(options.q)} quantiles x about {per_draw:.3g} ms at {options.bins} bins{interval}"
    n = coordinates(kind, len(options.fields))
    return f"about {group_release_ms(kind, options):.3g} ms for {n} noised coordinates"


def released_groups(query: Any) -> int | None:
    """The most groups a window releases: the public list's length, else ``max_released_groups``."""
    public = query.public_group_keys()
    return len(public) if public is not None else max_released_groups(query)


def window_release_ms(query: Any) -> float | None:
    """A window's estimated release time over its most released groups (sample_aggregate: at worst), or
    None when the query has no group-by-group option or its groups are not bounded."""
    capped = capped_option(query)
    groups = released_groups(query)
    if capped is None or groups is None:
        return None
    return groups * group_release_ms(*capped)


def together_release_ms(queries: list[Any]) -> float:
    """The release time of every group-by-group window of the file ending at one moment (all do, at the
    end of the longest window): how long the release stage may go without polling its consumer."""
    return sum(worst for query in queries if (worst := window_release_ms(query)) is not None)


def check_release_time_together(queries: list[Any]) -> None:
    """The group-by-group releases of one file, taken together: raises ``ValueError`` saying what to lower.

    The release stage releases every query's windows one after another, so their release times add up:
    per window of each query, its released groups' time, which must take at most the whole of the
    release stage's time (the sum over queries of time per window over window) or releases fall further
    behind with every window. Each query's own bound (``release_time_fixes``) is this one for a file
    holding it alone."""
    parts = [(query, worst) for query in queries if (worst := window_release_ms(query)) is not None]
    if len(parts) < 2:
        return
    busy = sum(worst / query.window.size_ms for query, worst in parts)
    if busy <= 1.0:
        return
    each = ", ".join(f"{query.name} {worst / 1000:.6g} s per {query.window.size_ms / 1000:g} s window "
                     f"({capped_option(query)[0]})" for query, worst in parts)  # type: ignore[index]
    raise ValueError(
        f"the queries releasing group by group keep the release stage busy {busy * 100:.6g}% of the time at worst "
        f"({each}; each is its released groups x one group's release time: every block running out its timeout "
        "for sample_aggregate, the measured time of OpenDP's draws for the others): one worker releases every "
        "query of the file one after another, so releases would fall further behind with every window; lower "
        "their max_released_groups (or q, bins, fields; timeout or blocks), or use longer windows"
    )


def release_time_fixes(query: Any, kind: str, options: Any) -> list[str]:
    """What the query must change so that a window's release is bounded and fits the window, one fix a line.

    The option works on every released group, so their number must be bounded: by the public list, or
    with selected groups by ``max_released_groups``; and that many groups' release must fit the window,
    or releases fall further behind with every window."""
    public = query.public_group_keys()
    cap = options.max_released_groups
    window_ms = query.window.size_ms
    per_group = group_release_ms(kind, options)
    basis = cost_basis(kind, options)
    if public is not None and cap is not None:
        return [f"no max_released_groups with groups.public (every listed group is released; the list bounds "
                f"the {kind} release's work)"]
    if public is None and cap is None:
        fits = min(int(window_ms // per_group), MAX_RELEASED_GROUPS)
        basis = basis if kind == "sample_aggregate" else basis + " per group"
        example = (f"e.g. max_released_groups: {fits} fits the {window_ms / 1000:g} s window at {basis}" if fits else
                   f"not one group fits the {window_ms / 1000:g} s window at {basis}: "
                   + ("lower timeout or blocks too" if kind == "sample_aggregate" else "use longer windows"))
        if kind == "sample_aggregate":
            return [f"max_released_groups with privately selected groups: the most groups a window releases (those "
                    "with the largest noisy counts), which bounds the function's work: a producer can make up any "
                    f"number of groups; {example}"]
        return [f"max_released_groups with privately selected groups: the most groups a window releases (those "
                f"with the largest noisy counts), which bounds the release's work (OpenDP draws per group): a "
                "producer can make up any number of groups that pass selection, and while one window is released "
                f"every query's releases wait; {example}"]
    groups = len(public) if public is not None else cap
    worst_ms = groups * per_group
    if worst_ms <= window_ms:
        return []
    what = f"{groups} groups" if public is not None else f"max_released_groups {groups}"
    if kind == "sample_aggregate":
        # Blocks run one after another with a fixed time each (a shared deadline would let one unit's slow
        # block fail the blocks after it); at worst every block runs out its timeout.
        lower = "timeout or blocks" if public is not None else "max_released_groups, timeout or blocks"
        return [f"a worst-case release time within the window: {what} x {basis} = {worst_ms / 1000:g} s per "
                f"window of {window_ms / 1000:g} s; lower {lower}, or use longer windows"]
    if kind == "quantiles":
        lower = "q or bins" if public is not None else "max_released_groups, q or bins"
    else:
        lower = "fields" if public is not None else "max_released_groups or fields"
    return [f"a release time within the window: {what} x {basis} per group = about {worst_ms / 1000:.4g} s per "
            f"window of "
            f"{window_ms / 1000:g} s; lower {lower}, or use longer windows"]
