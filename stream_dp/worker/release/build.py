"""A combined window to the release entry the ledger stores: every noise draw of the window, once.

The per-group counts, sums and means are the entry's rows. The options add:
quantiles as a ``quantiles`` object on each row; the other levels of a
hierarchy and the top-k list as whole records after the rows; a continual
query's rows are running totals, and the binary tree's state after the window
is stored with the entry (never published), so the next window -- on this
worker or after a restart on another -- continues from the very noise
released here.

Pure functions of the window, the plan and the noise source; no I/O but a log line.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from stream_dp.config.release_time import capped_option
from stream_dp.dp.histogram import SparseHistogram
from stream_dp.dp.quantiles import COUNT_BETA
from stream_dp.worker.release.entry import ReleaseEntry, build_entry
from stream_dp.worker.release.ids import iso_utc, release_id

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Placeholder:
    """A release with no per-group values (a query of top_k or quantiles alone): every group is a row."""

    keep: np.ndarray
    count: None = None
    sum: None = None
    mean: None = None
    mean_ci95: None = None
    count_std: None = None
    sum_std: None = None
    count_ci95: None = None
    sum_ci95: None = None


def privacy_statement(query: Any, plan: Any, described: dict[str, Any]) -> dict[str, Any]:
    """The ``privacy`` block of every record of a query: what one window (or period) spends, and how."""
    aggregations = query.aggregations
    privacy = {
        "namespace": query.privacy_unit.namespace,
        "unit_field": query.privacy_unit.field,
        "mechanism": query.mechanism,
        "epsilon": plan.loss.epsilon,
        "delta": plan.loss.delta,
        "rho": plan.loss.rho,
        "count_scale": described["count_scale"],
        "sum_scale": described["sum_scale"],
        "groups": "public" if query.public_group_keys() is not None else "selected",
        "max_groups_per_unit": query.bounds.max_groups_per_unit,
        "max_events_per_group": query.bounds.max_events_per_group,
        "clip": list(aggregations.sum.clip) if aggregations.sum is not None else None,
        "charged": "per_period" if query.continual is not None else "per_window",
        "trust_model": "central",
    }
    if query.local_dp is not None:
        # Randomized by the producers: no central noise; epsilon is one report's, protecting its value.
        privacy.update(mechanism=f"local_{query.local_dp.mechanism}", trust_model="local", local_dp=described["local_dp"])
    if described.get(aggregations.vector_kind or "") is not None:
        vector = described[aggregations.vector_kind]
        privacy[aggregations.vector_kind] = {
            key: vector[key] for key in ("mechanism", "fields", "clip_norm", "l2_sensitivity", "noise_sd",
                                         "epsilon", "delta", "rho")
        }
    if described.get("sample_aggregate") is not None:
        sa = described["sample_aggregate"]
        privacy["sample_aggregate"] = {key: sa[key] for key in ("mechanism", "aggregate", "function", "blocks",
                                                                  "output_range", "noise", "sum_scale", "bins",
                                                                  "rank_scale", "epsilon", "delta", "rho") if key in sa}
    if described.get("quantiles") is not None:
        # the quantiles' own draw: count_scale and sum_scale above are the counts' and sums', not theirs
        quantiles = described["quantiles"]
        candidates = quantiles["candidates"]
        privacy["quantiles"] = {
            "mechanism": quantiles["mechanism"], "selection": quantiles["selection"], "q": quantiles["q"],
            "bounds": [candidates["lo"], candidates["hi"]], "bins": candidates["bins"],
            "epsilon_per_quantile": quantiles["epsilon_per_quantile"], "scale": quantiles["scale"],
            "epsilon": quantiles["loss"]["epsilon"],
        }
        if quantiles.get("value_interval") is not None:
            privacy["quantiles"]["value_interval"] = quantiles["value_interval"]
    if query.continual is not None:
        # count_scale and sum_scale are one tree node's: a running total adds up to ``depth`` nodes
        privacy["continual"] = {
            "mechanism": described["mechanism"], "noise": described["noise"], "depth": described["depth"],
            "windows_per_period": described["windows_per_period"],
            "max_windows_per_unit": described["max_windows_per_unit"],
            "epsilon_per_level": described["per_level"]["epsilon"],
        }
    if query.mechanism == "staircase":
        privacy["staircase"] = {
            name: {"epsilon_per_group": law["epsilon_per_group"], "stair_width": law["scale"],
                   "gamma": law["gamma"], "grid": law["grid"]}
            for name in ("count", "sum") if (law := described.get(name)) is not None
        }
    return privacy


def _component_privacy(query: Any, mechanism: str, loss: Any, **scales: Any) -> dict[str, Any]:
    """The privacy block of an option's record: what that part spent, beside the whole window's loss."""
    return {
        **{k: v for k, v in query.privacy.items() if k in ("namespace", "unit_field", "groups",
                                                           "max_groups_per_unit", "max_events_per_group")},
        "mechanism": mechanism, "epsilon": loss.epsilon, "delta": loss.delta, "rho": loss.rho,
        "count_scale": None, "sum_scale": None, **scales,
        "window_epsilon": query.privacy["epsilon"], "window_delta": query.privacy["delta"],
    }


def build_release(query: Any, window: Any, noise: Any, released_at_ms: int, previous_state: Any = None) -> ReleaseEntry:
    """Draw every noise of ``window`` for ``query`` (a ``QueryRuntime``) and build its ledger entry.

    ``previous_state``: for a continual query, the tree state stored with the previous window of
    the period (``ReleaseEntry.state``), or None to start the period's tree at this window.
    """
    plan = query.plan
    if plan.local is not None:
        return _local_release(query, window, released_at_ms)
    if plan.continual is not None:
        from stream_dp.worker.release.continual import build_continual

        return build_continual(query, window, noise, released_at_ms, previous_state)
    base = plan.base
    if base is not None:
        noisy = base.release(window.count, window.sum, window.distinct_units, noise)
    else:
        # rows only to carry quantiles or vectors; a top_k-only query publishes its list alone
        rows = plan.quantiles is not None or plan.vector is not None or plan.sample_aggregate is not None
        noisy = _Placeholder(keep=np.full(len(window.groups), rows, dtype=bool))
    if base is not None and base.selection is not None:
        noisy = _cap_released_groups(query, window, noisy)
    extras: list[tuple[bytes, bytes]] = []
    if plan.hierarchy:
        from stream_dp.worker.release.hierarchy import release_levels

        noisy, level_entries = release_levels(query, window, noisy, noise, released_at_ms)
        for entry in level_entries:
            extras += entry.render()
    index = np.flatnonzero(np.asarray(noisy.keep, dtype=bool))
    row_extra = None
    if plan.quantiles is not None:
        row_extra = _quantile_fragments(plan, window, noisy, index, noise)
    if plan.vector is not None:
        row_extra = _vector_fragments(plan.vector, window, index, noise)
    if plan.sample_aggregate is not None:
        row_extra = _sample_aggregate_fragments(query, window, index, noise)
    if plan.top_k is not None:
        candidates = index if base is not None else np.arange(len(window.groups))  # public groups
        # Over selected groups a window whose selection released no group publishes nothing at all, as a
        # window without data (never drawn) does: a list of no candidates would tell, without noise, that
        # the window had data. Whether the record exists is then a function of the selection's outcome
        # alone; public groups (never none) always have it.
        if len(candidates):
            extras.append(_top_k_record(query, window, noisy, candidates, noise, released_at_ms))
    entry = build_entry(query, window, noisy, released_at_ms,
                        extra_prefix=b',"level":%d' % (len(plan.levels) - 1) if plan.hierarchy else b"")
    if row_extra is not None or extras:
        entry = ReleaseEntry(**{**entry.__dict__, "row_extra": row_extra, "extras": tuple(extras)})
    return entry


@dataclass(frozen=True)
class _LocalEstimates:
    """Debiased counts of randomized reports, in the shape of a noisy release (no noise is drawn)."""

    keep: np.ndarray
    count: np.ndarray
    count_std: float
    count_ci95: float
    sum: None = None
    mean: None = None
    mean_ci95: None = None
    sum_std: None = None
    sum_ci95: None = None


def _local_release(query: Any, window: Any, released_at_ms: int) -> ReleaseEntry:
    """Every value of the domain: its debiased frequency among the window's reports, with its variance.

    The counts are of reports randomized by their producers: this is post-processing of local
    randomizers' outputs, with no further privacy cost. ``std`` and ``ci95`` hold the largest over
    frequencies (normal approximation); each record's ``local_dp.variance`` is its own estimate's.
    """
    local = query.plan.local
    groups = None
    if local.mechanism == "oue":
        # one group holding every kept report's 0/1 row: its sums are the values' support counts, and
        # every report is one unit charged (a report may support no value at all)
        features = window.features
        support = (np.zeros(local.domain_size) if features is None or not len(features) else features[0])
        support = np.rint(support).astype(np.int64)
        reports = 0 if window.withheld else int(window.units_charged)
        groups = query.public_groups
    else:
        support = np.asarray(window.count, dtype=np.int64)  # each report supports one value
        reports = int(support.sum())
    estimate, variance = local.estimate(support, reports)
    _, worst = local.estimate_bounds(reports)
    noisy = _LocalEstimates(keep=np.ones(support.size, dtype=bool), count=estimate,
                            count_std=float(worst) ** 0.5, count_ci95=1.96 * float(worst) ** 0.5)
    entry = build_entry(query, window, noisy, released_at_ms, groups=groups)
    fragments = [b',"local_dp":' + orjson.dumps({"reports": reports, "variance": float(v)}) for v in variance.tolist()]
    return ReleaseEntry(**{**entry.__dict__, "row_extra": fragments})


def _positions(n_groups: int, index: np.ndarray) -> np.ndarray:
    """Each of the window's groups' row among the released ones (``index``), -1 for a group left out."""
    position = np.full(n_groups, -1, dtype=np.int64)
    position[index] = np.arange(len(index))
    return position


def _cap_released_groups(query: Any, window: Any, noisy: Any) -> Any:
    """At most ``max_released_groups`` of the groups selection kept: those with the largest noisy counts.

    Quantiles, vectors and the user function of sample_aggregate work group by group, and a producer can
    make up any number of groups that pass selection, so the cap is what bounds the release's work
    (check-config holds it, times one group's release time, within the window). The choice reads only
    the released noisy counts and the released groups' keys (ties broken by key): post-processing of the
    release, which costs no privacy. The groups left out are left out of the whole window's release.
    """
    capped = capped_option(query.config)
    cap = None if capped is None else capped[1].max_released_groups
    kept = np.flatnonzero(np.asarray(noisy.keep, dtype=bool))
    if cap is None or len(kept) <= cap:
        return noisy
    counts = np.zeros(len(window.groups), dtype=np.int64) if noisy.count is None else np.asarray(noisy.count)
    ranked = sorted(kept.tolist(), key=lambda i: (-int(counts[i]), orjson.dumps(list(window.groups[i]))))
    keep = np.zeros(len(window.groups), dtype=bool)
    keep[ranked[:cap]] = True
    log.warning("window %s of %s: %d groups passed selection; the %d with the largest noisy counts are released "
                "(%s.max_released_groups), the other %d left out", window.window_start_ms, query.name,
                len(kept), cap, capped[0], len(kept) - cap)
    return dataclasses.replace(noisy, keep=keep)


def _vector_fragments(vector: Any, window: Any, index: np.ndarray, noise: Any) -> list[bytes]:
    """``,"mean_vector":{...}`` or ``,"covariance":{...}`` for each released group.

    Only the released groups are noised: which groups are released is the count's decision, taken
    before. Their number may exceed the plan's ``max_groups``: one unit changes at most
    ``max_groups_per_unit`` of them, which is what the noise is certified for (``VectorPlan``).
    """
    features = window.features
    if features is None:  # an empty window: every group's sums are zero
        sums = np.zeros((len(index), vector.features.width))
    else:
        sums = np.asarray(features, dtype=np.float64)[index]
    noisy = vector.noisy(sums, noise)
    name = vector.features.kind.encode()
    return [b',"' + name + b'":' + orjson.dumps(block) for block in vector.rows(noisy)]


def _sample_aggregate_fragments(query: Any, window: Any, index: np.ndarray, noise: Any) -> list[bytes]:
    """``,"sample_aggregate":{...}`` for each released group: the noisy mean (or median) of the blocks' clipped outputs.

    The user function runs in the query's sandbox on the non-empty blocks of the released groups only.
    Which groups are released is decided before it runs (selection reads the noisy distinct-unit counts,
    never the function's outputs); a block of a group left out would take the release stage's time for
    nothing, and the time it took would hint at a group that selection exists to hide. An empty or failed
    block counts as the output range's midpoint (``SampleAggregatePlan``).
    """
    from stream_dp.dp.sample_aggregate import split_blocks

    plan = query.plan.sample_aggregate
    n = len(index)
    if not n:
        return []
    blocks = window.blocks
    if blocks is None or not len(blocks):  # an empty (or withheld) window: every block is empty
        cells = [[np.zeros(0)] * plan.blocks for _ in range(n)]
    else:
        row = _positions(len(window.groups), index)[np.asarray(blocks.group, dtype=np.int64)]
        inside = row >= 0
        cells = split_blocks(row[inside], np.asarray(blocks.block)[inside], np.asarray(blocks.value)[inside], n,
                             plan.blocks)
    # empty blocks are not handed to the function: like failed ones they count as the range's midpoint
    flat = [values for group_blocks in cells for values in group_blocks]
    outputs = np.full(len(flat), np.nan)
    filled = [i for i, values in enumerate(flat) if len(values)]
    if filled:
        outputs[filled] = query.sandbox.run([flat[i] for i in filled])
    rows = plan.release_rows(outputs.reshape(n, plan.blocks), noise)
    return [b',"sample_aggregate":' + orjson.dumps(row) for row in rows]


def _quantile_fragments(plan: Any, window: Any, noisy: Any, index: np.ndarray, noise: Any) -> list[bytes]:
    """``,"quantiles":{...}`` for each released group.

    Only the released groups' histograms are taken, sparse, and ``QuantilesPlan.release`` scores them a
    chunk of rows at a time: the candidates selection drops may be many (a producer can make up groups),
    and a dense matrix of all of them (groups x bins x 8 bytes) would exhaust the worker's memory.
    """
    quantiles = plan.quantiles
    histogram = window.histogram
    n = len(window.groups)
    if histogram is None:  # no histogram at all: every group empty
        histogram = SparseHistogram.empty(len(index), quantiles.bins)
    elif len(index) != n:  # only the groups partition selection kept
        if hasattr(histogram, "take_groups"):
            histogram = histogram.take_groups(_positions(n, index), len(index))
        else:
            histogram = np.asarray(histogram)[index]
    noisy_counts = count_ci = None
    if noisy.count is not None and plan.base is not None:
        # the count's half-width at the level the quantiles' statement takes it (1 - COUNT_BETA). A
        # hierarchy's consistent count may be below 0: no group holds fewer than 0 values, and the
        # size bound max(1, count - half-width) is the same either way
        noisy_counts = np.maximum(np.asarray(noisy.count, dtype=np.float64)[index], 0.0)
        count_ci = plan.base.count_noise.ci_half_width(COUNT_BETA)
    released = quantiles.release(histogram, noise, noisy_counts=noisy_counts, count_ci=count_ci)
    names = [repr(float(q)) if float(q) != int(q) else str(q) for q in released.q]
    values = released.values.tolist()
    intervals = None if released.q_interval is None else released.q_interval.tolist()
    value_ci = None if released.value_ci95 is None else released.value_ci95.tolist()
    errors = released.rank_error.tolist()
    out = []
    for row in range(len(values)):
        block = {
            name: {"value": values[row][i], "rank_error": errors[i],
                   "q_interval": None if intervals is None else intervals[row][i],
                   **({} if value_ci is None else {"value_ci95": value_ci[row][i]})}
            for i, name in enumerate(names)
        }
        out.append(b',"quantiles":' + orjson.dumps(block))
    return out


def _top_k_record(query: Any, window: Any, noisy: Any, index: np.ndarray, noise: Any, released_at_ms: int) -> tuple[bytes, bytes]:
    """One record listing the k groups with the most events among the released ones, best first.

    The candidates (at least one) are the public groups, or the groups the selection released, so
    choosing among them reveals nothing beyond what is already published.
    """
    top_k = query.plan.top_k
    counts = np.asarray(window.count, dtype=np.int64)[index]
    chosen = top_k.select(counts, noise)
    names = list(query.config.group_by)
    groups = [window.groups[i] for i in index[np.asarray(chosen, dtype=np.int64)].tolist()]
    key = ["top_k"]
    record = {
        "query": query.name,
        "kind": "top_k",
        # no group key holds null: this id never equals a group's
        "release_id": release_id(query.name, window.window_start_ms, (None, "top_k")),
        "window": {"start": iso_utc(window.window_start_ms), "end": iso_utc(window.window_end_ms),
                   "start_ms": window.window_start_ms, "end_ms": window.window_end_ms},
        **({} if getattr(window, "withheld", None) is None else {"as_if_empty": window.withheld}),
        "k": top_k.k,
        "top": [{"rank": rank, "group": dict(zip(names, group))} for rank, group in enumerate(groups, 1)],
        "candidates": int(len(index)),
        "privacy": _component_privacy(query, "permute_and_flip", top_k.loss, top_k_scale=top_k.scale),
        "released_at_ms": released_at_ms,
        "released_at": iso_utc(released_at_ms),
    }
    return orjson.dumps(key), orjson.dumps(record)
