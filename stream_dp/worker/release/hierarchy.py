"""The levels of a hierarchical query: each level noised with its share, then made consistent.

With ``group_by: [country, region, city]`` and ``hierarchy`` the public
groups (city level) are rolled up to (country, region) and (country); each
level's counts and sums get their own noise (``QueryPlan.levels``), and the
weighted least-squares estimate under "children sum to their parent"
(``stream_dp.dp.hierarchy``) replaces the noisy values. Consistency is
post-processing of the levels' noisy values (the mechanisms' outputs): it
costs no privacy. Consistent counts are real numbers (a parent's count is the
sum of its children's), not rounded or clamped, and may be negative.

Consistency starts from each level's noisy counts as drawn, before the clamp
at 0 that a release without hierarchy applies (``NoisyRelease.count_unclamped``):
least squares is unbiased only from unbiased inputs. With many empty groups
the clamp raises most inputs, so a parent of empty children would come out far
above 0 (+225 for a country of 200 empty cities at noise scales 120, 120 and
60) and outside its ci95 nearly twice as often as stated. Sums are never
clamped.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import numpy as np

from stream_dp.dp.accuracy import mean_with_ci
from stream_dp.dp.hierarchy import Rollup, aggregate_to_levels, consistent_estimates, rollup_levels
from stream_dp.worker.release.entry import ReleaseEntry, build_entry


@dataclass(frozen=True)
class _LevelWindow:
    window_start_ms: int
    window_end_ms: int
    groups: list[Any]
    withheld: str | None = None  # the window's: a level released as if empty says so too


@lru_cache(maxsize=64)
def _levels(groups: tuple[Any, ...], depth: int) -> Rollup:
    """The rollup of a query's public groups (computed once per public list)."""
    return rollup_levels(list(groups), depth)


def _leaves(values: Any, rollup: Rollup, dtype: Any) -> np.ndarray:
    """Window-ordered values in the rollup's leaf order (public groups are distinct: one leaf each)."""
    out = np.zeros(len(rollup.keys[-1]), dtype=dtype)
    out[rollup.leaf_index] = np.asarray(values, dtype=dtype)
    return out


def _unclamped_counts(release: Any) -> np.ndarray:
    if release.count_unclamped is None:
        raise ValueError("a hierarchy level's release lacks its unclamped counts; nothing is released")
    return np.asarray(release.count_unclamped, dtype=np.float64)


def release_levels(query: Any, window: Any, finest: Any, noise: Any, released_at_ms: int) -> tuple[Any, list[ReleaseEntry]]:
    """The finest level's release made consistent, and one entry for each coarser level."""
    plan = query.plan
    depth = len(plan.levels)
    rollup = _levels(tuple(window.groups), depth)
    keys, parents = [list(k) for k in rollup.keys], list(rollup.parents)
    top = len(keys[0])
    counts = aggregate_to_levels(_leaves(window.count, rollup, np.int64), parents, top_size=top)
    sums = None if window.sum is None else aggregate_to_levels(_leaves(window.sum, rollup, np.float64), parents,
                                                               top_size=top)
    noisy = []
    for level, level_plan in enumerate(plan.levels[:-1]):
        noisy.append(level_plan.release(counts[level], None if sums is None else sums[level], None, noise))
    # the finest level was released in window order: put it in leaf order, and back at the end
    leaf = rollup.leaf_index
    noisy.append(replace(
        finest,
        count=None if finest.count is None else _leaves(finest.count, rollup, np.int64),
        count_unclamped=None if finest.count is None else _leaves(finest.count_unclamped, rollup, np.int64),
        sum=None if finest.sum is None else _leaves(finest.sum, rollup, np.float64),
    ))
    described = [level_plan.describe() for level_plan in plan.levels]
    consistent_count = consistent_sum = None
    if finest.count is not None:
        # from the draws before the clamp at 0 (module docstring)
        consistent_count = consistent_estimates(
            [_unclamped_counts(n) for n in noisy], [n.count_std ** 2 for n in noisy], parents)
    if finest.sum is not None:
        consistent_sum = consistent_estimates(
            [np.asarray(n.sum, dtype=np.float64) for n in noisy], [n.sum_std ** 2 for n in noisy], parents)
    out = []
    for level in range(depth):
        release = noisy[level]
        count = None if consistent_count is None else consistent_count[level]
        total = None if consistent_sum is None else consistent_sum[level]
        mean = mean_ci = None
        if release.mean is not None and count is not None and total is not None:
            accuracy = plan.levels[level]
            mean, mean_ci = mean_with_ci(count, total, accuracy._count_accuracy.ci975,
                                         accuracy._sum_accuracy.ci975, accuracy.clip)
        if level == depth - 1:  # back to window order
            count = None if count is None else count[leaf]
            total = None if total is None else total[leaf]
            mean = None if mean is None else mean[leaf]
            mean_ci = None if mean_ci is None else mean_ci[leaf]
        out.append(replace(release, count=count, sum=total, count_unclamped=None,
                           mean=mean if mean is not None else release.mean,
                           mean_ci95=mean_ci if mean_ci is not None else release.mean_ci95,
                           keep=finest.keep if level == depth - 1 else release.keep))
    names = list(query.config.group_by)
    entries = []
    for level in range(depth - 1):
        privacy = {**query.privacy, "level_epsilon": plan.levels[level].loss.epsilon,
                   "count_scale": described[level]["count_scale"], "sum_scale": described[level]["sum_scale"]}
        entries.append(build_entry(
            query, _LevelWindow(window.window_start_ms, window.window_end_ms, keys[level],
                                getattr(window, "withheld", None)), out[level], released_at_ms,
            group_names=names[:level + 1], groups=keys[level], extra_prefix=b',"level":%d' % level, privacy=privacy,
        ))
    return out[-1], entries
