"""``stream-dp plan FILE``: what each query spends, how noisy it is, and how long units last."""

from __future__ import annotations

import argparse
import json
import sys

from stream_dp.config import ConfigError, format_duration_ms, load_config

EXAMPLE_COUNTS = (10, 100, 1_000, 10_000)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan", help="show noise scales, accuracy and budget use of each query",
        description="Per query: noise scales, 95%% CI half-widths at example counts, per-window loss, and how many "
        "windows per horizon a fully active unit can join before it is excluded.",
    )
    parser.add_argument("config", metavar="FILE", help="query configuration YAML")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(handler=run)


def plan_config(config) -> list[dict]:
    from stream_dp.worker.app import build_plan, check_cost_fits, window_cost

    out = []
    for query in config.queries:
        namespace = config.namespaces[query.privacy_unit.namespace]
        plan = build_plan(query)
        described = plan.describe()
        cost, delta = window_cost(plan, namespace.accounting, query.name)
        check_cost_fits(query.name, query.privacy_unit.namespace, namespace, cost, delta)
        horizons = []
        # A continual query charges once per period: count periods, not windows.
        charge_every_ms = query.continual.period_ms if query.continual is not None else query.window.size_ms
        for budget in namespace.budgets:
            windows_in_horizon = max(1, budget.horizon_ms // charge_every_ms)
            # A unit joins a window only while every limit of the horizon affords it.
            affordable = int(budget.limit // cost)
            if delta > 0 and budget.delta is not None:
                affordable = min(affordable, int(budget.delta // delta))
            joined = min(affordable, windows_in_horizon)
            horizons.append({
                "horizon": format_duration_ms(budget.horizon_ms),
                "limit": budget.limit,
                "delta_limit": budget.delta,
                "windows_in_horizon": windows_in_horizon,
                "windows_a_unit_can_join": affordable,
                "fully_active_unit_excluded": affordable < windows_in_horizon,
                # what a unit active in every window spends in one horizon of this query alone
                "fully_active_unit_spends": {namespace.accounting: joined * cost, "delta": joined * delta},
            })
        out.append({
            "query": query.name,
            "namespace": query.privacy_unit.namespace,
            "accounting": namespace.accounting,
            "window": format_duration_ms(query.window.size_ms),
            "per_window_loss": plan.loss.to_dict(),
            "per_window_cost": cost,
            "per_window_delta": delta,
            "mechanism": query.mechanism,
            "count_scale": described["count_scale"],
            "sum_scale": described["sum_scale"],
            "selection_threshold": described["selection_threshold"],
            "accuracy": [plan.accuracy_at(n) for n in EXAMPLE_COUNTS],
            "horizons": horizons,
            # Windows are charged at their end: an interval of event time of a horizon's length
            # holds the windows charged in it plus, at its end, at most one straddling window per query.
            "interval_slack_windows": 1,
            "charged_per": "period" if query.continual is not None else "window",
            "options": _options(query, plan, described),
        })
    return out


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
        q = described["quantiles"]
        candidates = q["candidates"]
        errors = ", ".join(f"{e:.4g}" for e in q["rank_error"])
        lines.append(f"quantiles: {q['q']}, exponential mechanism over {candidates['count']} bin edges in "
                     f"[{candidates['lo']:g}, {candidates['hi']:g}], epsilon {plan.quantiles.loss.epsilon:.4g} "
                     f"({q['epsilon_per_quantile']:.4g} per q); with 95% probability each is within "
                     f"[{errors}] ranks (events) of the true quantile")
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
        lines.append(f"sample_aggregate: {sa.function} on each of {sa.blocks} blocks of units (keyed hash), outputs "
                     f"clipped to [{sa.lo:g}, {sa.hi:g}] (a failed block counts as {sa.fallback:g}), {sa.noise.kind} "
                     f"noise of scale {_fmt(sa.noise.scale)} on their sum; the released mean over blocks is within "
                     f"±{_fmt(sa.noise.ci_half_width(0.05) / sa.blocks)} of the blocks' mean at 95%; epsilon "
                     f"{sa.loss.epsilon:.4g}")
    if plan.continual is not None:
        c = plan.continual
        described_c = c.describe()
        lines.append(f"continual: binary tree over {described_c.get('windows_per_period')} windows per period "
                     f"(depth {described_c.get('depth')}), a unit counts in at most "
                     f"{described_c.get('max_windows_per_unit')} windows and is charged epsilon "
                     f"{plan.loss.epsilon:.4g} once per period")
        for row in c.error_table():
            if not row.get("applicable", True):
                lines.append(f"  running count after {row['t']:>5} windows: beyond the period")
                continue
            count = row["count"] or row["sum"]
            what = "count" if row["count"] else "sum"
            lines.append(f"  running {what} after {row['t']:>5} windows: std {_fmt(count['tree_std'])} "
                         f"(95% ±{_fmt(count['tree_ci95'])}) with the tree vs std {_fmt(count['naive_std'])} "
                         "summing per-window releases of the same period budget")
    return lines


def _fmt(value) -> str:
    return "-" if value is None else f"{value:,.3g}"


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
        print(f"query {p['query']} ({p['window']} windows, {p['mechanism']}, namespace {p['namespace']})")
        charged = f"{p['per_window_cost']:.6g} {p['accounting']}"
        if p["per_window_delta"]:
            charged += f" and delta {p['per_window_delta']:.3g}"
        per = "period" if p["charged_per"] == "period" else "window"
        print(f"  per {per} and unit: " + ", ".join(f"{k}={_fmt(v)}" for k, v in loss.items() if v is not None)
              + f"; charged {charged}")
        print(f"  noise scale: count {_fmt(p['count_scale'])}, sum {_fmt(p['sum_scale'])}"
              + (f"; selection threshold {_fmt(p['selection_threshold'])} units" if p["selection_threshold"] else ""))
        print(f"  {'true count':>10} {'count ±95%':>11} {'sum ±95%':>10} {'mean ±95%':>10}")
        for a in p["accuracy"]:
            print(f"  {int(a['count']):>10,} {_fmt(a.get('count_ci95')):>11} {_fmt(a.get('sum_ci95')):>10} {_fmt(a.get('mean_ci95')):>10}")
        for h in p["horizons"]:
            joinable = h["windows_a_unit_can_join"]
            note = "excluded before the horizon ends" if h["fully_active_unit_excluded"] else "never excluded"
            limits = f"{h['limit']:g}" + (f" (delta {h['delta_limit']:g})" if h["delta_limit"] is not None else "")
            spends = h["fully_active_unit_spends"]
            print(f"  {limits} per {h['horizon']}: a unit can join {joinable} of {h['windows_in_horizon']} {per}s "
                  f"(a unit active in every {per} is {note}; it spends {spends[p['accounting']]:.6g} "
                  f"{p['accounting']}, delta {spends['delta']:.3g} per {h['horizon']})")
        for line in p["options"]:
            print("  " + line)
        print(f"  windows are charged at their end: an interval of event time of one horizon may also overlap "
              f"{p['interval_slack_windows']} window of this query straddling its end, beyond the limit")
    return 0
