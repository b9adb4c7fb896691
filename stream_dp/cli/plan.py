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
    from stream_dp.worker.app import build_plan, window_cost

    out = []
    for query in config.queries:
        namespace = config.namespaces[query.privacy_unit.namespace]
        plan = build_plan(query)
        described = plan.describe()
        cost = window_cost(plan, namespace.accounting, query.name)
        horizons = []
        for budget in namespace.budgets:
            windows_in_horizon = budget.horizon_ms // query.window.size_ms
            affordable = int(budget.limit // cost) if cost > 0 else None
            horizons.append({
                "horizon": format_duration_ms(budget.horizon_ms),
                "limit": budget.limit,
                "windows_in_horizon": windows_in_horizon,
                "windows_a_unit_can_join": affordable,
                "fully_active_unit_excluded": affordable is not None and affordable < windows_in_horizon,
            })
        out.append({
            "query": query.name,
            "namespace": query.privacy_unit.namespace,
            "accounting": namespace.accounting,
            "window": format_duration_ms(query.window.size_ms),
            "per_window_loss": plan.loss.to_dict(),
            "per_window_cost": cost,
            "mechanism": query.mechanism,
            "count_scale": described["count_scale"],
            "sum_scale": described["sum_scale"],
            "selection_threshold": described["selection_threshold"],
            "accuracy": [plan.accuracy_at(n) for n in EXAMPLE_COUNTS],
            "horizons": horizons,
        })
    return out


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
        print("  per window and unit: " + ", ".join(f"{k}={_fmt(v)}" for k, v in loss.items() if v is not None)
              + f"; charged {p['per_window_cost']:.6g} {p['accounting']}")
        print(f"  noise scale: count {_fmt(p['count_scale'])}, sum {_fmt(p['sum_scale'])}"
              + (f"; selection threshold {_fmt(p['selection_threshold'])} units" if p["selection_threshold"] else ""))
        print(f"  {'true count':>10} {'count ±95%':>11} {'sum ±95%':>10} {'mean ±95%':>10}")
        for a in p["accuracy"]:
            print(f"  {int(a['count']):>10,} {_fmt(a.get('count_ci95')):>11} {_fmt(a.get('sum_ci95')):>10} {_fmt(a.get('mean_ci95')):>10}")
        for h in p["horizons"]:
            joinable = h["windows_a_unit_can_join"]
            note = "excluded before the horizon ends" if h["fully_active_unit_excluded"] else "never runs out"
            print(f"  {h['limit']:g} per {h['horizon']}: a unit can join {joinable} of {h['windows_in_horizon']} windows "
                  f"(a unit active in every window is {note})")
    return 0
