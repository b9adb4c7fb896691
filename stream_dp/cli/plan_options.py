"""The lines ``stream-dp plan`` prints for a query's options (top_k, quantiles, hierarchy, continual, vectors,
sample-and-aggregate, local DP, staircase): each one's mechanism, cost and accuracy, from the query's plan."""

from __future__ import annotations

import math

from stream_dp.config.release_time import (
    capped_option,
    cost_basis,
    group_release_ms,
    window_release_ms,
    worst_case_release_ms,
)

CONTINUAL_WINDOWS = (1, 10, 100, 1_000)
"""Windows after which `plan` compares a continual query's running total with naive summation."""
TOP_K_BETA = 0.05
"""`plan` states the lead at which top_k ranks the top group first with probability 1 - TOP_K_BETA."""
TOP_K_EXAMPLE_CANDIDATES = (10, 1_000, 100_000)
"""Released groups per window at which `plan` states that lead for a query with partition selection."""
VECTOR_UNITS = (100, 10_000, 1_000_000)
"""Units per group at which `plan` states a vector aggregation's 95% errors."""
_VECTOR_ERRORS = {"mean": "mean_coordinate", "covariance": "covariance_entry"}  # ``VectorPlan.errors_at``'s names


def _largest_with_bits(limit: int, bits: int) -> int | None:
    """The largest ``t`` in ``1..limit`` with exactly ``bits`` set bits, or None."""
    if limit < 1 or bits < 1:
        return None
    if limit.bit_count() >= bits:
        while limit.bit_count() > bits:
            limit &= limit - 1  # drop the lowest set bit: the top `bits` set bits remain
        return limit
    for i in range(limit.bit_length()):  # clear a set bit i, as low as possible, and fill below it from the top
        if limit >> i & 1:
            prefix = limit >> (i + 1) << (i + 1)
            missing = bits - prefix.bit_count()
            if missing <= i:
                return prefix | ((1 << missing) - 1) << (i - missing)
    return None


def _smallest_with_bits_above(x: int, bits: int) -> int:
    """The smallest ``t > x`` with exactly ``bits`` set bits."""
    y = x + 1
    while y.bit_count() > bits:
        y += y & -y  # every number below y + lowbit(y) keeps y's bits: too many
    position = 0
    while y.bit_count() < bits:
        y |= 1 << position  # the lowest free bits
        position += 1
    return y


def tree_crossover(continual) -> dict:
    """Where the binary tree's running total beats naive per-window summation, by the plan's own formulas.

    At window ``t`` the tree's std depends on ``popcount(t)`` only (``ContinualPlan.accuracy``),
    summation's is ``sqrt(t)`` times one window's (``ContinualPlan.error_table``): for each popcount
    ``p`` the tree loses exactly at the windows ``t <= (std_p / std_1)^2`` with ``p`` set bits.
    ``better_from``: the tree's std is below summation's at every window from it to the end of the
    period (None: not within the period); ``first_better``: the first window where it is.
    """
    from stream_dp.dp.tree_state import max_popcount

    periods = continual.windows_per_period
    (first_row,) = continual.error_table([1])
    last_worse = 0
    first_better = None
    for name in ("count", "sum"):
        if first_row[name] is None:
            continue
        one = first_row[name]["naive_std"]  # summation's std after one window
        for p in range(1, max_popcount(periods) + 1):
            tree = continual.accuracy(p)[f"{name}_std"]
            worse_up_to = min(periods, math.floor((tree / one) ** 2))
            # settle float rounding at the boundary on the comparison itself
            while worse_up_to < periods and tree >= math.sqrt(worse_up_to + 1) * one:
                worse_up_to += 1
            while worse_up_to > 0 and tree < math.sqrt(worse_up_to) * one:
                worse_up_to -= 1
            worst = _largest_with_bits(worse_up_to, p)
            if worst is not None:
                last_worse = max(last_worse, worst)
            better = _smallest_with_bits_above(worse_up_to, p)
            if better <= periods and (first_better is None or better < first_better):
                first_better = better
    return {"better_from": last_worse + 1 if last_worse < periods else None, "first_better": first_better}


def continual_summary(continual) -> dict:
    rows = continual.error_table(CONTINUAL_WINDOWS)
    return {"windows_per_period": continual.windows_per_period, "depth": continual.depth,
            "error_table": rows, "tree_better": tree_crossover(continual)}


def vector_summary(vector) -> dict:
    """A vector aggregation's statement (``VectorPlan.describe``) and, per example count of units, the
    first-order 95% half-widths of a mean coordinate and (covariance) a covariance entry: ``near_0`` for
    vectors near 0, ``worst`` for any data within norm C (a mean at norm C along a field), as ``plan --json``
    gives them and its text line prints them."""
    errors = [{"units": n, **{_VECTOR_ERRORS[name]: {"near_0": near_0, "worst": worst}
                              for name, (near_0, worst) in vector.errors_at(n).items()}}
              for n in VECTOR_UNITS]
    return {**vector.describe(), "ci95": errors}


def option_lines(query, plan, described) -> list[str]:
    """One line per query option: its mechanism, what it costs and how accurate it is."""
    lines = []
    if plan.local is not None:
        local = plan.local
        examples = ", ".join(f"{n:,} reports ±{fmt(1.96 * local.estimate_bounds(n)[1] ** 0.5)}" for n in (100, 10_000, 1_000_000))
        how = "k-ary randomized response" if local.mechanism == "krr" else "optimized unary encoding"
        lines.append(f"local_dp: {how} ({local.mechanism}) over {local.domain_size} values at epsilon "
                     f"{local.epsilon:.4g} per report, applied by the producer (`stream-dp produce --local-dp "
                     f"{query.local_dp.field}`); p={local.p:.3g}, q={local.q:.3g}; no central noise; a value's "
                     f"frequency estimate at 95%: {examples}")
    if query.mechanism == "staircase":
        for name in ("count", "sum"):
            entry = described.get(name)
            if entry is None:
                continue
            ratio = entry["std"] / entry["geometric_std"]
            lines.append(
                f"staircase {name}: epsilon {entry['epsilon_per_group']:.4g} per group, stairs of "
                f"{fmt(entry['scale'])} with gamma {entry['gamma']:.3f}; std {fmt(entry['std'])}, mean |error| "
                f"{fmt(entry['mean_abs_error'])} vs {fmt(entry['geometric_std'])} and "
                f"{fmt(entry['geometric_mean_abs_error'])} with Laplace at the same epsilon "
                f"(std x{ratio:.3f})")
    if plan.hierarchy:
        names = list(query.group_by)
        for level, entry in enumerate(described["levels"]):
            accuracy = plan.levels[level].accuracy_at(0)
            sums = ("" if entry.get("sum_scale") is None else
                    f", sum scale {fmt(entry['sum_scale'])} (±{fmt(accuracy['sum_ci95'])})")
            lines.append(
                f"hierarchy level {level} ({', '.join(names[:level + 1])}): epsilon {entry['epsilon']:.4g}, count "
                f"scale {fmt(entry['count_scale'])} (±{fmt(accuracy['count_ci95'])}){sums} at 95% before "
                "consistency; levels made consistent by weighted least squares (post-processing, no extra cost)")
    if plan.top_k is not None:
        lines.append(_top_k_line(query, plan))
    if plan.quantiles is not None:
        from stream_dp.dp.quantiles import statement_beta

        q = described["quantiles"]
        candidates = q["candidates"]
        # as the worker states it: with a count, part of the 5% sizes the group for q_interval
        sized = plan.base is not None and plan.base.count_noise is not None
        errors = ", ".join(f"{e:.4g}" for e in plan.quantiles.stated_rank_error(sized))
        level = 1.0 - statement_beta(sized)
        why = (f" (the records' rank_error; the other {q['count_beta']:.1%} bounds the group's size from its noisy "
               "count, for q_interval at 95%)") if sized else " (the records' rank_error)"
        lines.append(f"quantiles: {q['q']}, exponential mechanism over {candidates['count']} bin edges in "
                     f"[{candidates['lo']:g}, {candidates['hi']:g}], epsilon {plan.quantiles.loss.epsilon:.4g} "
                     f"({q['epsilon_per_quantile']:.4g} per q); with {level:.1%} probability each is within "
                     f"[{errors}] ranks (events) of the true quantile{why}, beyond the grid's resolution "
                     f"of {(candidates['hi'] - candidates['lo']) / (candidates['count'] - 1):g}: values sharing the "
                     "quantile's bin count as one point")
        if plan.quantiles.interval is not None:
            interval = plan.quantiles.interval
            reach = ", ".join(f"{w:.4g}" for w in interval.rank_reach())
            lines.append(f"quantiles value_interval: a noisy histogram of each group (discrete Laplace of scale "
                         f"{interval.scale:.4g} on each of its {interval.bins} bins, epsilon "
                         f"{interval.loss.epsilon:.4g}, half the quantiles' share) gives each q a value_ci95 "
                         "[lower, upper] in the field's units that holds the true quantile with 95% probability "
                         f"whatever the values; each end lies about w to 2w ranks from it, w = [{reach}], plus a bin")
    if plan.vector is not None:
        v = plan.vector
        kind = v.features.kind
        d = v.features.dimensions
        c = float(v.features.clip_norm)
        # first-order errors: data near 0 and the worst inside the clip ball (a mean at norm C along a
        # field's axis), which is up to sqrt(6) times larger for a covariance entry (vectors.py docstring)
        errors = vector_summary(v)["ci95"]

        def at(name: str) -> str:
            return ", ".join(f"{e['units']:,} units ±{fmt(e[name]['near_0'])} up to ±{fmt(e[name]['worst'])}"
                             for e in errors)

        where = "95% errors (delta method) for vectors near 0, up to those of any data within norm C (a mean at norm C)"
        if kind == "mean_vector":
            how = "Gaussian vector mechanism on each group's sum of (vector, C)"
            examples = f"{where}: a mean coordinate {at('mean_coordinate')}"
        else:
            how = "Analyze Gauss on each group's augmented second-moment matrix, PSD-projected"
            examples = (f"{where}: a covariance entry {at('covariance_entry')}; a mean coordinate "
                        f"{at('mean_coordinate')}")
        lines.append(f"{kind}: {d} fields {list(v.fields)} clipped to l2 norm C={c:g} per unit and group; {how}; "
                     f"l2 sensitivity {fmt(v.sensitivity)}, noise sd {fmt(v.sigma)} per coordinate, epsilon "
                     f"{v.loss.epsilon:.4g} at delta {v.loss.delta:.3g} (rho {v.loss.rho:.4g}); {examples}")
    if plan.quantiles is not None or plan.vector is not None:
        lines.append(_release_time_line(query))
    if plan.sample_aggregate is not None:
        sa = plan.sample_aggregate
        field = query.aggregations.sample_aggregate.field
        head = (f"sample_aggregate: {sa.function} of field {field!r} on each of {sa.blocks} blocks of units "
                f"(keyed hash), outputs "
                f"clipped to [{sa.lo:g}, {sa.hi:g}] (a failed block counts as {sa.fallback:g}), ")
        if sa.median is not None:
            low, high = sa.median_q_interval()
            lines.append(head + f"their median by the exponential mechanism over {sa.median.bins + 1} edges: at 95% "
                         f"its rank among the blocks is within {fmt(sa.median_rank_error())} of the middle (q in "
                         f"[{low:.3g}, {high:.3g}]); epsilon {sa.loss.epsilon:.4g}")
        else:
            lines.append(head + f"{sa.noise.kind} noise of scale {fmt(sa.noise.scale)} on their sum; the released "
                         f"mean over blocks is within ±{fmt(sa.noise.ci_half_width(0.05) / sa.blocks)} of the "
                         f"blocks' mean at 95%; epsilon {sa.loss.epsilon:.4g}")
        options = query.aggregations.sample_aggregate
        public = query.public_group_keys()
        cap = options.max_released_groups
        if public is not None:
            worst = f"{worst_case_release_ms(options, len(public)) / 1000:g} s per window ({len(public)} groups)"
        elif cap is not None:
            worst = (f"{worst_case_release_ms(options, cap) / 1000:g} s per window (at most {cap:,} released "
                     "groups, max_released_groups: those with the largest noisy counts)")
        else:  # check-config refuses selected groups without a cap
            worst = f"{worst_case_release_ms(options, 1) / 1000:g} s per released group"
        lines.append(f"sample_aggregate release time: at worst (every block running out its "
                     f"{options.timeout_ms / 1000:g} s timeout) {worst}; typically 1-3 ms per block")
    if plan.continual is not None:
        lines.extend(_continual_lines(plan))
    return lines


def _release_time_line(query) -> str:
    """A quantiles or vector query's estimated release time per window, over its most released groups."""
    kind, options = capped_option(query)
    public = query.public_group_keys()
    basis = f"{cost_basis(kind, options)} per group"
    if public is not None:
        worst = f"about {window_release_ms(query) / 1000:.4g} s per window ({len(public)} groups x {basis})"
    elif options.max_released_groups is not None:
        worst = (f"about {window_release_ms(query) / 1000:.4g} s per window at most ({options.max_released_groups} "
                 f"released groups, max_released_groups: those with the largest noisy counts, x {basis})")
    else:  # check-config refuses selected groups without a cap
        worst = f"about {group_release_ms(kind, options) * 1000:.4g} us per released group ({basis})"
    return f"{kind} release time: {worst}; measured on a 2-core machine, a slower or busier CPU takes longer"


def top_k_lead(scale: float, candidates: int, beta: float = TOP_K_BETA) -> float:
    """Events by which a group must lead every other of ``candidates`` for top_k to rank it first with
    probability at least ``1 - beta`` (0 for a single candidate: it is always picked).

    Why this lead suffices: permute-and-flip stops at a candidate ``c`` only when ``c``'s own coin, of
    probability ``exp(-(best - count_c) / scale)``, comes up as it is visited, whatever the order; a group
    trailing the leader by ``lead`` or more is therefore picked first with probability at most
    ``exp(-lead / scale)``, and the ``candidates - 1`` of them together at most ``(candidates - 1)
    exp(-lead / scale)``, which is ``beta`` at the lead returned. (Report-noisy-max with exponential noise,
    the same law, gives the same bound: ``c`` must draw ``lead`` more noise than the leader.) The union
    bound is not tight: with every other candidate trailing by exactly ``lead`` (the worst case), the
    leader is ranked first with probability about ``1 - beta / 2``, and a lead one ``scale`` shorter
    already falls below ``1 - beta`` (tests/cli/test_commands.py computes both).
    """
    if candidates < 2:
        return 0.0
    return scale * math.log((candidates - 1) / beta)


def _top_k_line(query, plan) -> str:
    """top_k's cost, its candidates (and the selection's delta they need) and the lead it resolves at 95%."""
    top_k = plan.top_k
    public = query.public_group_keys()
    head = f"top_k: k={top_k.k}, permute-and-flip over "
    if public is not None:
        head += f"the {len(public):,} public groups"
        leads = f"{math.ceil(top_k_lead(top_k.scale, len(public))):,} events"
    else:
        # Ranking only what the selection released is what makes the list free of unreleased keys; the
        # selection is paid for by the window whether or not count's rows are read.
        selection = plan.base.selection
        head += (f"the groups partition selection releases each window (the window also spends the selection's "
                 f"delta {selection.loss.delta:.3g})")
        leads = (" / ".join(f"{math.ceil(top_k_lead(top_k.scale, m)):,}" for m in TOP_K_EXAMPLE_CANDIDATES)
                 + " events among " + " / ".join(f"{m:,}" for m in TOP_K_EXAMPLE_CANDIDATES) + " released groups")
    return (f"{head}, scale {top_k.scale:.4g}, epsilon {top_k.loss.epsilon:.4g} (k x max_events_per_group / scale); "
            f"the top group is ranked first with {1 - TOP_K_BETA:.0%} probability when it leads every other by "
            f"{leads} (scale x ln((candidates - 1) / {TOP_K_BETA:g}))")


def _continual_lines(plan) -> list[str]:
    c = plan.continual
    described = c.describe()
    lines = [(f"continual: binary tree over {described['windows_per_period']} windows per period "
              f"(depth {described['depth']}), a unit counts in at most {described['max_windows_per_unit']} windows "
              f"and is charged epsilon {plan.loss.epsilon:.4g} once per period")]
    for row in c.error_table(CONTINUAL_WINDOWS):
        if not row.get("applicable", True):
            lines.append(f"  running total after {row['t']:>5,} windows: beyond the period of "
                         f"{c.windows_per_period:,} windows")
            continue
        parts = []
        for what in ("count", "sum"):
            entry = row[what]
            if entry is not None:
                parts.append(f"{what} std {fmt(entry['tree_std'])} (95% ±{fmt(entry['tree_ci95'])}) with the "
                             f"tree vs {fmt(entry['naive_std'])} summing")
        lines.append(f"  running total after {row['t']:>5,} windows: " + "; ".join(parts))
    crossover = tree_crossover(c)
    growth = (f"  the tree's std grows polylogarithmically (depth {c.depth} x sqrt(set bits of t)), summation's "
              "(per-window releases of the same period budget) as sqrt(t): ")
    if crossover["better_from"] is None:
        growth += f"within this period of {c.windows_per_period:,} windows the tree is not always more accurate"
        if crossover["first_better"] is not None:
            growth += f" (it is at some windows, first at {crossover['first_better']:,})"
        else:
            growth += " (at no window)"
    elif crossover["better_from"] == 1:
        growth += "the tree is more accurate at every window"
    else:
        growth += (f"the tree is more accurate at every window from {crossover['better_from']:,} on; before that "
                   f"only at windows with few set bits, never before window {crossover['first_better']:,}")
    lines.append(growth)
    return lines


def fmt(value) -> str:
    return "-" if value is None else f"{value:,.3g}"
