"""``stream-dp plan``: what all the queries of a namespace spend together on one unit.

Every query reading a namespace draws on the same per-unit budget (docs/privacy/index.md, Budgets), so a query's own
horizon lines, which count its charges alone, overstate how long a unit active in several queries
lasts: three queries that each fit a horizon alone may together spend three times its limit. The
summary adds, per horizon, what a unit active in every window of every query of the namespace is
charged in any interval of the horizon's length, and says when that exhausts a limit.
"""

from __future__ import annotations

from stream_dp.config import format_duration_ms


def charges_in(horizon_ms: int, every_ms: int) -> int:
    """Charges ``every_ms`` apart that an interval of ``horizon_ms`` holds at most: a per-window query charges
    a unit active in every window at each window's end, a continual one at the end of its first window of
    each period, so ``every_ms`` is the window or the period."""
    return -(-horizon_ms // every_ms)


def _duration(ms: float) -> str:
    if ms >= 3_600_000:
        return f"{ms / 3_600_000:.3g}h"
    if ms >= 60_000:
        return f"{ms / 60_000:.3g}m"
    return f"{ms / 1000:.3g}s"


def namespace_summaries(config, plans: list[dict]) -> list[dict]:
    """Per namespace with queries, per horizon: the summed charges of a unit active in every window of every
    query, against the limits. ``plans`` are ``plan_config``'s entries (each query's per-window or per-period
    cost in the namespace's accounting, and its delta)."""
    by_name = {query.name: query for query in config.queries}
    out = []
    for name, namespace in config.namespaces.items():
        members = [p for p in plans if p["namespace"] == name]
        if not members:
            continue
        accounting = namespace.accounting
        horizons = []
        for budget in namespace.budgets:
            rows = []
            for p in members:
                query = by_name[p["query"]]
                every_ms = query.window.size_ms if query.continual is None else query.continual.period_ms
                charges = charges_in(budget.horizon_ms, every_ms)
                rows.append({
                    "query": p["query"],
                    "charged_per": p["charged_per"],
                    "every": format_duration_ms(every_ms),
                    "every_ms": every_ms,
                    "charges": charges,
                    "spends": {accounting: charges * p["per_window_cost"], "delta": charges * p["per_window_delta"]},
                })
            spent = sum(r["spends"][accounting] for r in rows)
            delta = sum(r["spends"]["delta"] for r in rows)
            over = {accounting: spent / budget.limit}
            if budget.delta is not None:
                over["delta"] = delta / budget.delta
            exhausted = sorted(currency for currency, times in over.items() if times > 1)
            times = max(over.values())
            # At this rate a unit fresh at the start of a horizon reaches the tightest limit after this long;
            # then each charge waits until earlier ones leave the horizon.
            lasts_ms = budget.horizon_ms / times if exhausted else None
            horizons.append({
                "horizon": format_duration_ms(budget.horizon_ms),
                "limit": budget.limit,
                "delta_limit": budget.delta,
                "fully_active_unit_spends": {accounting: spent, "delta": delta},
                "times_the_limit": times,
                "exhausted": exhausted,
                "fully_active_unit_lasts_ms": lasts_ms,
                "fully_active_unit_lasts": None if lasts_ms is None else _duration(lasts_ms),
                "per_query": rows,
            })
        out.append({"namespace": name, "accounting": accounting, "queries": [p["query"] for p in members],
                    "horizons": horizons})
    return out


def namespace_lines(summary: dict) -> list[str]:
    """The text ``plan`` prints for one namespace: a header, a line per horizon, a warning per exhausted one."""
    accounting, name = summary["accounting"], summary["namespace"]
    queries = summary["queries"]
    lines = [f"namespace {name} ({accounting} accounting): its {len(queries)} "
             f"quer{'y draws' if len(queries) == 1 else 'ies draw'} on one budget per unit: {', '.join(queries)}"]
    for h in summary["horizons"]:
        limits = f"{h['limit']:g}" + (f" (delta {h['delta_limit']:g})" if h["delta_limit"] is not None else "")
        spends = h["fully_active_unit_spends"]
        # a rho namespace holds no delta (its queries are charged none)
        delta = f", delta {spends['delta']:.3g}" if accounting == "epsilon" else ""
        parts = ", ".join(f"{r['query']} {r['spends'][accounting]:.6g} ({r['charges']} "
                          f"{'window' if r['charged_per'] == 'window' else 'period'}{'s' if r['charges'] != 1 else ''}"
                          f" of {r['every']})" for r in h["per_query"])
        verdict = (f"{h['times_the_limit']:.3g} times the limit" if h["exhausted"]
                   else f"{h['times_the_limit']:.3g} of the limit")
        lines.append(f"  {limits} per {h['horizon']}: a unit active in every window of every query of the namespace "
                     f"is charged {spends[accounting]:.6g} {accounting}{delta} in any "
                     f"{h['horizon']} ({parts}): {verdict}")
        if h["exhausted"]:
            lasts = h["fully_active_unit_lasts_ms"]
            sizes = sorted({r["every_ms"] for r in h["per_query"] if r["charged_per"] == "window"})
            windows = "; ".join(f"{int(lasts // size)} windows of each {format_duration_ms(size)}-window query"
                                for size in sizes)
            lines.append(
                f"  WARNING: namespace {name} together exhausts the {' and '.join(h['exhausted'])} limit per "
                f"{h['horizon']}: a unit active in every window of its queries uses it up in about "
                f"{h['fully_active_unit_lasts']} of windows joined at that rate" + (f" ({windows})" if windows else "")
                + f", then is left out of the windows of every query of {name} until its charges leave the horizon; "
                "each query's own lines count its charges alone. Lower the queries' epsilon, lengthen their windows, "
                "move some to another namespace, or raise the limit")
    return lines

