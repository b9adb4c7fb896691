"""Settings a query implies when it leaves them out, filled in before the query is validated.

A query is then built exactly as if the file wrote them: the same ``QueryConfig``, plan, charge and
settings fingerprint. ``check-config`` prints one line per setting filled in, so that nothing is added
unseen (``PipelineConfig.implied``).

* ``count: {}`` beside quantiles without a count or mean: each group's noisy count sizes its quantiles'
  95% ``q_interval``.
* ``count: {}`` beside top_k over privately selected groups without a count, sum or mean: partition
  selection of a count picks the candidates.
* the query's ``epsilon`` from ``local_dp.epsilon``: a window costs a unit its one report.

An added count is a component like any other: it takes its equal share of the query's epsilon.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from stream_dp.config.query_options import LocalDPConfig

_QUANTILES_WHY = "each group's noisy count sizes its 95% q_interval"
_TOP_K_WHY = "partition selection of the noisy counts picks the groups top_k ranks"


def _local_epsilon(query: dict[str, Any]) -> float | None:
    """``local_dp.epsilon`` when the block is valid; else None: its own errors are then reported, and the
    query's epsilon stays missing rather than repeating them under a key the file does not hold."""
    local = query.get("local_dp")
    if not isinstance(local, dict):
        return None
    try:
        return LocalDPConfig.model_validate(local).epsilon
    except ValidationError:
        return None


def implied_settings(query: Any) -> tuple[Any, list[str]]:
    """``query`` (a query's mapping as written) with the settings it implies filled in, and one line per
    setting filled in; anything that is not a mapping is returned as it is."""
    if not isinstance(query, dict):
        return query, []
    lines: list[str] = []
    filled = dict(query)
    aggregations = query.get("aggregations")
    if isinstance(aggregations, dict) and "count" not in aggregations:
        groups = query.get("groups")
        selected = isinstance(groups, dict) and "select" in groups and "public" not in groups
        why = []
        if "quantiles" in aggregations and "mean" not in aggregations:
            why.append(("quantiles", _QUANTILES_WHY))
        if "top_k" in aggregations and selected and not {"sum", "mean"} & aggregations.keys():
            why.append(("top_k over selected groups", _TOP_K_WHY))
        if why:
            # first, as a file that writes it usually does; the order of the keys changes nothing built
            filled["aggregations"] = {"count": {}, **aggregations}
            lines.append(f"count added beside {' and '.join(name for name, _ in why)}: "
                         f"{'; '.join(reason for _, reason in why)}; it takes its equal share of epsilon")
    if "epsilon" not in query and (epsilon := _local_epsilon(query)) is not None:
        filled["epsilon"] = epsilon
        lines.append(f"epsilon {epsilon:g} taken from local_dp.epsilon: what a window costs a unit is its one report")
    return filled, lines
