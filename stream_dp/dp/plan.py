"""One query's release plan: budget split, calibration, and the release itself.

:meth:`ReleasePlan.build` does all calibration up front (and rejects bad
parameters there, saying how to fix them); :meth:`ReleasePlan.release` only
checks the vectors, draws noise and post-processes.

Budget split (per window release, per privacy unit): the query's components
are ``selection`` (partition selection, when group keys are not public),
``count`` (needed by ``count`` and ``mean``) and ``sum`` (needed by ``sum``
and ``mean``); a mean is post-processing of the noisy sum and count and costs
nothing more. By default each component gets an equal share.

* ``laplace``: shares of ``epsilon``; the release is ``(epsilon,
  selection_delta)``-DP, and ``epsilon``-DP (so ``epsilon^2/2``-zCDP) without
  selection.
* ``gaussian``: ``selection`` takes its share of ``epsilon``; the rest,
  ``(epsilon_rest, delta)``, is converted to the largest ``rho`` that fits
  (Canonne, Kamath & Steinke 2020, Cor. 13) and ``rho`` is split between
  ``count`` and ``sum`` in proportion to their shares. With ``rho=`` given
  instead of ``epsilon``, ``rho`` is split directly and ``delta`` only states
  the ``(epsilon, delta)`` equivalent.

Sequential composition of the components: Dwork & Roth Theorem 3.16 (DP) and
Bun & Steinke 2016 Lemma 2.3 (zCDP).
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
from numpy.typing import NDArray

from stream_dp.dp.accuracy import mean_with_ci
from stream_dp.dp.bounds import ClipRange, ContributionBounds
from stream_dp.dp.calibration import CalibratedNoise, calibrate_counts, calibrate_sums, resolve_budget_split
from stream_dp.dp.inputs import as_counts, as_distinct_units, as_sums
from stream_dp.dp.loss import PrivacyLoss
from stream_dp.dp.measurements import NoiseKind
from stream_dp.dp.noise import NoiseSource
from stream_dp.dp.plan_budgets import (
    AGGREGATIONS,
    CALIBRATION_MARGIN,
    check_within_request,
    gaussian_budgets,
    laplace_budgets,
    needed_components,
    positive_finite,
)
from stream_dp.dp.release import NoisyRelease, ReleaseAccuracy, scatter, take
from stream_dp.dp.selection import PartitionSelection
from stream_dp.dp.sensitivity import count_sensitivity, sum_sensitivity
from stream_dp.dp.staircase import CalibratedStaircase, calibrate_staircase_counts, calibrate_staircase_sums

__all__ = ["AGGREGATIONS", "MECHANISMS", "Noise", "ReleasePlan"]

MECHANISMS = ("laplace", "gaussian", "staircase", "geometric")
"""``geometric`` names the discrete Laplace that ``laplace`` already uses for counts (an alias)."""
Noise = CalibratedNoise | CalibratedStaircase



@dataclass(frozen=True, slots=True)
class ReleasePlan:
    """Everything needed to release one query's window aggregates. Use :meth:`build`."""

    mechanism: str
    bounds: ContributionBounds
    clip: ClipRange | None
    aggregations: frozenset[str]
    budget_split: Mapping[str, float]
    count_noise: Noise | None
    sum_noise: Noise | None
    selection: PartitionSelection | None
    loss: PrivacyLoss
    requested: Mapping[str, float | None]
    _count_accuracy: ReleaseAccuracy | None
    _sum_accuracy: ReleaseAccuracy | None

    @classmethod
    def build(
        cls,
        *,
        mechanism: str,
        epsilon: float | None = None,
        delta: float = 0.0,
        rho: float | None = None,
        bounds: ContributionBounds,
        clip: ClipRange | None = None,
        aggregations: Iterable[str] = frozenset({"count"}),
        selection_delta: float | None = None,
        budget_split: Mapping[str, float] | None = None,
        max_groups: int = 1_000_000,
        float_grid_k: int | None = None,
    ) -> ReleasePlan:
        """Validate the query and calibrate every noise scale.

        :param mechanism: ``"laplace"`` (pure DP; ``"geometric"`` is the same), ``"staircase"``
            (pure DP, :mod:`stream_dp.dp.staircase`) or ``"gaussian"`` (zCDP).
        :param epsilon: total per-window budget of one unit, selection included.
        :param delta: ``gaussian`` only: the delta of the noise (0 < delta < 1).
        :param rho: ``gaussian`` only, instead of ``epsilon``: the zCDP budget of the noise.
        :param bounds: per-unit contribution bounds the worker enforces.
        :param clip: clip range of summed values; required for ``sum`` and ``mean``.
        :param aggregations: subset of ``{"count", "sum", "mean"}``.
        :param selection_delta: ``None`` for public group keys; else the delta of
            partition selection, added to the release's delta.
        :param budget_split: optional weights per component (module docstring).
        :param max_groups: most sums one unit can change (certifies float rounding; at least max_groups_per_unit).
        :param float_grid_k: grid exponent for float noise; ``None`` chooses it.
        """
        if mechanism not in MECHANISMS:
            raise ValueError(f"mechanism must be one of {', '.join(MECHANISMS)}, got {mechanism!r}")
        if mechanism == "geometric":
            mechanism = "laplace"
        kind: NoiseKind = "gaussian" if mechanism == "gaussian" else "laplace"  # staircase: pure DP budgets
        if not isinstance(bounds, ContributionBounds):
            raise TypeError("bounds must be ContributionBounds(max_groups_per_unit=..., max_events_per_group=...)")
        if clip is not None and not isinstance(clip, ClipRange):
            raise TypeError("clip must be ClipRange(lo, hi) or None for count-only queries")
        chosen, needs_count, needs_sum = needed_components(aggregations, clip)
        if selection_delta is not None:
            selection_delta = positive_finite(
                "selection_delta", selection_delta, "pass e.g. 1e-6, or None for public group keys"
            )
        components = tuple(
            name for name, wanted in (("selection", selection_delta is not None),
                                      ("count", needs_count), ("sum", needs_sum)) if wanted
        )
        shares = resolve_budget_split(components, budget_split)
        noise_shares = {c: shares[c] for c in ("count", "sum") if c in shares}
        if kind == "laplace":
            epsilon, noise_budget = laplace_budgets(epsilon, delta, rho, noise_shares)
        else:
            epsilon, delta, noise_budget = gaussian_budgets(epsilon, delta, rho, selection_delta, noise_shares)

        selection: PartitionSelection | None = None
        if selection_delta is not None:
            assert epsilon is not None  # guaranteed above: selection is refused with rho
            selection = PartitionSelection.calibrate(
                epsilon=epsilon * CALIBRATION_MARGIN * shares["selection"], delta=selection_delta, bounds=bounds
            )
        count_noise: Noise | None = None
        sum_noise: Noise | None = None
        if mechanism == "staircase" and needs_count:
            count_noise = calibrate_staircase_counts(
                noise_budget["count"], max_groups_per_unit=bounds.max_groups_per_unit,
                max_events_per_group=bounds.max_events_per_group,
            )
        elif needs_count:
            sensitivity = count_sensitivity(bounds)
            count_noise = calibrate_counts(
                kind, noise_budget["count"], sensitivity.l1 if kind == "laplace" else sensitivity.l2
            )
        if mechanism == "staircase" and needs_sum:
            assert clip is not None
            sum_noise = calibrate_staircase_sums(
                noise_budget["sum"], max_groups_per_unit=bounds.max_groups_per_unit,
                per_group_sensitivity=sum_sensitivity(bounds, clip).linf,
            )
        elif needs_sum:
            assert clip is not None
            sensitivity = sum_sensitivity(bounds, clip)
            sum_noise = calibrate_sums(
                kind,
                noise_budget["sum"],
                sensitivity.l1 if kind == "laplace" else sensitivity.l2,
                max_groups=max_groups,
                k=float_grid_k,
            )
            if bounds.max_groups_per_unit > max_groups:
                raise ValueError(f"max_groups={max_groups} certifies fewer sums than the {bounds.max_groups_per_unit} "
                                 "one unit may change (max_groups_per_unit); raise max_groups")
        noise_cost = sum(n.cost for n in (count_noise, sum_noise) if n is not None)
        loss = PrivacyLoss.pure(noise_cost) if kind == "laplace" else PrivacyLoss.from_zcdp(noise_cost, delta)
        if selection is not None:
            loss = loss + selection.loss
        check_within_request(loss, epsilon, rho, delta, selection_delta)
        return cls(
            mechanism=mechanism,
            bounds=bounds,
            clip=clip,
            aggregations=chosen,
            budget_split=MappingProxyType(shares),
            count_noise=count_noise,
            sum_noise=sum_noise,
            selection=selection,
            loss=loss,
            requested=MappingProxyType({"epsilon": epsilon, "delta": float(delta),
                                        "rho": None if rho is None else float(rho),
                                        "selection_delta": selection_delta}),
            _count_accuracy=None if count_noise is None else ReleaseAccuracy.of(count_noise),
            _sum_accuracy=None if sum_noise is None else ReleaseAccuracy.of(sum_noise),
        )

    def release(
        self,
        counts: NDArray[np.int64],
        sums: NDArray[np.float64] | None,
        distinct_units: NDArray[np.int64] | None,
        noise: NoiseSource,
    ) -> NoisyRelease:
        """Noise one window's per-group aggregates (vectors aligned by group).

        Fails closed: inconsistent inputs raise ``ValueError`` before any noise is drawn.
        """
        counts = as_counts(counts)
        distinct = None
        if distinct_units is not None or self.selection is not None:
            if distinct_units is None:
                raise ValueError("this plan selects groups (selection_delta is set): pass distinct_units per group")
            distinct = as_distinct_units(distinct_units, counts, self.bounds)
        clipped_sums = None
        if self.sum_noise is not None:
            assert self.clip is not None
            clipped_sums = as_sums(sums, counts, self.clip)

        if self.selection is not None:
            assert distinct is not None
            keep = self.selection.select(distinct, noise)
        else:
            keep = np.ones(counts.size, dtype=np.bool_)
        # only the kept groups are noised; the others keep placeholders
        kept = None if self.selection is None else np.flatnonzero(keep)

        count = total = mean = mean_ci = unclamped = None
        if self.count_noise is not None:
            # integer noise; clamping at 0 is post-processing (a hierarchy's least squares needs the draw before it)
            unclamped = self.count_noise.apply(take(counts, kept), noise)
            count = np.maximum(unclamped, 0)
        if self.sum_noise is not None:
            assert clipped_sums is not None
            # one unit changes at most max_groups_per_unit sums: the float noise's certificate covers that
            # many coordinates, however many groups the window has
            total = self.sum_noise.apply(take(clipped_sums, kept), noise, changed=self.bounds.max_groups_per_unit)
        if "mean" in self.aggregations:
            assert count is not None and total is not None and self.clip is not None
            assert self._count_accuracy is not None and self._sum_accuracy is not None
            mean, mean_ci = mean_with_ci(
                count, total, self._count_accuracy.ci975, self._sum_accuracy.ci975, self.clip
            )
        ca, sa = self._count_accuracy, self._sum_accuracy
        return NoisyRelease(
            keep=keep,
            count=scatter(count, kept, keep.size, 0),
            sum=scatter(total, kept, keep.size, np.nan),
            mean=scatter(mean, kept, keep.size, np.nan),
            count_std=None if ca is None else ca.std,
            sum_std=None if sa is None else sa.std,
            count_ci95=None if ca is None else ca.ci95,
            sum_ci95=None if sa is None else sa.ci95,
            mean_ci95=scatter(mean_ci, kept, keep.size, np.nan),
            loss=self.loss,
            count_unclamped=scatter(unclamped, kept, keep.size, 0),
        )

    def accuracy_at(self, count: int) -> dict[str, float | None]:
        """95% half-widths at an example true count (for planning).

        ``mean_ci95`` is the largest half-width over true means in ``[lo, hi]``
        with noisy values at their expectations. ``keep_probability`` is the
        chance a group is released when each of its ``count`` events comes from
        a different unit (1.0 for public groups).
        """
        if isinstance(count, bool) or not isinstance(count, numbers.Integral) or count < 0:
            raise ValueError(f"count must be a non-negative int, got {count!r}")
        ca, sa = self._count_accuracy, self._sum_accuracy
        result: dict[str, float | None] = {
            "count": float(count),
            "count_std": None if ca is None else ca.std,
            "count_ci95": None if ca is None else ca.ci95,
            "sum_std": None if sa is None else sa.std,
            "sum_ci95": None if sa is None else sa.ci95,
            "mean_ci95": None,
            "keep_probability": 1.0 if self.selection is None else self.selection.keep_probability(count),
        }
        if "mean" in self.aggregations and ca is not None and sa is not None and self.clip is not None:
            true_means = np.linspace(self.clip.lo, self.clip.hi, 101)
            counts = np.full(true_means.size, count, dtype=np.int64)
            _, half_widths = mean_with_ci(counts, true_means * count, ca.ci975, sa.ci975, self.clip)
            result["mean_ci95"] = float(half_widths.max())
        return result

    def mean_ci95_at(self, count: int, mean: float) -> float:
        """The 95% half-width released beside a mean at a true ``count`` and true ``mean``, with the noisy
        count and sum at their expectations (for planning: ``plan`` sets it beside an expected value)."""
        ca, sa = self._count_accuracy, self._sum_accuracy
        if "mean" not in self.aggregations or ca is None or sa is None or self.clip is None:
            raise ValueError("this plan releases no mean")
        _, half_width = mean_with_ci(np.array([count], dtype=np.int64), np.array([mean * count], dtype=np.float64),
                                     ca.ci975, sa.ci975, self.clip)
        return float(half_width[0])

    def describe(self) -> dict[str, Any]:
        """JSON-serialisable statement of what every release of this plan spends and how."""
        cost_name = "rho" if self.mechanism == "gaussian" else "epsilon"
        split: dict[str, dict[str, float | None]] = {}
        for component, share in self.budget_split.items():
            if component == "selection":
                assert self.selection is not None
                split[component] = {"share": share, "epsilon": self.selection.loss.epsilon,
                                    "delta": self.selection.loss.delta}
            else:
                calibrated = self.count_noise if component == "count" else self.sum_noise
                assert calibrated is not None
                split[component] = {"share": share, cost_name: calibrated.cost}
        sum_noise = self.sum_noise
        return {
            "mechanism": self.mechanism,
            **self.loss.to_dict(),
            "requested": dict(self.requested),
            "bounds": {
                "max_groups_per_unit": self.bounds.max_groups_per_unit,
                "max_events_per_group": self.bounds.max_events_per_group,
            },
            "clip": None if self.clip is None else {"lo": self.clip.lo, "hi": self.clip.hi},
            "aggregations": sorted(self.aggregations),
            "count_scale": None if self.count_noise is None else self.count_noise.scale,
            "sum_scale": None if sum_noise is None else sum_noise.scale,
            "selection_threshold": None if self.selection is None else self.selection.threshold,
            "float_grid_k": None if sum_noise is None else sum_noise.float_grid_k,
            f"float_rounding_{cost_name}": None if sum_noise is None else sum_noise.rounding_cost,
            "budget_split": split,
            "count": None if self.count_noise is None else self.count_noise.describe(),
            "sum": None if sum_noise is None else sum_noise.describe(),
            "selection": None if self.selection is None else self.selection.describe(),
        }
