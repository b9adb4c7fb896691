"""``stream-dp plan FILE``: what each query spends, how noisy it is, and how long units last."""

from __future__ import annotations

import argparse
import json
import math
import sys

from stream_dp.config import ConfigError, format_duration_ms, load_config
from stream_dp.config.aggregation_options import worst_case_release_ms

EXAMPLE_COUNTS = (10, 100, 1_000, 10_000)
CONTINUAL_WINDOWS = (1, 10, 100, 1_000)
"""Windows after which `plan` compares a continual query's running total with naive summation."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan", help="show noise scales, accuracy and budget use of each query",
        description="Per query: noise scales, 95%% CI half-widths at example counts, per-window loss, and how many "
        "windows per horizon a fully active unit can join before it is excluded.",
    )
    parser.add_argument("config", metavar="FILE", help="query configuration YAML")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(handler=run)


def mechanism_label(query) -> str:
    """How a query's releases are made private, as ``plan`` and ``check-config`` headers name it.

    A local-DP query adds no central noise: its ``mechanism`` setting (laplace by default) is unused,
    so it is named by its trust model and the producers' randomizer instead.
    """
    local = getattr(query, "local_dp", None)
    if local is not None:
        return (f"local trust model: {local.mechanism} randomized by each producer, epsilon={local.epsilon:g} per "
                "report, no central noise")
    return f"{query.mechanism} epsilon={query.epsilon:g}" + (f" delta={query.delta:g}" if query.delta else "")


def plan_config(config) -> list[dict]:
    from stream_dp.worker.app import build_plan, check_cost_fits, window_cost

    out = []
    for query in config.queries:
        namespace = config.namespaces[query.privacy_unit.namespace]
        plan = build_plan(query)
        described = plan.describe()
        cost, delta = window_cost(plan, namespace.accounting, query.name)
        check_cost_fits(query.name, query.privacy_unit.namespace, namespace, cost, delta)
        if query.continual is not None:
            horizons = [_period_horizon(budget, cost, delta, query.continual.period_ms, namespace.accounting)
                        for budget in namespace.budgets]
        else:
            horizons = [_window_horizon(budget, cost, delta, query.window.size_ms, namespace.accounting)
                        for budget in namespace.budgets]
        out.append({
            "query": query.name,
            "namespace": query.privacy_unit.namespace,
            "accounting": namespace.accounting,
            "window": format_duration_ms(query.window.size_ms),
            "per_window_loss": plan.loss.to_dict(),
            "per_window_cost": cost,
            "per_window_delta": delta,
            # as records state it (privacy.mechanism, privacy.trust_model)
            "mechanism": query.mechanism if plan.local is None else f"local_{plan.local.mechanism}",
            "trust_model": "central" if plan.local is None else "local",
            "mechanism_label": mechanism_label(query),
            "count_scale": described["count_scale"],
            "sum_scale": described["sum_scale"],
            "selection_threshold": described["selection_threshold"],
            "accuracy": [plan.accuracy_at(n) for n in EXAMPLE_COUNTS],
            "horizons": horizons,
            # Windows are charged at their end: an interval of event time of a horizon's length
            # holds the windows charged in it plus, at its end, at most one straddling window per query.
            # (A continual query's charge covers a whole period: see each horizon's periods_overlapped.)
            "interval_slack_windows": None if query.continual is not None else 1,
            "charged_per": "period" if query.continual is not None else "window",
            "period": None if query.continual is None else format_duration_ms(query.continual.period_ms),
            "continual": None if plan.continual is None else _continual_summary(plan.continual),
            "options": _options(query, plan, described),
        })
    return out


def _affordable(budget, cost: float, delta: float) -> int:
    """How many charges of (cost, delta) one horizon's limits afford."""
    affordable = int(budget.limit // cost)
    if delta > 0 and budget.delta is not None:
        affordable = min(affordable, int(budget.delta // delta))
    return affordable


def _window_horizon(budget, cost: float, delta: float, window_ms: int, accounting: str) -> dict:
    windows_in_horizon = max(1, budget.horizon_ms // window_ms)
    # A unit joins a window only while every limit of the horizon affords it.
    affordable = _affordable(budget, cost, delta)
    joined = min(affordable, windows_in_horizon)
    return {
        "horizon": format_duration_ms(budget.horizon_ms),
        "limit": budget.limit,
        "delta_limit": budget.delta,
        "windows_in_horizon": windows_in_horizon,
        "windows_a_unit_can_join": affordable,
        "fully_active_unit_excluded": affordable < windows_in_horizon,
        # what a unit active in every window spends in one horizon of this query alone
        "fully_active_unit_spends": {accounting: joined * cost, "delta": joined * delta},
    }


def _period_horizon(budget, cost: float, delta: float, period_ms: int, accounting: str) -> dict:
    """One horizon's limit against a continual query's charges.

    The worker charges a unit the period's loss once per period, at the end of the unit's first window
    of the period (``stream_dp.worker.period_charging``); its later windows of the period are free (up
    to ``max_windows_per_unit``). A charge of period ``k`` falls in ``(start_k, end_k]``, so an interval
    of length ``D`` overlaps at most ``ceil(D / P) + 1`` periods and holds at most that many charges (two
    when ``D <= P``: a unit first seen at the end of one period and at the start of the next). A unit
    active in every window is charged at the end of each period's first window, ``P`` apart:
    ``ceil(D / P)`` charges. The store admits a charge while every run of ``buckets + 1`` buckets holds at
    most the limit (``stream_dp.budget``), so exclusion is counted over such a run, ``D = H + H / buckets``;
    what a unit spends is counted over any interval of the horizon, ``D = H``.
    """
    horizon_ms = budget.horizon_ms
    run_ms = horizon_ms + horizon_ms // budget.buckets
    periods_overlapped = -(-horizon_ms // period_ms) + 1
    fully_active_charges = -(-horizon_ms // period_ms)
    checked_any, checked_fully_active = -(-run_ms // period_ms) + 1, -(-run_ms // period_ms)
    affordable = _affordable(budget, cost, delta)
    most = min(affordable, periods_overlapped)
    fully_active = min(affordable, fully_active_charges)
    return {
        "horizon": format_duration_ms(horizon_ms),
        "limit": budget.limit,
        "delta_limit": budget.delta,
        "horizon_shorter_than_period": horizon_ms < period_ms,
        # counted in charges: one per period and unit
        "periods_overlapped": periods_overlapped,
        "windows_in_horizon": fully_active_charges,
        "windows_a_unit_can_join": affordable,
        "charges_affordable": affordable,
        "bucket_run": format_duration_ms(run_ms),
        "charges_in_bucket_run": checked_any,
        "fully_active_unit_excluded": affordable < checked_fully_active,
        "some_unit_excluded": affordable < checked_any,
        "fully_active_unit_spends": {accounting: fully_active * cost, "delta": fully_active * delta},
        "any_unit_spends_at_most": {accounting: most * cost, "delta": most * delta},
    }


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


def _continual_summary(continual) -> dict:
    rows = continual.error_table(CONTINUAL_WINDOWS)
    return {"windows_per_period": continual.windows_per_period, "depth": continual.depth,
            "error_table": rows, "tree_better": tree_crossover(continual)}


def _options(query, plan, described) -> list[str]:
    """One line per query option: its mechanism, what it costs and how accurate it is."""
    lines = []
    if plan.local is not None:
        local = plan.local
        examples = ", ".join(f"{n:,} reports ±{_fmt(1.96 * local.estimate_bounds(n)[1] ** 0.5)}" for n in (100, 10_000, 1_000_000))
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
                f"{_fmt(entry['scale'])} with gamma {entry['gamma']:.3f}; std {_fmt(entry['std'])}, mean |error| "
                f"{_fmt(entry['mean_abs_error'])} vs {_fmt(entry['geometric_std'])} and "
                f"{_fmt(entry['geometric_mean_abs_error'])} with Laplace at the same epsilon "
                f"(std x{ratio:.3f})")
    if plan.hierarchy:
        names = list(query.group_by)
        for level, entry in enumerate(described["levels"]):
            accuracy = plan.levels[level].accuracy_at(0)
            lines.append(
                f"hierarchy level {level} ({', '.join(names[:level + 1])}): epsilon {entry['epsilon']:.4g}, count "
                f"scale {_fmt(entry['count_scale'])} (±{_fmt(accuracy['count_ci95'])} at 95% before consistency); "
                "levels made consistent by weighted least squares (post-processing, no extra cost)")
    if plan.top_k is not None:
        lines.append(f"top_k: k={plan.top_k.k}, permute-and-flip over the released groups, scale "
                     f"{plan.top_k.scale:.4g}, epsilon {plan.top_k.loss.epsilon:.4g} (k x max_events_per_group / scale)")
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
                     f"[{errors}] ranks (events) of the true quantile{why}")
    if plan.vector is not None:
        v = plan.vector
        kind = v.features.kind
        d = v.features.dimensions
        c = float(v.features.clip_norm)
        if kind == "mean_vector":
            how = "Gaussian vector mechanism on each group's sum of (vector, C)"
            # a mean coordinate is C s / w: near 0 its error is the sum's noise over the units
            examples = "a mean coordinate at 95% (near 0): " + ", ".join(
                f"{n:,} units ±{_fmt(1.96 * v.sigma / n)}" for n in (100, 10_000, 1_000_000))
        else:
            how = "Analyze Gauss on each group's augmented second-moment matrix, PSD-projected"
            # covariance entries are matrix entries over n; mean coordinates are entries over C n
            examples = "at 95%, a covariance entry / a mean coordinate: " + ", ".join(
                f"{n:,} units ±{_fmt(1.96 * v.sigma / n)} / ±{_fmt(1.96 * v.sigma / (c * n))}"
                for n in (100, 10_000, 1_000_000))
        lines.append(f"{kind}: {d} fields {list(v.fields)} clipped to l2 norm C={c:g} per unit and group; {how}; "
                     f"l2 sensitivity {_fmt(v.sensitivity)}, noise sd {_fmt(v.sigma)} per coordinate, epsilon "
                     f"{v.loss.epsilon:.4g} at delta {v.loss.delta:.3g} (rho {v.loss.rho:.4g}); {examples}")
    if plan.sample_aggregate is not None:
        sa = plan.sample_aggregate
        head = (f"sample_aggregate: {sa.function} on each of {sa.blocks} blocks of units (keyed hash), outputs "
                f"clipped to [{sa.lo:g}, {sa.hi:g}] (a failed block counts as {sa.fallback:g}), ")
        if sa.median is not None:
            low, high = sa.median_q_interval()
            lines.append(head + f"their median by the exponential mechanism over {sa.median.bins + 1} edges: at 95% "
                         f"its rank among the blocks is within {_fmt(sa.median_rank_error())} of the middle (q in "
                         f"[{low:.3g}, {high:.3g}]); epsilon {sa.loss.epsilon:.4g}")
        else:
            lines.append(head + f"{sa.noise.kind} noise of scale {_fmt(sa.noise.scale)} on their sum; the released "
                         f"mean over blocks is within ±{_fmt(sa.noise.ci_half_width(0.05) / sa.blocks)} of the "
                         f"blocks' mean at 95%; epsilon {sa.loss.epsilon:.4g}")
        options = query.aggregations.sample_aggregate
        public = query.public_group_keys()
        worst = (f"{worst_case_release_ms(options, len(public)) / 1000:g} s per window ({len(public)} groups)"
                 if public is not None else f"{worst_case_release_ms(options, 1) / 1000:g} s per released group")
        lines.append(f"sample_aggregate release time: at worst (every block running out its "
                     f"{options.timeout_ms / 1000:g} s timeout) {worst}; typically 1-3 ms per block")
    if plan.continual is not None:
        lines.extend(_continual_lines(plan))
    return lines


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
                parts.append(f"{what} std {_fmt(entry['tree_std'])} (95% ±{_fmt(entry['tree_ci95'])}) with the "
                             f"tree vs {_fmt(entry['naive_std'])} summing")
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


def _fmt(value) -> str:
    return "-" if value is None else f"{value:,.3g}"


def _horizon_line(p: dict, h: dict) -> str:
    accounting = p["accounting"]
    limits = f"{h['limit']:g}" + (f" (delta {h['delta_limit']:g})" if h["delta_limit"] is not None else "")
    if p["charged_per"] == "window":
        joinable = h["windows_a_unit_can_join"]
        note = "excluded before the horizon ends" if h["fully_active_unit_excluded"] else "never excluded"
        spends = h["fully_active_unit_spends"]
        windows = h["windows_in_horizon"]
        join = (f"a unit can join {joinable} of {windows} windows" if joinable < windows
                else f"a unit can join all {windows} windows, and the limit would afford {joinable}")
        return (f"{limits} per {h['horizon']}: {join} "
                f"(a unit active in every window is {note}; it spends {spends[accounting]:.6g} "
                f"{accounting}, delta {spends['delta']:.3g} per {h['horizon']})")
    charge = f"{p['per_window_cost']:.6g} {accounting}" + (f" and delta {p['per_window_delta']:.3g}"
                                                          if p["per_window_delta"] else "")
    horizon, period = h["horizon"], p["period"]
    shorter = f", shorter than the {period} period" if h["horizon_shorter_than_period"] else ""
    overlapped = h["periods_overlapped"]
    full = h["windows_in_horizon"]
    checked = (f"the limit affords {h['charges_affordable']} charges, checked over bucket runs of up to "
               f"{h['bucket_run']} holding at most {h['charges_in_bucket_run']}")
    if not h["some_unit_excluded"]:
        note = "this query alone never excludes a unit"
    elif not h["fully_active_unit_excluded"]:
        note = ("a unit active in every window is never excluded by this query alone; one charged for more "
                "periods within a run is left out of a period's windows until its charge fits")
    else:
        note = "even a unit active in every window is left out of some periods' windows until its charge fits"
    most = h["any_unit_spends_at_most"]
    return (f"{limits} per {horizon}{shorter}: a unit is charged {charge} once per {period} period, at the end of "
            f"its first window of the period; any {horizon} overlaps at most {overlapped} periods, so holds at "
            f"most {overlapped} charges ({full} for a unit active in every window, charged {period} apart), at "
            f"most {most[accounting]:.6g} {accounting}, delta {most['delta']:.3g} of this query; {checked}: {note}")


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
        plans = plan_config(config)
    except (ConfigError, ValueError) as exc:
        print(exc, file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(plans, indent=2, default=str))
        return 0
    for p in plans:
        loss = p["per_window_loss"]
        how = p["mechanism_label"] if p["trust_model"] == "local" else p["mechanism"]
        print(f"query {p['query']} ({p['window']} windows, {how}, namespace {p['namespace']})")
        charged = f"{p['per_window_cost']:.6g} {p['accounting']}"
        if p["per_window_delta"]:
            charged += f" and delta {p['per_window_delta']:.3g}"
        per = "period" if p["charged_per"] == "period" else "window"
        print(f"  per {per} and unit: " + ", ".join(f"{k}={_fmt(v)}" for k, v in loss.items() if v is not None)
              + f"; charged {charged}")
        if p["trust_model"] == "local":
            print("  noise scale: none added by the worker (each report was randomized by its producer)")
        else:
            print(f"  noise scale: count {_fmt(p['count_scale'])}, sum {_fmt(p['sum_scale'])}"
                  + (f"; selection threshold {_fmt(p['selection_threshold'])} units" if p["selection_threshold"] else ""))
        print(f"  {'true count':>10} {'count ±95%':>11} {'sum ±95%':>10} {'mean ±95%':>10}")
        for a in p["accuracy"]:
            print(f"  {int(a['count']):>10,} {_fmt(a.get('count_ci95')):>11} {_fmt(a.get('sum_ci95')):>10} {_fmt(a.get('mean_ci95')):>10}")
        for h in p["horizons"]:
            print("  " + _horizon_line(p, h))
        for line in p["options"]:
            print("  " + line)
        if p["charged_per"] == "period":
            print("  a period's charge covers all of the unit's windows of the period: the events of an interval of "
                  "event time of one horizon lie in at most the periods it overlaps (counted above), whose charges "
                  "may fall outside it")
        else:
            print(f"  windows are charged at their end: an interval of event time of one horizon may also overlap "
                  f"{p['interval_slack_windows']} window of this query straddling its end, beyond the limit")
    return 0
