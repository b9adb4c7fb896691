"""Text reports of fault runs: one block per run, and the table of faults survived."""

from __future__ import annotations

from tests.reliability.harness import RunResult


def outcome(result: RunResult) -> str:
    if result.error:
        return "harness error"
    if not result.injected:
        return f"FAILED: fault not injected ({len(result.injections)}/{result.injections_needed})"
    if result.passed:
        return "survived"
    return "FAILED: " + ", ".join(f"{kind} x{n}" for kind, n in sorted(result.report.kinds.items()))


def format_table(results: list[RunResult]) -> str:
    header = ("#", "fault", "seed", "result", "query windows", "dups", "partial copies", "produced", "late", "rejected",
              "exits", "seconds")
    rows = [header]
    for i, r in enumerate(results, 1):
        stats = r.report.stats
        free = next((k.split(":")[0] for k in stats if k.endswith(": accepted") and "_free" in k), "")
        rows.append((
            str(i), r.fault, str(r.seed),
            outcome(r),
            str(stats.get("windows released", 0)), str(stats.get("duplicate deliveries", 0)),
            str(stats.get("partial copies", 0)), str(stats.get("produced", 0)),
            str(stats.get(f"{free}: late", 0)), str(stats.get(f"{free}: rejected", 0)),
            str(len(r.unexpected_exits)), f"{r.duration_s:.0f}",
        ))
    widths = [max(len(row[c]) for row in rows) for c in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def describe(result: RunResult) -> str:
    lines = [f"--- {result.fault} (seed {result.seed}): {outcome(result)}",
             *(f"    {n}" for n in result.notes)]
    lines += [f"    exit: {e}" for e in result.unexpected_exits]
    if result.error:
        lines.append(f"    harness error:\n{result.error}")
    lines += [f"    VIOLATION: {v}" for v in result.report.violations[:15]]
    if len(result.report.violations) > 15:
        lines.append(f"    ... {len(result.report.violations) - 15} more")
    lines.append(f"    logs: {result.work_dir}")
    return "\n".join(lines)


def format_kinds(kinds: list[str], results: list[RunResult]) -> str:
    """Runs and survivors per fault kind."""
    totals: dict[str, list[int]] = {}
    for kind, result in zip(kinds, results):
        row = totals.setdefault(kind, [0, 0])
        row[0] += 1
        row[1] += result.passed
    width = max((len(k) for k in totals), default=4)
    return "\n".join(f"{kind.ljust(width)}  {ran} runs, {ok} survived" for kind, (ran, ok) in totals.items())
