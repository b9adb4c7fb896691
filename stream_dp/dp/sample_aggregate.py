"""Sample-and-aggregate (Nissim, Raskhodnikova & Smith 2007): any statistic, made private by blocks.

Units are split into ``blocks`` disjoint blocks by a keyed hash of their id
(``block_of``), the same on every partition and worker. Per group and window,
a user-supplied function computes its statistic on each block's values alone;
each output is clipped into ``output_range = [lo, hi]`` (a block whose
function fails counts as the range's midpoint, a value that does not depend
on the data), and the release is the noisy sum of the ``blocks`` outputs over
``blocks``: a DP mean of the block statistics (``aggregate: mean``), or
their DP median (``aggregate: median``): the exponential mechanism over the
``bins + 1`` edges of ``[lo, hi]`` (``stream_dp.dp.quantiles``), which one
block's wild output cannot drag as it drags a mean.

Sensitivity: a unit lies in one block, and it touches at most ``L0`` =
``max_groups_per_unit`` groups, so adding or removing it changes at most one
block output per group -- anywhere within ``[lo, hi]``, whatever the function
does -- and the vector of per-group sums by at most ``L0 (hi - lo)`` in l1 and
``sqrt(L0) (hi - lo)`` in l2. The function may be randomized: the other
blocks' outputs keep their distribution, and the bound holds for every
value of the changed block's. Laplace noise of ``Delta_1 / epsilon`` (or
Gaussian of ``Delta_2 / sqrt(2 rho)``) on the sums, certified by OpenDP. Each
group's sum is rounded to the float grid and noised on its own, so the groups a
unit does not touch cost nothing: the certificate for ``max_groups`` groups
covers a window of any number of groups as long as ``L0 <= max_groups``.

The median sees the ``blocks`` outputs of a group as its values, their number
fixed: a unit replaces one of them, i.e. removes one value and adds one, so
the quantile plan is calibrated to ``L0`` groups and ``Linf = 2`` values per
group (for q = 1/2 a replacement moves each score by at most 2, as two
additions would). With ``n = blocks`` known exactly, ``q_interval`` needs no
noisy count: ``1/2 +- rank_error / blocks``.

Pure maths and bookkeeping; running the function is the worker's sandbox's job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from stream_dp.dp.bounds import ContributionBounds
from stream_dp.dp.calibration import CalibratedNoise, calibrate_sums, smallest_sum_sensitivity
from stream_dp.dp.histogram import HistogramSpec, SparseHistogram
from stream_dp.dp.loss import PrivacyLoss
from stream_dp.dp.measurements import NoiseKind
from stream_dp.dp.noise import NoiseSource
from stream_dp.dp.quantiles import QuantilesPlan, statement_beta

MAX_BLOCKS = 10_000
AGGREGATES = ("mean", "median")
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def block_of(unit_hash: NDArray[np.uint64], blocks: int) -> NDArray[np.int32]:
    """The block of each unit, from its keyed 64-bit hash: ``((h * golden) >> 32) mod blocks``.

    The multiply mixes the bits that the canonical unit order (by hash) leaves correlated with
    position; the hash is keyed with the contribution secret, so no unit can pick its block.
    """
    mixed = (np.asarray(unit_hash, dtype=np.uint64) * _GOLDEN) >> np.uint64(32)
    return (mixed % np.uint64(blocks)).astype(np.int32)


def parse_function_path(path: str) -> tuple[str, str]:
    """``"package.module:function"`` as (module, attribute); raises ``ValueError`` saying what is expected."""
    module, sep, attribute = str(path).partition(":")
    if not sep or not module or not attribute or not all(
        part.isidentifier() for part in (*module.split("."), *attribute.split("."))
    ):
        raise ValueError(
            f"function {path!r} is not an import path; write it as package.module:function, e.g. statistics:median"
        )
    return module, attribute



def check_output_range(lo: float, hi: float) -> tuple[float, float]:
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError(
            f"output_range [{lo}, {hi}] must be two finite numbers with lo < hi: the range the statistic's "
            "values are clipped into, e.g. [0, 100] for a median of values in that range"
        )
    if not math.isfinite(hi - lo):
        raise ValueError(f"output_range [{lo:g}, {hi:g}] is wider than the largest float (its width overflows); "
                         "narrow it to the values the function returns")
    return float(lo), float(hi)


@dataclass(frozen=True)
class SampleAggregatePlan:
    """Calibrated noise for the per-group sums of block outputs. Use :meth:`build`."""

    function: str
    blocks: int
    lo: float
    hi: float
    noise: CalibratedNoise | None  # the mean's noise on the sum of outputs; None for the median
    loss: PrivacyLoss
    median: QuantilesPlan | None = None
    #: Groups one unit can change (L0): what the mean's noise must be certified for. None: every group.
    changed_groups: int | None = None

    @classmethod
    def build(
        cls, *, function: str, blocks: int, lo: float, hi: float, kind: NoiseKind, budget: float, delta: float,
        bounds: ContributionBounds, max_groups: int = 1_000_000, aggregate: str = "mean", bins: int = 64,
    ) -> SampleAggregatePlan:
        """``budget`` is epsilon (``kind="laplace"``) or rho (``"gaussian"``, stated at ``delta``)."""
        if isinstance(blocks, bool) or not isinstance(blocks, int) or not 2 <= blocks <= MAX_BLOCKS:
            raise ValueError(
                f"blocks must be an integer in [2, {MAX_BLOCKS}], got {blocks!r}; more blocks mean less noise "
                "(it shrinks as 1/blocks) but fewer units per block: 20 to 100 is typical"
            )
        if aggregate not in AGGREGATES:
            raise ValueError(f"aggregate must be one of {AGGREGATES}, got {aggregate!r}")
        lo, hi = check_output_range(lo, hi)
        l0 = bounds.max_groups_per_unit
        if l0 > max_groups:
            raise ValueError(
                f"max_groups_per_unit {l0} exceeds max_groups={max_groups}, the groups one unit may change that the "
                "float rounding is certified for; raise max_groups to at least max_groups_per_unit"
            )
        if aggregate == "median":
            if kind != "laplace":
                raise ValueError("aggregate: median draws with the exponential mechanism, which is pure DP: use "
                                 "mechanism: laplace (or aggregate: mean with gaussian)")
            median = QuantilesPlan.build(epsilon=budget, q=[0.5], lo=lo, hi=hi, bins=bins,
                                         bounds=ContributionBounds(l0, 2))  # a replaced output: -1 value, +1 value
            return cls(function, blocks, lo, hi, None, median.loss, median)
        per_width = l0 if kind == "laplace" else math.sqrt(l0)
        sensitivity = (hi - lo) * per_width
        floor = smallest_sum_sensitivity(kind, max_groups)
        if not sensitivity >= floor:  # calibrate_sums could only name the sensitivity, not the setting
            raise ValueError(
                f"output_range [{lo:g}, {hi:g}] is too narrow to calibrate the mean's noise: its sensitivity "
                f"{sensitivity:.3g} is below {floor:.3g}, the smallest the float noise's finest grid serves for "
                f"{max_groups} groups; rescale the function's output to larger units for an output_range at least "
                f"{floor / per_width * 1.01:.3g} wide"  # rounded up: the stated width builds
            )
        noise = calibrate_sums(kind, budget, sensitivity, max_groups=max_groups)
        loss = PrivacyLoss.pure(noise.cost) if kind == "laplace" else PrivacyLoss.from_zcdp(noise.cost, delta)
        return cls(function, blocks, lo, hi, noise, loss, changed_groups=l0)

    @property
    def aggregate(self) -> str:
        return "mean" if self.median is None else "median"

    def median_rank_error(self) -> float:
        """The median's rank error in blocks at 95% (beyond the grid's own resolution)."""
        assert self.median is not None
        return float(self.median.rank_error(statement_beta(False))[0])

    def median_q_interval(self) -> list[float]:
        """``1/2 -+ rank_error / blocks`` in [0, 1]: ``n = blocks`` is known exactly, no noisy count needed."""
        error = self.median_rank_error()
        return [max(0.0, 0.5 - error / self.blocks), min(1.0, 0.5 + error / self.blocks)]

    @property
    def fallback(self) -> float:
        """What a block whose function failed contributes: the range's midpoint, independent of the data."""
        return self.lo + (self.hi - self.lo) / 2.0

    def _clipped(self, outputs: NDArray[np.float64]) -> NDArray[np.float64]:
        outputs = np.asarray(outputs, dtype=np.float64)
        if outputs.ndim != 2 or outputs.shape[1] != self.blocks:
            raise ValueError(f"outputs must have shape (groups, {self.blocks}), one value per block; got {outputs.shape}")
        return np.clip(np.where(np.isfinite(outputs), outputs, self.fallback), self.lo, self.hi)

    def release(self, outputs: NDArray[np.float64], noise: NoiseSource) -> tuple[NDArray[np.float64], float]:
        """Noisy means over blocks of ``outputs`` (groups x blocks, failed blocks as NaN), and the 95% half-width."""
        if self.noise is None:
            raise ValueError("this plan releases a median: use release_rows")
        sums = self._clipped(outputs).sum(axis=1)
        noisy = self.noise.apply(sums, noise, changed=self.changed_groups) if len(sums) else sums
        return noisy / self.blocks, self.noise.ci_half_width(0.05) / self.blocks

    def release_rows(self, outputs: NDArray[np.float64], noise: NoiseSource) -> list[dict[str, Any]]:
        """One record part per group (rows of ``outputs``): ``{"value", "ci95", "blocks"}`` for the mean,
        ``{"value", "rank_error", "q_interval", "blocks", "aggregate"}`` for the median."""
        if self.median is None:
            means, half_width = self.release(outputs, noise)
            return [{"value": float(m), "ci95": half_width, "blocks": self.blocks} for m in means.tolist()]
        clipped = self._clipped(outputs)
        bins = self.median.bins
        # each output counts in its bin of [lo, hi], as values do for quantiles
        index = HistogramSpec(bins, self.lo, self.hi).bin_of(clipped)
        histograms = SparseHistogram.from_cells(len(clipped), bins, np.repeat(np.arange(len(clipped)), self.blocks),
                                                index.reshape(-1))
        drawn = self.median.release(histograms, noise).values[:, 0] if len(clipped) else np.zeros(0)
        error, interval = self.median_rank_error(), self.median_q_interval()
        return [{"value": float(v), "rank_error": error, "q_interval": interval, "blocks": self.blocks,
                 "aggregate": "median"} for v in drawn.tolist()]

    def describe(self) -> dict[str, Any]:
        common = {"mechanism": "sample_and_aggregate", "aggregate": self.aggregate, "function": self.function,
                  "blocks": self.blocks, "output_range": [self.lo, self.hi]}
        if self.median is not None:
            return {**common, "noise": "exponential", "bins": self.median.bins, "rank_scale": self.median.scale[0],
                    "rank_error": self.median_rank_error(), **self.loss.to_dict()}
        assert self.noise is not None
        return {
            **common,
            "noise": self.noise.kind,
            "sum_scale": self.noise.scale,
            "l_sensitivity": self.noise.sensitivity,
            "ci95": self.noise.ci_half_width(0.05) / self.blocks,
            **self.loss.to_dict(),
        }


def split_blocks(group: NDArray[Any], block: NDArray[Any], values: NDArray[np.float64], n_groups: int,
                 blocks: int) -> list[list[NDArray[np.float64]]]:
    """``values`` cut into one array per (group, block), each in its given order (stable)."""
    group = np.asarray(group, dtype=np.int64)
    block = np.asarray(block, dtype=np.int64)
    cell = group * blocks + block
    order = np.argsort(cell, kind="stable")
    bounds = np.searchsorted(cell[order], np.arange(n_groups * blocks + 1))
    ordered = np.asarray(values, dtype=np.float64)[order]
    return [[ordered[bounds[g * blocks + b]:bounds[g * blocks + b + 1]] for b in range(blocks)] for g in range(n_groups)]
