"""Continual release of running totals over the windows of a period: the binary tree mechanism.

A period holds ``T`` windows ``t = 1..T``; after window ``t`` the running
total ``x_1 + ... + x_t`` of every (public) group is released. The binary
mechanism (Chan, Shi & Song, "Private and Continual Release of Statistics",
ACM TISSEC 2011, Algorithm 2; Dwork, Naor, Pitassi & Rothblum, "Differential
Privacy under Continual Observation", STOC 2010) keeps p-sums ``alpha_j`` of
dyadic intervals. At window ``t`` with ``i`` = trailing zeros of ``t``:

    alpha_i  = sum_{j<i} alpha_j + x_t,        alpha^_i = alpha_i + noise,

the lower p-sums are dropped, and the running total is the sum of the noisy
``alpha^_j`` over the set bits ``j`` of ``t``: it carries ``popcount(t)``
independent node noises, never more than ``depth = floor(log2 T) + 1``.

Privacy (user level, add/remove one unit with all its contributions). A unit
contributes to at most ``W = max_windows_per_unit`` windows of a period, each
bounded as in :mod:`stream_dp.dp.sensitivity` (``Delta_1 = L0 * Linf`` for
counts, ``L0 * Linf * max(|lo|, |hi|)`` for clipped sums). The nodes of one
level cover disjoint windows, so the unit changes at most ``W`` of them and
their concatenation by at most ``W * Delta_1`` in l1. Each level is therefore
calibrated by OpenDP as one Laplace release of sensitivity ``W * Delta_1`` at
``epsilon_component / depth``, and the ``depth`` levels compose to the
period loss ``depth x (per-level cost)`` (Dwork & Roth Theorem 3.16; the
zCDP statement composes per level, Bun & Steinke 2016 Lemma 2.3). Laplace
only: the tree's guarantee here is pure DP.

Sum nodes are rounded to the float grid ``2^k`` before noising, which can
widen the distance between neighbours by ``2^k`` per coordinate that differs.
Every coordinate is rounded and noised on its own, so coordinates where the
neighbours agree have the same output law and cost nothing: a level is
certified as OpenDP's measurement on the coordinates the unit can change,
``W * min(L0, max_groups)`` of them (at most ``min(L0, groups)`` in each of
its ``W`` nodes), not on every group of every node.

The budget is split between count and sum as in :mod:`stream_dp.dp.plan`
(equal shares by default); a mean is post-processing. Accuracy of a total of
``p`` node noises: :mod:`stream_dp.dp.laplace_sums`.

The state between windows holds the *true* p-sums: it is as private as the
raw window aggregates and must be stored like them, never published.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
from numpy.typing import NDArray

from stream_dp.dp.accuracy import mean_with_ci, noise_std
from stream_dp.dp.bounds import ClipRange, ContributionBounds
from stream_dp.dp.calibration import CalibratedNoise, calibrate_counts, calibrate_sums, resolve_budget_split
from stream_dp.dp.inputs import as_counts, as_sums
from stream_dp.dp.laplace_sums import count_total_accuracy, sum_total_accuracy
from stream_dp.dp.loss import PrivacyLoss
from stream_dp.dp.noise import NoiseSource
from stream_dp.dp.plan_budgets import CALIBRATION_MARGIN, needed_components, positive_finite
from stream_dp.dp.release import ReleaseAccuracy
from stream_dp.dp.sensitivity import count_sensitivity, sum_sensitivity
from stream_dp.dp.tree_state import TreeState, max_popcount, positive_int, saturating_total, set_bits, tree_depth

__all__ = ["ContinualPlan", "ContinualRelease", "TreeState", "max_popcount", "tree_depth"]

_OPENDP_MAX_SIZE = (1 << 31) - 1


def _changed_coordinates(per_unit: int, bounds: ContributionBounds, max_groups: int) -> int:
    """How many sums of one level one unit can change (module docstring); OpenDP sizes are 32-bit."""
    size = per_unit * min(bounds.max_groups_per_unit, max_groups)
    if size > _OPENDP_MAX_SIZE:
        raise ValueError(
            f"max_windows_per_unit x min(max_groups_per_unit, max_groups) = {size} exceeds {_OPENDP_MAX_SIZE}, "
            "the largest vector OpenDP certifies; lower max_windows_per_unit or max_groups_per_unit"
        )
    return size


@dataclass(frozen=True, slots=True, eq=False)  # arrays have no single truth value: compare fields
class ContinualRelease:
    """The noisy running totals after window ``t`` of a period, one entry per group.

    ``count`` is clamped at 0 and ``mean`` clamped into the clip range
    (post-processing). Standard deviations and 95% half-widths ``h``
    (``[value - h, value + h]``) depend only on ``popcount(t)``, the number of
    node noises in the totals. ``loss`` is what the whole period costs a unit.
    """

    t: int
    popcount: int
    count: NDArray[np.int64] | None
    sum: NDArray[np.float64] | None
    mean: NDArray[np.float64] | None
    count_std: float | None
    sum_std: float | None
    count_ci95: float | None
    sum_ci95: float | None
    mean_ci95: NDArray[np.float64] | None
    loss: PrivacyLoss


@dataclass(frozen=True, slots=True)
class ContinualPlan:
    """Running counts, sums and means over a period by the binary tree mechanism. Use :meth:`build`."""

    windows_per_period: int
    max_windows_per_unit: int
    depth: int
    bounds: ContributionBounds
    clip: ClipRange | None
    aggregations: frozenset[str]
    budget_split: Mapping[str, float]
    component_epsilon: Mapping[str, float]
    max_groups: int
    count_noise: CalibratedNoise | None
    sum_noise: CalibratedNoise | None
    level_loss: PrivacyLoss
    loss: PrivacyLoss
    requested_epsilon: float
    # index p - 1 holds the accuracy of a total of p node noises, p = 1..max_popcount(T)
    _count_accuracy: tuple[ReleaseAccuracy, ...]
    _sum_accuracy: tuple[ReleaseAccuracy, ...]

    @classmethod
    def build(
        cls,
        *,
        epsilon: float,
        bounds: ContributionBounds,
        clip: ClipRange | None = None,
        aggregations: Iterable[str] = frozenset({"count"}),
        windows_per_period: int,
        max_windows_per_unit: int,
        max_groups: int = 1_000_000,
        mechanism: str = "laplace",
        budget_split: Mapping[str, float] | None = None,
    ) -> ContinualPlan:
        """Validate the query and calibrate the node noise of every level.

        :param epsilon: budget of one unit for the whole period (all its windows).
        :param bounds: per-window contribution bounds the worker enforces.
        :param clip: clip range of summed values; required for ``sum`` and ``mean``.
        :param aggregations: subset of ``{"count", "sum", "mean"}``.
        :param windows_per_period: ``T``, the windows of one period.
        :param max_windows_per_unit: ``W``, the most windows of a period one unit contributes to.
        :param max_groups: most groups per window (certifies float rounding of sums).
        :param mechanism: only ``"laplace"``.
        :param budget_split: optional weights for ``count`` and ``sum``.
        """
        if mechanism != "laplace":
            raise ValueError(
                f"continual releases use the binary tree mechanism with Laplace noise (pure DP), got "
                f"mechanism={mechanism!r}; pass mechanism='laplace'"
            )
        total = positive_finite("epsilon", epsilon, "pass the budget of one unit for the whole period, e.g. epsilon=1.0")
        if not isinstance(bounds, ContributionBounds):
            raise TypeError("bounds must be ContributionBounds(max_groups_per_unit=..., max_events_per_group=...)")
        if clip is not None and not isinstance(clip, ClipRange):
            raise TypeError("clip must be ClipRange(lo, hi) or None for count-only queries")
        periods = positive_int("windows_per_period", windows_per_period,
                                "a period holds at least one window, e.g. windows_per_period=1440")
        per_unit = positive_int("max_windows_per_unit", max_windows_per_unit,
                                 "a unit contributes to at least one window; e.g. max_windows_per_unit=1")
        if per_unit > periods:
            raise ValueError(
                f"max_windows_per_unit={per_unit} exceeds the {periods} windows of a period; "
                f"lower it to at most windows_per_period={periods}"
            )
        groups = positive_int("max_groups", max_groups, "e.g. max_groups=1_000_000")
        chosen, needs_count, needs_sum = needed_components(aggregations, clip)
        components = tuple(c for c, wanted in (("count", needs_count), ("sum", needs_sum)) if wanted)
        shares = resolve_budget_split(components, budget_split)
        budgets = {c: total * CALIBRATION_MARGIN * shares[c] for c in components}
        depth = tree_depth(periods)

        count_noise = sum_noise = None
        if needs_count:
            count_noise = calibrate_counts("laplace", budgets["count"] / depth, per_unit * count_sensitivity(bounds).l1)
        if needs_sum:
            assert clip is not None
            sum_noise = calibrate_sums("laplace", budgets["sum"] / depth, per_unit * sum_sensitivity(bounds, clip).l1,
                                       max_groups=_changed_coordinates(per_unit, bounds, groups))
        level_loss = PrivacyLoss.pure(sum(n.cost for n in (count_noise, sum_noise) if n is not None))
        loss = level_loss * depth
        if loss.epsilon > total:
            raise RuntimeError(
                f"the certified period loss {loss} exceeds the requested epsilon={total}; nothing is released"
            )
        popcounts = range(1, max_popcount(periods) + 1)
        return cls(
            windows_per_period=periods,
            max_windows_per_unit=per_unit,
            depth=depth,
            bounds=bounds,
            clip=clip,
            aggregations=chosen,
            budget_split=MappingProxyType(shares),
            component_epsilon=MappingProxyType(budgets),
            max_groups=groups,
            count_noise=count_noise,
            sum_noise=sum_noise,
            level_loss=level_loss,
            loss=loss,
            requested_epsilon=total,
            _count_accuracy=tuple(count_total_accuracy(count_noise, p) for p in popcounts) if count_noise else (),
            _sum_accuracy=tuple(sum_total_accuracy(sum_noise, p) for p in popcounts) if sum_noise else (),
        )

    def step(
        self,
        state: TreeState | None,
        t: int,
        counts: NDArray[np.int64],
        sums: NDArray[np.float64] | None,
        noise: NoiseSource,
    ) -> tuple[ContinualRelease, TreeState]:
        """Release the running totals after window ``t`` from that window's per-group aggregates.

        :param state: the state returned by the step of window ``t - 1``
            (``None`` for ``t = 1``).
        :returns: the release and the state to pass to window ``t + 1``.

        Fails closed: bad inputs raise ``ValueError`` before any noise is drawn.
        Noise is drawn once for the count node, then once for the sum node, so
        the same draws give the same releases whether or not the state went
        through :meth:`TreeState.to_columns` in between.
        """
        previous = state if state is not None else TreeState.initial()
        if not isinstance(previous, TreeState):
            raise TypeError(
                f"state must be the TreeState returned by the previous step (or None for t=1), got {state!r}"
            )
        t = self._check_t(previous, t)
        counts = as_counts(counts)
        if counts.size > self.max_groups:
            raise ValueError(
                f"the window has {counts.size} groups but the plan is certified for max_groups={self.max_groups}; "
                "nothing is released. Rebuild the plan with a larger max_groups"
            )
        if previous.t > 0:
            if counts.size != previous.n_groups:
                raise ValueError(
                    f"window {t} has {counts.size} groups but the period started with {previous.n_groups}; the groups "
                    "of a period are public and fixed: pass one entry per group of the period, in the same order"
                )
            previous.check_components(self.count_noise is not None, self.sum_noise is not None)
        clipped = None
        if self.sum_noise is not None:
            assert self.clip is not None
            clipped = as_sums(sums, counts, self.clip)

        level = (t & -t).bit_length() - 1
        lower = range(level)  # the set bits of t - 1 below `level`: all of them
        count_true = count_noisy = sum_true = sum_noisy = None
        if self.count_noise is not None:
            node = counts + sum((previous.count_true[j] for j in lower), np.zeros(counts.size, dtype=np.int64))
            count_true = TreeState.with_level(previous.count_true, level, node)
            count_noisy = TreeState.with_level(previous.count_noisy, level, self.count_noise.apply(node, noise))
        if self.sum_noise is not None:
            assert clipped is not None
            node_sum = clipped + sum((previous.sum_true[j] for j in lower), np.zeros(counts.size))
            sum_true = TreeState.with_level(previous.sum_true, level, node_sum)
            sum_noisy = TreeState.with_level(previous.sum_noisy, level, self._noised_sums(node_sum, noise))
        state = TreeState(t, counts.size, count_true, count_noisy, sum_true, sum_noisy)
        return self._release(state), state

    def _noised_sums(self, values: NDArray[np.float64], noise: NoiseSource) -> NDArray[np.float64]:
        # not CalibratedNoise.apply: its max_groups counts the coordinates one unit can change
        # (module docstring), which a window may well exceed; the window size is checked against
        # the plan's max_groups in step()
        assert self.sum_noise is not None and self.sum_noise.float_grid_k is not None
        return noise.floats(values, kind="laplace", scale=self.sum_noise.scale, k=self.sum_noise.float_grid_k)

    def _check_t(self, previous: TreeState, t: object) -> int:
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise TypeError(
                f"t must be the int index of the window in its period (1..{self.windows_per_period}), got {t!r}"
            )
        if not 1 <= t <= self.windows_per_period:
            raise ValueError(
                f"t={t} is outside the period's windows 1..{self.windows_per_period}; a new period starts "
                "again at t=1 with state=None"
            )
        if t != previous.t + 1:
            raise ValueError(
                f"t={t} does not follow the state of window {previous.t}: windows are released in order, so pass "
                f"t={previous.t + 1}, or the state returned for window {t - 1} "
                "(restore it with TreeState.from_columns after a restart)"
            )
        return int(t)

    def _release(self, state: TreeState) -> ContinualRelease:
        levels = set_bits(state.t)  # ascending, so float totals are summed in one fixed order
        p = len(levels)
        count = total = mean = mean_ci = None
        if state.count_noisy is not None:
            running = saturating_total([state.count_noisy[j] for j in levels], state.n_groups)
            count = np.maximum(running, 0)  # clamping is post-processing
        if state.sum_noisy is not None:
            total = sum((state.sum_noisy[j] for j in levels), np.zeros(state.n_groups))
        ca, sa = self._accuracies(p)
        if "mean" in self.aggregations:
            assert count is not None and total is not None and self.clip is not None
            assert ca is not None and sa is not None
            mean, mean_ci = mean_with_ci(count, total, ca.ci975, sa.ci975, self.clip)
        return ContinualRelease(
            t=state.t, popcount=p, count=count, sum=total, mean=mean,
            count_std=None if ca is None else ca.std, sum_std=None if sa is None else sa.std,
            count_ci95=None if ca is None else ca.ci95, sum_ci95=None if sa is None else sa.ci95,
            mean_ci95=mean_ci, loss=self.loss,
        )

    def _accuracies(self, p: int) -> tuple[ReleaseAccuracy | None, ReleaseAccuracy | None]:
        return (self._count_accuracy[p - 1] if self._count_accuracy else None,
                self._sum_accuracy[p - 1] if self._sum_accuracy else None)

    def accuracy(self, popcount: int) -> dict[str, float | None]:
        """Std and 95% half-widths of running totals made of ``popcount`` node noises."""
        if not 1 <= popcount <= max_popcount(self.windows_per_period):
            raise ValueError(f"popcount must be in 1..{max_popcount(self.windows_per_period)}, got {popcount}")
        ca, sa = self._accuracies(popcount)
        return {"count_std": None if ca is None else ca.std, "count_ci95": None if ca is None else ca.ci95,
                "sum_std": None if sa is None else sa.std, "sum_ci95": None if sa is None else sa.ci95}

    def error_table(self, ts: Iterable[int] = (1, 10, 100, 1000)) -> list[dict[str, Any]]:
        """The tree's error at window ``t`` next to naive per-window summation with the same period budget.

        Tree: ``popcount(t)`` node noises at ``t``, and the worst case
        ``max_popcount(t)`` over windows ``1..t``. Naive: every window released
        on its own with Laplace scale ``W * Delta_1 / epsilon_component`` (the
        unit's ``W`` windows share the component's period budget), so the
        running total at ``t`` carries ``t`` noises: std ``sqrt(t)`` times one
        noise's (discrete Laplace for counts, ``sqrt(2) scale`` for sums).
        Windows beyond the period are reported as not applicable.
        """
        rows: list[dict[str, Any]] = []
        for t in ts:
            t = positive_int("t", t, "ask for windows 1, 2, ... of the period")
            if t > self.windows_per_period:
                rows.append({"t": t, "applicable": False,
                             "reason": f"the period has {self.windows_per_period} windows"})
                continue
            p, worst = t.bit_count(), max_popcount(t)
            row: dict[str, Any] = {"t": t, "applicable": True, "popcount": p, "worst_popcount": worst}
            for name, table in (("count", self._count_accuracy), ("sum", self._sum_accuracy)):
                if not table:
                    row[name] = None
                    continue
                naive_scale = self.max_windows_per_unit * self._delta_1(name) / self.component_epsilon[name]
                one = noise_std("laplace", naive_scale) if name == "count" else math.sqrt(2.0) * naive_scale
                row[name] = {"tree_std": table[p - 1].std, "tree_ci95": table[p - 1].ci95,
                             "tree_worst_std": table[worst - 1].std, "tree_worst_ci95": table[worst - 1].ci95,
                             "naive_scale": naive_scale, "naive_std": math.sqrt(t) * one}
            rows.append(row)
        return rows

    def _delta_1(self, component: str) -> float:
        if component == "count":
            return count_sensitivity(self.bounds).l1
        assert self.clip is not None
        return sum_sensitivity(self.bounds, self.clip).l1

    def describe(self) -> dict[str, Any]:
        """JSON-serialisable statement of what a period of this plan spends and how."""
        return {
            "mechanism": "binary_tree",
            "noise": "laplace",
            "windows_per_period": self.windows_per_period,
            "max_windows_per_unit": self.max_windows_per_unit,
            "depth": self.depth,
            "per_level": self.level_loss.to_dict(),
            "period": self.loss.to_dict(),
            "requested": {"epsilon": self.requested_epsilon},
            "bounds": {"max_groups_per_unit": self.bounds.max_groups_per_unit,
                       "max_events_per_group": self.bounds.max_events_per_group},
            "clip": None if self.clip is None else {"lo": self.clip.lo, "hi": self.clip.hi},
            "aggregations": sorted(self.aggregations),
            "budget_split": {c: {"share": share, "epsilon": self.component_epsilon[c]}
                             for c, share in self.budget_split.items()},
            "max_groups": self.max_groups,
            "count_scale": None if self.count_noise is None else self.count_noise.scale,
            "sum_scale": None if self.sum_noise is None else self.sum_noise.scale,
            # the sum node's "max_groups": sums of one level one unit can change, W * min(L0, max_groups)
            "sum_certified_coordinates": None if self.sum_noise is None else self.sum_noise.max_groups,
            "count_node": None if self.count_noise is None else self.count_noise.describe(),
            "sum_node": None if self.sum_noise is None else self.sum_noise.describe(),
        }
