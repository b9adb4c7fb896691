"""Release records as text for ``stream-dp tail``: one table row per record, and under it one indented
line per option block the record carries (deploy/schemas/release.schema.json), so that every kind of
release shows its numbers rather than a column of dashes."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

HEADER = (f"{'window start':<24} {'group':<24} {'count':>9} {'±95%':>8} {'sum':>12} {'±95%':>10} "
          f"{'mean':>9} {'±95%':>8} {'eps':>6}")
INDENT = " " * 4


def _num(value: float | None, width: int, digits: int = 1) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width},.{digits}f}"


def _count(value: float | None) -> str:
    """Counts are integers, except the consistent estimates of hierarchy queries and the debiased
    estimates of local-DP queries: those get one decimal (four significant digits once they are too
    wide for the column) instead of the 17 digits of their JSON."""
    if value is None:
        return "-"
    if isinstance(value, int) or float(value).is_integer() and abs(value) < 1e9:
        return f"{int(value):,}"
    return f"{value:,.1f}" if abs(value) < 1e6 else f"{value:.4g}"


def _g(value: float | None) -> str:
    """A released number in four significant digits: the noise dwarfs any further digit."""
    return "-" if value is None else f"{value:.4g}"


def _vector(values: list[float]) -> str:
    return "[" + ", ".join(_g(v) for v in values) + "]"


def _group(group: dict[str, Any]) -> str:
    return ",".join(str(v) for v in group.values())


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _quantiles(block: dict[str, Any]) -> str:
    parts = []
    for q, answer in block.items():
        low, high = answer["q_interval"]
        interval = answer.get("value_ci95")
        within = "" if interval is None else f", 95% in [{_g(interval[0])}, {_g(interval[1])}]"
        parts.append(f"q{q} {_g(answer['value'])} (rank ±{_g(answer['rank_error'])}, q {_g(low)}-{_g(high)}{within})")
    return "quantiles: " + "  ".join(parts)


_NO_MEAN = "mean - (noisy units below one)"


def _mean_vector(block: dict[str, Any]) -> str:
    if block.get("mean") is None:  # too few noisy units for a mean: the record holds the sums only
        means = _NO_MEAN
    else:
        means = ", ".join(f"{field} {_g(mean)} ±{_g(ci)}"
                          for field, mean, ci in zip(block["fields"], block["mean"], block["mean_ci95"]))
    return f"mean_vector: {means}  (units {_g(block['units'])}, sum sd {_g(block['sum_sd'])})"


def _covariance(block: dict[str, Any]) -> str:
    if block.get("covariance") is None or block.get("mean") is None:
        body = _NO_MEAN
    else:
        rows = "; ".join(" ".join(_g(v) for v in row) for row in block["covariance"])
        body = f"[{rows}]  mean {_vector(block['mean'])}"
    line = (f"covariance {','.join(block['fields'])}: {body}  "
            f"(units {_g(block['units'])}, entry sd {_g(block['entry_sd'])}")
    if block.get("eigenvalues_raised"):
        line += f", {block['eigenvalues_raised']} eigenvalue(s) raised to 0"
    return line + ")"


def _sample_aggregate(block: dict[str, Any], privacy: dict[str, Any]) -> str:
    function = privacy.get("sample_aggregate", {}).get("function")
    of = f" of {function}" if function else ""
    if block.get("aggregate") == "median":
        low, high = block["q_interval"]
        return (f"sample_aggregate: median{of} over {block['blocks']} blocks {_g(block['value'])} "
                f"(rank ±{_g(block['rank_error'])} blocks, q {_g(low)}-{_g(high)})")
    return f"sample_aggregate: mean{of} over {block['blocks']} blocks {_g(block['value'])} ±{_g(block.get('ci95'))}"


def _local_dp(block: dict[str, Any], privacy: dict[str, Any]) -> str:
    law = privacy.get("local_dp", {})
    how = f" {law['mechanism']} (eps {_g(law['epsilon'])}, domain {law['domain_size']})" if law else ""
    return f"local_dp{how}: {block['reports']:,} reports, count variance {_g(block['variance'])}"


def _continual(block: dict[str, Any]) -> str:
    since = block["period_start"]
    if block.get("tree_restarted_ms") is not None:  # the totals start there, not at the period's start
        since = f"{_iso(block['tree_restarted_ms'])} (restarted)"
    return f"continual: running total since {since}, window {block['window_index']} of {block['windows_per_period']}"


def _hierarchy(record: dict[str, Any]) -> str:
    level_epsilon = record["privacy"].get("level_epsilon")
    share = "" if level_epsilon is None else f" (this level's eps {_g(level_epsilon)})"
    return f"hierarchy level {record['level']}{share}"


def _details(record: dict[str, Any]) -> list[str]:
    privacy = record["privacy"]
    lines = []
    if "level" in record:
        lines.append(_hierarchy(record))
    if "continual" in record:
        lines.append(_continual(record["continual"]))
    if "quantiles" in record:
        lines.append(_quantiles(record["quantiles"]))
    if "mean_vector" in record:
        lines.append(_mean_vector(record["mean_vector"]))
    if "covariance" in record:
        lines.append(_covariance(record["covariance"]))
    if "sample_aggregate" in record:
        lines.append(_sample_aggregate(record["sample_aggregate"], privacy))
    if "local_dp" in record:
        lines.append(_local_dp(record["local_dp"], privacy))
    return lines


def _top_k(record: dict[str, Any]) -> str:
    title = f"top {record['k']} of {record['candidates']}"
    head = (f"{record['window']['start']:<24} {title:<24} {'-':>9} {'-':>8} {'-':>12} {'-':>10} {'-':>9} {'-':>8} "
            f"{_g(record['privacy']['epsilon']):>6}")
    ranks = [f"{INDENT}{entry['rank']}. {_group(entry['group'])}" for entry in record["top"]]
    return "\n".join([head, *ranks]) if ranks else f"{head}\n{INDENT}(no group released)"


def format_row(record: dict[str, Any]) -> str:
    """One record as text: its table row, then one indented line per option block it carries (a top-k
    record: its ranked groups, one a line)."""
    if record.get("kind") == "top_k":
        return _top_k(record)
    group = _group(record["group"])
    ci = record["ci95"]
    row = (
        f"{record['window']['start']:<24} {group[:24]:<24} {_count(record['count']):>9} {_num(ci['count'], 8)} "
        f"{_num(record['sum'], 12)} {_num(ci['sum'], 10)} {_num(record['mean'], 9, 2)} {_num(ci['mean'], 8, 2)} "
        f"{_g(record['privacy']['epsilon']):>6}"
    )
    return "\n".join([row, *(INDENT + line for line in _details(record))])
