"""The levels of a hierarchical query: each level noised with its share, then made consistent.

With ``group_by: [country, region, city]`` and ``hierarchy`` the public
groups (city level) are rolled up to (country, region) and (country); each
level's counts and sums get their own noise (``QueryPlan.levels``), and the
weighted least-squares estimate under "children sum to their parent"
(``stream_dp.dp.hierarchy``) replaces the noisy values. Consistency is
post-processing of released values: it costs no privacy. Consistent counts
are real numbers (a parent's count is the sum of its children's), not
rounded or clamped.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import numpy as np

from stream_dp.dp.accuracy import mean_with_ci
from stream_dp.dp.hierarchy import consistent_tree, rollup_levels
from stream_dp.worker.release_entry import ReleaseEntry, build_entry


@dataclass(frozen=True)
class _LevelWindow:
    window_start_ms: int
    window_end_ms: int
    groups: list[Any]


@lru_cache(maxsize=64)
def _levels(groups: tuple[Any, ...], depth: int) -> tuple[list[list[Any]], list[np.ndarray]]:
    """Per level (coarsest first) its group keys and the parent of each (computed once per public list)."""
    return rollup_levels(list(groups), depth)


def _up(values: np.ndarray, parents: list[np.ndarray], sizes: list[int]) -> list[np.ndarray]:
    """Leaf values summed to every level (coarsest first)."""
    out = [np.asarray(values, dtype=np.float64)]
    for level in range(len(sizes) - 1, 0, -1):
        out.insert(0, np.bincount(parents[level], weights=out[0], minlength=sizes[level - 1]))
    return out


def release_levels(query: Any, window: Any, finest: Any, noise: Any, released_at_ms: int) -> tuple[Any, list[ReleaseEntry]]:
    """The finest level's release made consistent, and one entry for each coarser level."""
    plan = query.plan
    depth = len(plan.levels)
    keys, parents = _levels(tuple(window.groups), depth)
    sizes = [len(k) for k in keys]
    counts = _up(window.count, parents, sizes)
    sums = _up(window.sum, parents, sizes) if window.sum is not None else None
    noisy = []
    for level, level_plan in enumerate(plan.levels[:-1]):
        noisy.append(level_plan.release(
            counts[level].astype(np.int64), None if sums is None else sums[level], None, noise))
    noisy.append(finest)
    described = [level_plan.describe() for level_plan in plan.levels]
    consistent_count = consistent_sum = None
    if finest.count is not None:
        # counts before clamping at 0 would be better inputs; the clamped ones keep the release's own values
        consistent_count = consistent_tree(
            [np.asarray(n.count, dtype=np.float64) for n in noisy], [n.count_std ** 2 for n in noisy], parents)
    if finest.sum is not None:
        consistent_sum = consistent_tree(
            [np.asarray(n.sum, dtype=np.float64) for n in noisy], [n.sum_std ** 2 for n in noisy], parents)
    out = []
    for level in range(depth):
        release = noisy[level]
        mean = mean_ci = None
        if release.mean is not None and consistent_count is not None and consistent_sum is not None:
            clip = plan.levels[level].clip
            accuracy = plan.levels[level]
            mean, mean_ci = mean_with_ci(
                consistent_count[level], consistent_sum[level],
                accuracy._count_accuracy.ci975, accuracy._sum_accuracy.ci975, clip)
        out.append(replace(
            release,
            count=None if consistent_count is None else consistent_count[level],
            sum=None if consistent_sum is None else consistent_sum[level],
            mean=mean if mean is not None else release.mean,
            mean_ci95=mean_ci if mean_ci is not None else release.mean_ci95,
        ))
    names = list(query.config.group_by)
    entries = []
    for level in range(depth - 1):
        privacy = {**query.privacy, "level_epsilon": plan.levels[level].loss.epsilon,
                   "count_scale": described[level]["count_scale"], "sum_scale": described[level]["sum_scale"]}
        entries.append(build_entry(
            query, _LevelWindow(window.window_start_ms, window.window_end_ms, keys[level]), out[level], released_at_ms,
            group_names=names[:level + 1], groups=keys[level], extra_prefix=b',"level":%d' % level, privacy=privacy,
        ))
    return out[-1], entries
