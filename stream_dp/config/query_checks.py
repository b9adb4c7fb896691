"""What a query's options can be combined with: continual releases, hierarchies, local DP, vectors and
sample-and-aggregate. Each check raises ``ValueError`` saying how to fix the query (``QueryConfig`` turns
it into a validation error naming the query)."""

from __future__ import annotations

from typing import Any

from stream_dp.config.aggregation_options import check_option_query
from stream_dp.config.release_time import release_time_fixes
from stream_dp.dp.local import REPORT_TAG_FIELD

MAX_WINDOWS_PER_PERIOD = 1 << 20
# an oue report is kept as one bit per value of the domain, and a window releases one record per value
MAX_UNARY_DOMAIN = 4096


def check_query_options(query: Any) -> None:
    """Continual releases, hierarchies and local DP: what they can be combined with."""
    public = query.public_group_keys() is not None
    check_option_query(query)
    if query.window.publish_from_ms is not None and not public:
        raise ValueError(
            "window.publish_from sets the first window a query over public groups publishes (every window is "
            "published from there on, data or not); a query over selected groups publishes what its selection "
            "releases in each window, whenever its data comes: remove publish_from"
        )
    quantiles = query.aggregations.quantiles
    if quantiles is not None and (fixes := release_time_fixes(query, "quantiles", quantiles)):
        raise ValueError("\n".join(f"quantiles needs {fix}" for fix in fixes))
    if query.local_dp is not None:
        _check_local_dp(query, public)
    if query.continual is not None:
        period, size = query.continual.period_ms, query.window.size_ms
        if period % size or period < 2 * size:
            raise ValueError(
                f"continual.period of {period} ms is not a multiple of at least two windows of {size} ms; "
                "use e.g. period: 1d with 1m windows"
            )
        if period // size > MAX_WINDOWS_PER_PERIOD:
            raise ValueError(
                f"continual.period holds {period // size} windows, more than {MAX_WINDOWS_PER_PERIOD}; "
                "use a shorter period or larger windows"
            )
        if query.continual.max_windows_per_unit > period // size:
            raise ValueError(
                f"continual.max_windows_per_unit {query.continual.max_windows_per_unit} exceeds the "
                f"{period // size} windows of a period; lower it"
            )
        if query.mechanism != "laplace":
            raise ValueError("continual releases use the binary tree mechanism with Laplace noise; set mechanism: laplace")
        if not public:
            raise ValueError("continual releases keep a running total per group: list the groups under groups.public")
        extra = sorted(query.aggregations.names() - {"count", "sum", "mean"})
        if extra:
            raise ValueError(f"continual releases running counts, sums and means; {extra} cannot be released "
                             "continually: move them to a query without continual")
        if query.hierarchy:
            raise ValueError("continual and hierarchy cannot be combined in one query; use two queries")
    # A query written without the count these two need is given one as it is read (stream_dp.config.implied):
    # the next two checks hold the line for a query built without that step.
    if not public and not query.aggregations.names() & {"count", "sum", "mean"}:
        raise ValueError(
            "with privately selected groups, top_k and quantiles work on the groups a count or sum release "
            "keeps: add count: {}, or list the groups under groups.public"
        )
    names = query.aggregations.names()
    if "quantiles" in names and not names & {"count", "mean"}:
        # Without a noisy count the rank error cannot be turned into the share of values below the released
        # value: every quantile would lack its 95% interval (q_interval).
        raise ValueError("quantiles are released with a 95% interval sized by the group's noisy count: add count: {} "
                         "beside them (it takes an equal share of epsilon)")
    top_k, public_keys = query.aggregations.top_k, query.public_group_keys()
    if top_k is not None and public_keys is not None and top_k.k >= len(public_keys):
        # Each of the k picks is charged, and a pick with one group left is forced (it tells nothing): k = m
        # charges every unit a pick that says nothing, more would charge picks that are never made.
        m = len(public_keys)
        fix = (f"set k to at most {m - 1}: the group the top {m - 1} leave out is the last" if m > 1
               else "list at least two public groups: over one group the ranking is known in advance")
        raise ValueError(f"top_k.k is {top_k.k} but there are only {m} public groups, every pick is charged and "
                         f"the last one left is forced; {fix}")
    if query.hierarchy:
        if len(query.group_by) < 2:
            raise ValueError(f"hierarchy needs at least two group_by fields (coarsest first), got {query.group_by}")
        if not public:
            raise ValueError("hierarchy releases every level of the public groups: list them under groups.public")
        split = None if isinstance(query.hierarchy, bool) else query.hierarchy.split
        if split is not None and len(split) != len(query.group_by):
            raise ValueError(
                f"hierarchy.split has {len(split)} weights for {len(query.group_by)} levels of group_by "
                f"{query.group_by}; give one weight per level"
            )
        if not query.aggregations.names() & {"count", "sum"}:
            raise ValueError("hierarchy rolls up counts and sums: add count: {} or a sum")
        if query.mechanism == "staircase":
            # A coarse level is calibrated as one parent moved by up to L0 * Linf: sound for Laplace (l1)
            # and Gaussian (l2), but a unit's L0 leaves under L0 different parents move L0 parents, and the
            # staircase's loss per moved group does not shrink with the size of the move.
            raise ValueError("hierarchy releases use mechanism: laplace or gaussian; the staircase's loss does not "
                             "shrink when a unit's events spread over several parents, so it cannot be rolled up")

def _check_local_dp(query: Any, public: bool) -> None:
    local = query.local_dp
    assert local is not None
    fixes = []
    if query.group_by != [local.field]:
        fixes.append(f"group_by: [{local.field}] (the reports' field, and nothing else)")
    if not public:
        fixes.append("groups.public listing the field's domain (every value a producer may report)")
    if query.aggregations.names() != {"count"}:
        fixes.append("aggregations: {count: {}} only (the estimates are debiased counts)")
    if local.mechanism == "oue" and public and len(query.groups.public) > MAX_UNARY_DOMAIN:  # type: ignore[union-attr]
        fixes.append(f"at most {MAX_UNARY_DOMAIN} values in groups.public with mechanism oue (a report holds one "
                     "bit per value)")
    if REPORT_TAG_FIELD in (query.privacy_unit.field, query.timestamp_field, local.field):
        fixes.append(f"no event field named {REPORT_TAG_FIELD!r} (it holds each report's randomizer tag)")
    if (query.bounds.max_groups_per_unit, query.bounds.max_events_per_group) != (1, 1):
        fixes.append("bounds: {max_groups_per_unit: 1, max_events_per_group: 1} (one report per unit per window)")
    if query.mechanism != "laplace" or query.continual is not None or query.hierarchy:
        fixes.append("no mechanism, continual or hierarchy (no central noise is added)")
    problems = ["local_dp needs " + "; ".join(fixes)] if fixes else []
    if query.epsilon != local.epsilon:
        # a window costs a unit its one report, randomized at local_dp.epsilon: the query charges that
        problems.append(f"set the query's epsilon: {local.epsilon!r} to match local_dp.epsilon (what a window "
                        f"costs a unit: its one report), not {query.epsilon!r}; or leave it out, and it is "
                        "local_dp.epsilon")
    if problems:
        raise ValueError("\n".join(problems))
