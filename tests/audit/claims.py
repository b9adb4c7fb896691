"""What a release record must state it spent, written from the query file and the README's budget rules.

The neighbouring-streams audit compares its empirical lower bound with the epsilon the records claim; a
record claiming more than its query was configured to spend would pass it with room to spare. So every
released record's ``privacy`` block is checked against the query's settings, computed here independently of
the worker's plan code:

* a query's ``epsilon`` is what one window (a continual query: one period) costs a unit, all parts
  together, and records state it as their ``epsilon`` (``window_epsilon`` on a top_k record); ``mechanism``
  is the one configured (``geometric`` stated as ``laplace``; local DP as ``local_krr`` / ``local_oue``;
  a top_k list as ``permute_and_flip``);
* each component -- partition selection, count, sum (a mean brings both), top_k, quantiles, mean_vector or
  covariance, sample_aggregate -- takes an equal share: a top_k record's ``epsilon``, ``privacy.quantiles``,
  ``privacy.<vector kind>`` and ``privacy.sample_aggregate`` state theirs; a staircase spends its
  component's share over ``max_groups_per_unit`` groups; a hierarchy splits the count-and-sum share over
  its levels by their weights (``level_epsilon``); a continual period spends its epsilon over the tree's
  ``floor(log2 T) + 1`` levels (``epsilon_per_level``);
* ``delta``: 0 for pure mechanisms; with ``mechanism: gaussian``, the configured delta's share of each
  Gaussian component (count, sum and the selection beside them, vectors, a sample-and-aggregate mean);
  partition selection adds the delta of its threshold: the smallest whose delta is at most
  ``groups.select.delta`` (``selection_delta``);
* ``rho``: none with partition selection (not zCDP); a pure query's at most ``epsilon^2 / 2``.

Claims may fall short of the configured values by the calibration's margin (``RELATIVE``), never exceed them.
"""

from __future__ import annotations

import math
from typing import Any

from stream_dp.config.durations import parse_duration_ms

RELATIVE = 1e-6  # the plans calibrate a hair under the budget (factors such as 1 - 1e-9)
SELECTION_RELATIVE = 1e-4  # OpenDP composes the l0 groups' deltas exactly, the reference by a union bound (4e-6 apart seen)
_BASE = ("count", "sum")
# With Gaussian noise the counts-and-sums release takes its components' shares of delta, the selection's
# included (the selection spends a delta of its own: plan.py, "gaussian: selection takes its share of epsilon")
_GAUSSIAN_PARTS = ("count", "sum", "selection", "mean_vector", "covariance")


def _components(query: dict) -> list[str]:
    aggregations = query["aggregations"]
    names = set(aggregations)
    if "mean" in names:
        names |= {"count", "sum"}
    parts = [n for n in _BASE if n in names]
    if parts and "select" in query["groups"]:
        parts.append("selection")
    return parts + [n for n in ("top_k", "quantiles", "mean_vector", "covariance", "sample_aggregate") if n in names]


def _gaussian_parts(query: dict) -> list[str]:
    if query.get("mechanism", "laplace") != "gaussian":
        return []
    sa = query["aggregations"].get("sample_aggregate")
    extra = ["sample_aggregate"] if sa is not None and sa.get("aggregate", "mean") == "mean" else []
    return [p for p in _components(query) if p in _GAUSSIAN_PARTS] + extra


def _close(claimed: Any, configured: float) -> bool:
    """``claimed`` is ``configured`` up to the calibration's margin below it."""
    if not isinstance(claimed, (int, float)) or isinstance(claimed, bool):
        return False
    if configured == 0:
        return claimed == 0
    return configured * (1 - RELATIVE) <= claimed <= configured * (1 + 1e-12)


def expected_mechanism(query: dict) -> str:
    if query.get("local_dp") is not None:
        return f"local_{query['local_dp'].get('mechanism', 'krr')}"
    mechanism = query.get("mechanism", "laplace")
    return "laplace" if mechanism == "geometric" else mechanism


def _window_delta(query: dict, claimed: Any, problems: list[str], where: str) -> None:
    """The window's delta: the Gaussian parts' shares of the configured delta, plus the selection's own."""
    components = _components(query)
    gaussian = query.get("delta", 0.0) * len(_gaussian_parts(query)) / len(components) if components else 0.0
    if not isinstance(claimed, (int, float)):
        problems.append(f"{where}: delta {claimed!r} is not a number")
        return
    if "select" not in query["groups"]:
        if not _close(claimed, gaussian):
            problems.append(f"{where}: delta {claimed!r}, configured {gaussian!r}")
        return
    selection = claimed - gaussian
    expected = selection_delta(query["epsilon"] / len(components), query["bounds"]["max_groups_per_unit"],
                               query["groups"]["select"]["delta"])
    if not (expected * (1 - SELECTION_RELATIVE) <= selection <= expected * (1 + SELECTION_RELATIVE)):
        problems.append(f"{where}: delta {claimed!r} leaves {selection!r} for partition selection, which spends "
                        f"{expected!r} at its configured delta")


def selection_delta(epsilon: float, l0: int, most: float) -> float:
    """The delta partition selection spends at its share ``epsilon``, for units in up to ``l0`` groups, when
    configured with ``most``: a group is kept when its distinct units plus discrete Laplace noise of scale
    ``l0 / epsilon`` reach the threshold, the smallest threshold whose delta is at most ``most``; a group of
    the one added unit passes with ``P(Z >= t - 1) = q^(t-1) / (1 + q)``, ``q = exp(-1 / scale)``, and the
    unit adds up to ``l0`` such groups (``stream_dp/dp/selection.py``'s docstring)."""
    q = math.exp(-epsilon / l0)
    threshold = 2
    while l0 * q ** (threshold - 1) / (1 + q) > most:
        threshold += 1
    return l0 * q ** (threshold - 1) / (1 + q)


def claim_problems(record: dict, query: dict) -> list[str]:
    """How ``record``'s statement of what it spent departs from ``query`` (the query file's mapping); [] if not."""
    privacy = record.get("privacy")
    if not isinstance(privacy, dict):
        return ["no privacy block"]
    epsilon = query["epsilon"] if query.get("local_dp") is None else query["local_dp"]["epsilon"]
    components = _components(query)
    share = epsilon / len(components) if components else epsilon
    problems: list[str] = []
    where = f"window {record.get('window', {}).get('start_ms')} {record.get('kind', 'group')}"

    def expect(name: str, claimed: Any, configured: float) -> None:
        if not _close(claimed, configured):
            problems.append(f"{where}: {name} {claimed!r}, configured {configured!r}")

    if record.get("kind") == "top_k":
        if privacy.get("mechanism") != "permute_and_flip":
            problems.append(f"{where}: mechanism {privacy.get('mechanism')!r}, configured 'permute_and_flip'")
        expect("epsilon", privacy.get("epsilon"), share)
        expect("delta", privacy.get("delta"), 0.0)
        expect("window_epsilon", privacy.get("window_epsilon"), epsilon)
        _window_delta(query, privacy.get("window_delta"), problems, where)
        return problems
    if privacy.get("mechanism") != expected_mechanism(query):
        problems.append(f"{where}: mechanism {privacy.get('mechanism')!r}, configured {expected_mechanism(query)!r}")
    expect("epsilon", privacy.get("epsilon"), epsilon)
    _window_delta(query, privacy.get("delta"), problems, where)
    rho = privacy.get("rho")
    if "select" in query["groups"]:
        if rho is not None:
            problems.append(f"{where}: rho {rho!r} stated for partition selection, which is not zCDP")
    elif not _gaussian_parts(query) and not (isinstance(rho, (int, float)) and 0 < rho <= epsilon**2 / 2 * (1 + 1e-12)):
        problems.append(f"{where}: rho {rho!r} of a pure epsilon {epsilon!r} query, not in (0, epsilon^2 / 2]")
    aggregations = query["aggregations"]
    if "quantiles" in aggregations:
        stated = privacy.get("quantiles") or {}
        expect("quantiles.epsilon", stated.get("epsilon"), share)
        per_q = share / len(aggregations["quantiles"]["q"]) / (2 if aggregations["quantiles"].get("value_interval") else 1)
        expect("quantiles.epsilon_per_quantile", stated.get("epsilon_per_quantile"), per_q)
    for kind in ("mean_vector", "covariance", "sample_aggregate"):
        if kind in aggregations:
            stated = privacy.get(kind) or {}
            expect(f"{kind}.epsilon", stated.get("epsilon"), share)
            delta = query.get("delta", 0.0) / len(components) if kind in _gaussian_parts(query) else 0.0
            expect(f"{kind}.delta", stated.get("delta"), delta)
    if query.get("mechanism") == "staircase":
        for name in ("count", "sum"):
            if name in components:
                law = (privacy.get("staircase") or {}).get(name) or {}
                expect(f"staircase.{name}.epsilon_per_group", law.get("epsilon_per_group"),
                       share / query["bounds"]["max_groups_per_unit"])
    if "level_epsilon" in privacy or (query.get("hierarchy") and record.get("level") not in (None, len(query["group_by"]) - 1)):
        hierarchy = query.get("hierarchy")
        weights = hierarchy["split"] if isinstance(hierarchy, dict) and hierarchy.get("split") else [1] * len(query["group_by"])
        base = share * len([c for c in components if c in _BASE])
        level = record.get("level")
        configured = base * weights[level] / sum(weights) if isinstance(level, int) and level < len(weights) else math.nan
        expect("level_epsilon", privacy.get("level_epsilon"), configured)
    if query.get("continual") is not None:
        if privacy.get("charged") != "per_period":
            problems.append(f"{where}: charged {privacy.get('charged')!r}, configured 'per_period'")
        stated = privacy.get("continual") or {}
        windows = parse_duration_ms(query["continual"]["period"]) // parse_duration_ms(query["window"]["size"])
        depth = int(math.floor(math.log2(windows))) + 1
        if (stated.get("windows_per_period"), stated.get("depth")) != (windows, depth):
            problems.append(f"{where}: continual.windows_per_period {stated.get('windows_per_period')!r} and depth "
                            f"{stated.get('depth')!r}, configured {windows} and {depth}")
        expect("continual.epsilon_per_level", stated.get("epsilon_per_level"), epsilon / depth)
    elif privacy.get("charged") != "per_window":
        problems.append(f"{where}: charged {privacy.get('charged')!r}, configured 'per_window'")
    return problems
