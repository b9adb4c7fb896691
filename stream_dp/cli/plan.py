"""``stream-dp plan FILE``: what each query spends, how noisy it is, and how long units last."""

from __future__ import annotations

import argparse
import json
import sys

from stream_dp.cli.plan_expected import accuracy_line, expected_errors, expected_summary
from stream_dp.cli.plan_namespaces import charges_in, namespace_lines, namespace_summaries
from stream_dp.cli.plan_options import continual_summary, fmt, option_lines, vector_summary
from stream_dp.config import ConfigError, format_duration_ms, load_config

EXAMPLE_COUNTS = (10, 100, 1_000, 10_000)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan", help="show noise scales, accuracy and budget use of each query",
        description="Per query: noise scales, 95% CI half-widths at example counts, per-window loss, and how many "
        "windows per horizon a fully active unit can join before this query alone excludes it; per namespace: "
        "what a unit active in every window of all its queries spends per horizon, and when that exhausts a limit.",
    )
    parser.add_argument("config", metavar="FILE", help="query configuration YAML")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(handler=run)


def mechanism_word(mechanism: str, written: str) -> str:
    """A central query's mechanism in the file's word: ``geometric`` is read as laplace, which its records
    state, and is named as written so that a user finds their word."""
    return f"{written} (the discrete Laplace, released as {mechanism})" if written != mechanism else mechanism


def mechanism_label(query) -> str:
    """How a query's releases are made private, as ``plan`` and ``check-config`` headers name it.

    A local-DP query adds no central noise: its ``mechanism`` setting (laplace by default) is unused,
    so it is named by its trust model and the producers' randomizer instead.
    """
    local = getattr(query, "local_dp", None)
    if local is not None:
        return (f"local trust model: {local.mechanism} randomized by each producer, epsilon={local.epsilon:g} per "
                "report, no central noise")
    word = mechanism_word(query.mechanism, getattr(query, "mechanism_written", query.mechanism))
    return f"{word} epsilon={query.epsilon:g}" + (f" delta={query.delta:g}" if query.delta else "")


def plan_config(config) -> list[dict]:
    """Each query's plan; a query that cannot be planned raises ``ValueError`` naming it (as ``check-config``
    does), whatever its builders raised."""
    from stream_dp.worker.kafka.input_clock import clock_summary
    from stream_dp.worker.query.costs import build_plan, check_cost_fits, explain_build_error, window_cost

    out = []
    for index, query in enumerate(config.queries):
        namespace = config.namespaces[query.privacy_unit.namespace]
        try:
            plan = build_plan(query)
            described = plan.describe()
            cost, delta = window_cost(plan, namespace.accounting, query.name)
            check_cost_fits(query.name, query.privacy_unit.namespace, namespace, cost, delta)
        except Exception as error:  # the builders only compute: whatever they raise, the query cannot run
            raise ValueError(f"queries[{index}] ({query.name}): {explain_build_error(error)}") from error
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
            "mechanism_written": query.mechanism_written,
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
            "continual": None if plan.continual is None else continual_summary(plan.continual),
            # mean_vector / covariance: sensitivity, noise sd and the 95% errors the text line prints
            "vector": None if plan.vector is None else vector_summary(plan.vector),
            "options": option_lines(query, plan, described),
            "window_clock": clock_summary(query),
            # each 95% error beside the value it qualifies at the query's expected counts, and the warnings
            "expected": expected_summary(query, plan, build_plan),
            "accuracy_line": accuracy_line(query, *expected_errors(query, plan)),
        })
    return out


def _affordable(budget, cost: float, delta: float) -> int:
    """How many charges of (cost, delta) one horizon's limits afford."""
    affordable = int(budget.limit // cost)
    if delta > 0 and budget.delta is not None:
        affordable = min(affordable, int(budget.delta // delta))
    return affordable


def _window_horizon(budget, cost: float, delta: float, window_ms: int, accounting: str) -> dict:
    # charged at each window's end: 7-minute windows put 9 ends in some hour, as the namespace lines count them
    windows_in_horizon = charges_in(budget.horizon_ms, window_ms)
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
    of the period (``stream_dp.worker.ingest.period_charge``); its later windows of the period are free (up
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


def _horizon_line(p: dict, h: dict, others: int) -> str:
    """One horizon of one query; ``others``: how many other queries draw on the same namespace's budget."""
    accounting = p["accounting"]
    shared = ("" if not others else f"; {others} other quer{'y' if others == 1 else 'ies'} of namespace "
              f"{p['namespace']} draw on the same limit: see the namespace's lines")
    limits = f"{h['limit']:g}" + (f" (delta {h['delta_limit']:g})" if h["delta_limit"] is not None else "")
    if p["charged_per"] == "window":
        joinable = h["windows_a_unit_can_join"]
        note = "excluded before the horizon ends" if h["fully_active_unit_excluded"] else "never excluded"
        spends = h["fully_active_unit_spends"]
        windows = h["windows_in_horizon"]
        join = (f"a unit can join {joinable} of {windows} windows" if joinable < windows
                else f"a unit can join all {windows} windows, and the limit would afford {joinable}")
        return (f"{limits} per {h['horizon']}, counting this query alone: {join} "
                f"(a unit active in every window is {note} by this query alone; it spends {spends[accounting]:.6g} "
                f"{accounting}, delta {spends['delta']:.3g} per {h['horizon']} on it){shared}")
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
            f"most {most[accounting]:.6g} {accounting}, delta {most['delta']:.3g} of this query; {checked}: {note}"
            + shared)


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
        plans = plan_config(config)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"{args.config}: {exc}", file=sys.stderr)
        return 1
    namespaces = namespace_summaries(config, plans)
    if args.json:
        print(json.dumps({"queries": plans, "namespaces": namespaces}, indent=2, default=str))
        return 0
    sharing = {n["namespace"]: len(n["queries"]) - 1 for n in namespaces}
    for p in plans:
        loss = p["per_window_loss"]
        local = p["trust_model"] == "local"
        how = p["mechanism_label"] if local else mechanism_word(p["mechanism"], p["mechanism_written"])
        print(f"query {p['query']} ({p['window']} windows, {how}, namespace {p['namespace']})")
        charged = f"{p['per_window_cost']:.6g} {p['accounting']}"
        if p["per_window_delta"]:
            charged += f" and delta {p['per_window_delta']:.3g}"
        per = "period" if p["charged_per"] == "period" else "window"
        print(f"  per {per} and unit: " + ", ".join(f"{k}={fmt(v)}" for k, v in loss.items() if v is not None)
              + f"; charged {charged}")
        if p["trust_model"] == "local":
            print("  noise scale: none added by the worker (each report was randomized by its producer)")
        else:
            print(f"  noise scale: count {fmt(p['count_scale'])}, sum {fmt(p['sum_scale'])}"
                  + (f"; selection threshold {fmt(p['selection_threshold'])} units" if p["selection_threshold"] else ""))
        columns = ("count_ci95", "sum_ci95", "mean_ci95")
        # A local query's error depends on the window's number of reports, not on a value's count: its
        # local_dp line states it per number of reports, and no table by count is printed.
        if "count" in p["accuracy"][0] and any(a.get(c) is not None for a in p["accuracy"] for c in columns):
            print(f"  {'true count':>10} {'count ±95%':>11} {'sum ±95%':>10} {'mean ±95%':>10}")
            for a in p["accuracy"]:
                print(f"  {int(a['count']):>10,} " + " ".join(f"{fmt(a.get(c)):>{w}}" for c, w in zip(columns, (11, 10, 10))))
        for h in p["horizons"]:
            print("  " + _horizon_line(p, h, sharing[p["namespace"]]))
        for line in p["options"]:
            print("  " + line)
        print("  " + p["window_clock"])
        if p["accuracy_line"] is not None:
            print("  " + p["accuracy_line"])
        for line in p["expected"]["warnings"]:
            print("  " + line)
        if p["charged_per"] == "period":
            print("  a period's charge covers all of the unit's windows of the period: the events of an interval of "
                  "event time of one horizon lie in at most the periods it overlaps (counted above), whose charges "
                  "may fall outside it")
        else:
            print(f"  windows are charged at their end: an interval of event time of one horizon may also overlap "
                  f"{p['interval_slack_windows']} window of this query straddling its end, beyond the limit")
    for summary in namespaces:
        for line in namespace_lines(summary):
            print(line)
    return 0
