"""Each 95% error of a query beside the value it qualifies, at the counts its ``expected`` block gives, and a
``WARNING`` naming the settings that would bring an error that exceeds its value below it.

What is compared (``expected``: ``events_per_group`` n, ``units_per_group`` u, ``value`` v):

* count: its half-width against n; sum: against n v; mean: the half-width at a true mean of v against v;
* hierarchy: each level's count (before consistency) against n times the finest groups under its smallest group;
* continual: the running total after the first window of a period (the smallest total) against n, its sum
  against n v;
* quantiles: each q's stated rank error against n min(q, 1 - q), the ranks between the quantile and the
  group's nearer end (a larger error puts the q_interval past the group's smallest or largest value);
* local_dp: a value reported by u units, among u reports of every value of the domain: its frequency
  estimate's half-width against u;
* mean_vector: a mean coordinate's half-width at u units against v; covariance: an entry's against v (a
  variance), both at their largest for data within the clip norm;
* sample_aggregate: the mean over blocks' half-width against v; the median's rank error against half the blocks.

A check whose count or value the block leaves out is not made (``plan`` says which). The epsilon named in
a warning is the error-to-value ratio times the query's epsilon, rounded up to two significant digits (about
right for Laplace noise, whose error falls as 1/epsilon), raised by 10% steps (again rounded up) until the
plan built with it brings the error to at most the value: Gaussian noise's error falls more slowly at large
epsilon, and a discrete half-width is not quite proportional.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal

from stream_dp.config import format_duration_ms

MAX_EPSILON = 10.0  # the most a query's (and a local_dp report's) epsilon may be


@dataclass(frozen=True)
class ExpectedError:
    """One 95% error at the expected counts, beside the value it qualifies."""

    what: str  # what carries the error: "count", "sum", "q0.5 rank", "level 1 count", ...
    error: float
    value: float
    value_text: str  # the value, said: "the count, 3,000 events", "the sum, 114,000 (3,000 x 38)", ...
    fixes: tuple[str, ...]  # settings besides epsilon and the window that lower the error

    @property
    def exceeds(self) -> bool:
        return self.error > abs(self.value)


def _num(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _bounds_fixes(query) -> list[str]:
    bounds = query.bounds
    fixes = [f"lower max_events_per_group ({bounds.max_events_per_group})"] if bounds.max_events_per_group > 1 else []
    if bounds.max_groups_per_unit > 1:
        fixes.append(f"lower max_groups_per_unit ({bounds.max_groups_per_unit})")
    return fixes


def expected_errors(query, plan) -> tuple[list[ExpectedError], list[str]]:
    """(the errors compared, what the query's ``expected`` leaves out that a comparison needs)."""
    expected = query.expected
    if expected is None:
        return [], []
    n, u, v = expected.events_per_group, expected.units_per_group, expected.value
    out: list[ExpectedError] = []
    missing: list[str] = []

    def need(key: str, given, what: str) -> bool:
        if given is None:
            missing.append(f"expected.{key} ({what})")
        return given is not None

    bounds = _bounds_fixes(query)
    clip = query.aggregations.sum.clip if query.aggregations.sum is not None else None
    sum_fixes = ((*bounds, f"a narrower clip than [{clip[0]:g}, {clip[1]:g}]") if clip is not None
                 else tuple(bounds))
    if plan.local is not None:
        if need("units_per_group", u, "the reports of a value"):
            local = plan.local
            k = local.domain_size
            p, q = local.p, local.q
            variance = (u * p * (1 - p) + u * (k - 1) * q * (1 - q)) / (p - q) ** 2
            out.append(ExpectedError("frequency", 1.96 * math.sqrt(variance), u,
                                     f"the frequency, {_num(u)} reports", ()))
        return out, missing
    if plan.continual is not None:
        (row,) = plan.continual.error_table([1])
        caps = ((f"lower max_windows_per_unit ({query.continual.max_windows_per_unit})",)
                if query.continual.max_windows_per_unit > 1 else ())
        if row["count"] is not None and need("events_per_group", n, "the count"):
            out.append(ExpectedError("running count", row["count"]["tree_ci95"], n,
                                     f"the total after a period's first window, {_num(n)} events", (*caps, *bounds)))
        if row["sum"] is not None and n is not None and need("value", v, "the sum"):
            out.append(ExpectedError("running sum", row["sum"]["tree_ci95"], n * v,
                                     f"the total after a period's first window, {_num(n * v)} ({_num(n)} x {_num(v)})",
                                     (*caps, *sum_fixes)))
        return out, missing
    if plan.levels and (plan.base.count_noise is not None or plan.base.sum_noise is not None):
        if need("events_per_group", n, "the counts"):
            finest = query.public_group_keys()
            for level, level_plan in enumerate(plan.levels):
                accuracy = level_plan.accuracy_at(n)
                if plan.hierarchy:
                    # the smallest group of the level holds the fewest finest groups
                    width = (min(sum(1 for key in finest if key[:level + 1] == prefix)
                                 for prefix in {key[:level + 1] for key in finest}) if finest else 1)
                    name, events = f"level {level} count", n * width
                else:
                    name, events = "count", n
                if accuracy["count_ci95"] is not None:
                    out.append(ExpectedError(name, accuracy["count_ci95"], events,
                                             f"the count, {_num(events)} events", tuple(bounds)))
                if accuracy["sum_ci95"] is not None and need("value", v, "the sum and mean"):
                    out.append(ExpectedError(name.replace("count", "sum"), accuracy["sum_ci95"], events * v,
                                             f"the sum, {_num(events * v)} ({_num(events)} x {_num(v)})", sum_fixes))
                    if "mean" in level_plan.aggregations:
                        out.append(ExpectedError(name.replace("count", "mean"), level_plan.mean_ci95_at(events, v), v,
                                                 f"the mean, {_num(v)}", sum_fixes))
    if plan.quantiles is not None and need("events_per_group", n, "the quantiles' ranks"):
        sized = plan.base is not None and plan.base.count_noise is not None
        fixes = _bounds_fixes(query)
        if len(plan.quantiles.q) > 1:
            fixes.append(f"ask for fewer q ({len(plan.quantiles.q)})")
        if plan.quantiles.interval is not None:
            fixes.append("value_interval: false (half the quantiles' share goes to it)")
        for q, error in zip(plan.quantiles.q, plan.quantiles.stated_rank_error(sized)):
            rank = n * min(q, 1 - q)
            out.append(ExpectedError(f"q{q:g} rank", float(error), rank,
                                     f"its ranks from the group's nearer end, {_num(rank)} ({_num(n)} x "
                                     f"{min(q, 1 - q):g})", tuple(fixes)))
    if plan.vector is not None and need("units_per_group", u, "the vector's units") and need("value", v, "its size"):
        errors = plan.vector.errors_at(u)
        name = "covariance" if "covariance" in errors else "mean"
        what = "covariance entry" if name == "covariance" else "mean coordinate"
        fix = (f"a smaller clip_norm ({plan.vector.features.clip_norm:g}) if the vectors' norms allow",)
        out.append(ExpectedError(what, errors[name][1], v,
                                 f"{'a variance' if name == 'covariance' else 'a coordinate'}, {_num(v)}", fix))
    if plan.sample_aggregate is not None:
        sa = plan.sample_aggregate
        blocks = f"more blocks ({sa.blocks})"
        if sa.median is not None:
            out.append(ExpectedError("median rank", sa.median_rank_error(), sa.blocks / 2,
                                     f"half the blocks, {_num(sa.blocks / 2)}", (blocks,)))
        elif need("value", v, "the function's output"):
            out.append(ExpectedError("mean over blocks", sa.noise.ci_half_width(0.05) / sa.blocks, v,
                                     f"the output, {_num(v)}",
                                     (f"a narrower output_range than [{sa.lo:g}, {sa.hi:g}]", blocks)))
    return out, list(dict.fromkeys(missing))  # a hierarchy's levels need the same value


def ceil_significant(x: float, digits: int = 2) -> float:
    """``x`` rounded up to ``digits`` significant digits (0.4401 -> 0.45, 13.2 -> 14, 0.45 -> 0.45); ``x`` is first
    read to 12 significant digits, so that a product such as 0.1 x 4.5 is taken as the 0.45 it means."""
    if not x > 0:
        raise ValueError(f"x must be positive, got {x!r}")
    exact = Decimal(f"{x:.12g}")
    return float(exact.quantize(Decimal(1).scaleb(exact.adjusted() - digits + 1), rounding=ROUND_CEILING))


def _with_epsilon(query, epsilon: float):
    update = {"epsilon": epsilon}
    if query.local_dp is not None:
        update["local_dp"] = query.local_dp.model_copy(update={"epsilon": epsilon})
    return query.model_copy(update=update)


def epsilon_fix(query, what: str, ratio: float, build_plan) -> float | None:
    """The epsilon, two significant digits, at which check ``what`` of ``query`` is at most its value; None when
    no epsilon up to ``MAX_EPSILON`` is."""
    epsilon = query.local_dp.epsilon if query.local_dp is not None else query.epsilon
    candidate = min(ceil_significant(epsilon * ratio), MAX_EPSILON)  # the staircase's error falls faster
    while True:
        changed = _with_epsilon(query, candidate)
        checks, _ = expected_errors(changed, build_plan(changed))
        if all(not c.exceeds for c in checks if c.what == what):
            return candidate
        if candidate >= MAX_EPSILON:
            return None
        candidate = min(ceil_significant(candidate * 1.1), MAX_EPSILON)


def warning_lines(query, checks: list[ExpectedError], build_plan) -> list[str]:
    """One ``WARNING`` per error that exceeds its value, with the settings that would fix it."""
    lines = []
    window_ms = query.window.size_ms
    for check in checks:
        if not check.exceeds:
            continue
        ratio = check.error / abs(check.value)
        epsilon = epsilon_fix(query, check.what, ratio, build_plan)
        current = query.local_dp.epsilon if query.local_dp is not None else query.epsilon
        fixes = ([f"raise epsilon to {epsilon:g} (it is {current:g})"] if epsilon is not None
                 else [f"no epsilon up to {MAX_EPSILON:g} brings it below"])
        wider = math.ceil(window_ms * ratio / 1000) * 1000
        fixes.append(f"widen the window to {format_duration_ms(wider)} (it is {format_duration_ms(window_ms)}) where "
                     "groups then hold proportionally more")
        fixes.extend(check.fixes)
        lines.append(f"WARNING: query {query.name}: at the expected counts the {check.what}'s 95% error "
                     f"±{_num(check.error)} exceeds {check.value_text}; "
                     + ", or ".join([", ".join(fixes[:-1]), fixes[-1]] if len(fixes) > 1 else fixes))
    return lines


def accuracy_line(query, checks: list[ExpectedError], missing: list[str]) -> str | None:
    """``plan``'s line of every error beside its value at the expected counts."""
    if query.expected is None:
        return None
    given = ", ".join(f"{key.replace('_', ' ')} {_num(value)}" for key, value in
                      query.expected.model_dump(exclude_none=True).items())
    parts = [f"{c.what} ±{_num(c.error)} ({c.error / abs(c.value):.1%} of {c.value_text.split(', ', 1)[1]})"
             for c in checks]
    line = f"at the expected counts ({given}): " + ("; ".join(parts) if parts else "nothing to compare")
    if missing:
        line += f"; not compared without {', '.join(missing)}"
    return line


def expected_summary(query, plan, build_plan) -> dict:
    """What ``plan --json`` states: every error at the expected counts, the warnings and what is missing."""
    checks, missing = expected_errors(query, plan)
    return {
        "given": None if query.expected is None else query.expected.model_dump(exclude_none=True),
        "errors": [{"what": c.what, "ci95": c.error, "value": c.value, "exceeds": c.exceeds} for c in checks],
        "not_compared": missing,
        "warnings": warning_lines(query, checks, build_plan),
    }


__all__ = ["ExpectedError", "accuracy_line", "ceil_significant", "expected_errors", "expected_summary",
           "warning_lines"]
