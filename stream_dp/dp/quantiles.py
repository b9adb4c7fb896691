"""Per-group quantiles of a window: the exponential mechanism over bin edges, drawn by report-noisy-max.

For each group and each requested quantile ``q`` the release is one of the
``bins + 1`` bin edges ``c_j = lo + j (hi - lo) / bins`` of the group's value
histogram (see ``stream_dp.dp.histogram``).

**Score.** OpenDP's quantile score (``make_quantile_score_candidates``;
Smith, "Privacy-preserving statistical estimation with optimal convergence
rates", STOC 2011)::

    score(c) = |(den - num) #(x < c) - num #(x > c)|

with ``num / den`` OpenDP's rational form of ``q`` (exact when the float's
denominator is below 10^4, else ``q`` cut down to a multiple of 10^-4). Values
are known by bin only; each counts as its bin's midpoint, so none equals an
edge and, with ``L_j`` values in the bins below edge ``j``::

    score_j = |den L_j - num n| = den |L_j - (num / den) n|,

``den`` times the number of ranks between edge ``j`` and the quantile. That is
OpenDP's ``make_private_quantile`` on the midpoints with the edges as
candidates (tests/dp/test_quantiles.py compares the two). Edges, not
midpoints, are the candidates because an edge's rank is exact in a histogram.

**Selection.** The lowest score by report-noisy-max with exponential noise of
scale ``s`` on the integer scores, i.e. permute-and-flip (McKenna & Sheldon,
NeurIPS 2020), as ``make_private_quantile`` does under pure DP; drawn through
``NoiseSource.top_k`` on the negated scores, since ``top_k`` maximises.

**Privacy.** One value added to a group moves every score by at most
``D = max(num, den - num)`` (``den - num`` at the edges above it, ``num``
below), up or down: the score is not monotonic, so ``d`` values cost
``2 d D / s`` (the range sensitivity; OpenDP's ``make_noisy_max`` map without
``monotonic``). A unit adds at most ``Linf = max_events_per_group`` values to
each of at most ``L0 = max_groups_per_unit`` groups, whose draws are
independent; basic composition (Dwork & Roth 2014, Theorem 3.16) over those
groups and over the quantiles, each given ``eps_q = epsilon / len(q)``, gives::

    s_q = 2 L0 Linf D_q / eps_q    (score units; scale_q = s_q / den_q in ranks)

``build`` has OpenDP's ``make_private_quantile`` map certify each group's cost
at ``Linf`` records and refuses a plan whose ``L0`` times that, summed over
the quantiles, exceeds ``epsilon``.

**Accuracy.** Let ``*`` be the best edge. An edge ``r`` wins only if its
noise exceeds the best edge's by ``score_r - score_*``; for exponential noise
that has probability at most ``exp(-(score_r - score_*) / s)``, and at most
``bins`` edges compete with ``*``. So with probability at least ``1 - beta``::

    |L_out - q n| <= OPT + r,    r = scale_q ln(bins / beta)    (ranks),

where ``OPT = min_j |L_j - (num / den) n|`` is the grid's own resolution: at
most half the values of the bin holding the true quantile, 0 when the
quantile falls on an edge. (This is the exponential mechanism's
``(2 D / eps) ln(|R| / beta)`` with ``|R| - 1`` competitors.)

**Interval.** Given the group's noisy count ``C`` and its half-width ``h`` at
level ``1 - COUNT_BETA``, ``n >= n_low = max(1, C - h)`` with probability at
least ``1 - COUNT_BETA``. With ``beta = 1 - CONFIDENCE - COUNT_BETA`` the union
bound gives, with probability at least ``CONFIDENCE`` (95%), that the released
edge's rank ``L_out / n`` -- the share of the group's values below it -- lies in::

    q_interval = [max(0, q - w), min(1, q + w)],   w = r / n_low + |q - num / den|,

plus the grid's resolution ``OPT / n`` when the quantile falls inside a bin.
``OPT`` depends on the values, so no record can state it: ``rank_error`` and
``q_interval`` are the mechanism's part only, which is the whole error when
the group's values are spread over many bins, and understates it when many
share the quantile's bin (a constant field: every edge then scores the same). Without a count only ``r`` is reported, at ``beta = 1 - CONFIDENCE`` (a query
always has one: the query file's loader adds ``count`` when it is left out). The
statements hold per group and per quantile, not all at once; the quantiles of
a group are drawn independently and may cross.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
from numpy.typing import NDArray

from stream_dp.dp.bounds import ContributionBounds
from stream_dp.dp.loss import PrivacyLoss
from stream_dp.dp.measurements import private_quantile_measurement, quantile_score_transformation
from stream_dp.dp.noise import NoiseSource
from stream_dp.dp.plan_budgets import CALIBRATION_MARGIN  # calibrate a hair below the share
from stream_dp.dp.quantile_intervals import CONFIDENCE, ValueIntervalPlan

#: The share of ``1 - CONFIDENCE`` spent on the lower bound of a group's size from its noisy count.
COUNT_BETA = 0.025
MAX_BINS = 1 << 16  # bins travel as uint16
_ALPHA_GRANULARITY = 10_000  # OpenDP's denominator for a q without a small exact one
_CHUNK_CELLS = 1 << 21  # histogram cells scored at once (16 MiB of int64)


def opendp_alpha(q: float) -> tuple[int, int]:
    """``(num, den)`` as OpenDP 0.16 turns ``q`` into a fraction for its quantile score.

    The float's exact fraction when its denominator is below 10^4 (0.5 is
    1/2), else ``floor(q * 10^4) / 10^4`` (the float product, truncated as
    OpenDP 0.16 casts it: 0.123456 is 1234/10000); ``build`` checks the result
    against OpenDP's own scores and refuses to build on a mismatch.
    """
    exact = Fraction(q)
    if exact.denominator < _ALPHA_GRANULARITY:
        return exact.numerator, exact.denominator
    return math.floor(q * float(_ALPHA_GRANULARITY)), _ALPHA_GRANULARITY


def opendp_level(q: float) -> float:
    """The float to give OpenDP for the level ``q``, so that it aims at ``q`` where it can.

    ``q`` itself, except for a level of at most four decimals that the float
    product truncates one step short (``0.57 * 10^4`` is ``5699.99...``, which
    OpenDP casts to 5699): the next float up, which it resolves to 5700/10000.
    """
    num, den = opendp_alpha(q)
    if num / den == q:
        return q
    nudged = math.nextafter(q, 1.0)
    num, den = opendp_alpha(nudged)
    return nudged if num / den == q else q


def _check_inputs(epsilon: object, q: object, lo: object, hi: object, bins: object, bounds: object) -> tuple[float, ...]:
    if isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real) or not (
        math.isfinite(epsilon) and epsilon > 0
    ):
        raise ValueError(f"epsilon must be positive and finite, got {epsilon!r}; e.g. epsilon=1.0")
    if isinstance(q, (str, bytes)) or not hasattr(q, "__iter__"):
        raise TypeError(f"q must be a list of quantiles, got {q!r}; e.g. q=[0.5, 0.9, 0.99]")
    levels = tuple(q)  # type: ignore[arg-type]
    if not levels or any(
        isinstance(x, bool) or not isinstance(x, numbers.Real) or not 0.0 < x < 1.0 for x in levels
    ):
        raise ValueError(f"q must be quantiles strictly between 0 and 1, got {list(levels)!r}; e.g. q=[0.5, 0.9, 0.99]")
    if list(levels) != sorted(set(levels)):
        raise ValueError(f"q must be distinct and increasing, got {list(levels)!r}; e.g. q=[0.5, 0.9, 0.99]")
    for name, value in (("lo", lo), ("hi", hi)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}; use the query's quantile bounds")
    if not lo < hi:  # type: ignore[operator]
        raise ValueError(f"quantile bounds need lo < hi, got [{lo}, {hi}]; swap them or widen the range")
    if isinstance(bins, bool) or not isinstance(bins, numbers.Integral) or not 1 <= bins <= MAX_BINS:
        raise ValueError(f"bins must be an integer in [1, {MAX_BINS}], got {bins!r}; 256 is typical")
    if not isinstance(bounds, ContributionBounds):
        raise TypeError("bounds must be ContributionBounds(max_groups_per_unit=..., max_events_per_group=...)")
    return tuple(float(x) for x in levels)


def statement_beta(sized_by_count: bool) -> float:
    """The ``beta`` of the ``rank_error`` a release states (module docstring, "Interval").

    ``1 - CONFIDENCE``; when the group's noisy count sizes it (the query counts, so records carry a
    ``q_interval``), ``COUNT_BETA`` of that goes to the count's lower bound and ``rank_error`` holds at
    ``1 - CONFIDENCE - COUNT_BETA``.
    """
    return 1.0 - CONFIDENCE - (COUNT_BETA if sized_by_count else 0.0)


def bin_edges(lo: float, hi: float, bins: int) -> NDArray[np.float64]:
    """The candidates: ``lo + j (hi - lo) / bins`` for ``j = 0..bins``, the last exactly ``hi``."""
    edges = lo + np.arange(bins + 1, dtype=np.float64) * ((hi - lo) / bins)
    edges[-1] = hi
    if not np.all(np.diff(edges) > 0):
        raise ValueError(
            f"{bins} bins over [{lo}, {hi}] are too narrow to tell their edges apart in float64; use fewer bins"
        )
    return edges


@dataclass(frozen=True)
class QuantilesRelease:
    """Released quantiles of each group (rows in the order of the histograms given)."""

    q: tuple[float, ...]
    values: NDArray[np.float64]  # (groups, len(q)): the released bin edges
    candidate_index: NDArray[np.int64]  # (groups, len(q)): which edge, 0..bins
    rank_error: NDArray[np.float64]  # (len(q),): r, in ranks (values), at the statement's level
    q_interval: NDArray[np.float64] | None  # (groups, len(q), 2), None without noisy counts
    confidence: float = CONFIDENCE
    value_ci95: NDArray[np.float64] | None = None  # (groups, len(q), 2) in the field's units, with value_interval


@dataclass(frozen=True)
class QuantilesPlan:
    """Calibrated per-group quantiles. Use :meth:`build`."""

    q: tuple[float, ...]
    lo: float
    hi: float
    bins: int
    bounds: ContributionBounds
    epsilon_per_quantile: float
    alpha: tuple[tuple[int, int], ...]  # OpenDP's (num, den) of each quantile
    scale: tuple[float, ...]  # per quantile, in ranks
    score_scale: tuple[float, ...]  # per quantile, on the integer scores: scale * den
    loss: PrivacyLoss
    interval: ValueIntervalPlan | None = None  # the noisy histogram behind value_ci95 (value_interval: true)

    @classmethod
    def build(
        cls, *, epsilon: float, q: list[float], lo: float, hi: float, bins: int, bounds: ContributionBounds,
        value_interval: bool = False,
    ) -> QuantilesPlan:
        """Calibrate each quantile to ``epsilon / len(q)`` and certify the total with OpenDP.

        With ``value_interval``, half of ``epsilon`` goes to a noisy histogram of each group for the
        quantiles' value intervals (``stream_dp.dp.quantile_intervals``) and half to the draws.
        """
        levels = _check_inputs(epsilon, q, lo, hi, bins, bounds)
        lo, hi, bins = float(lo), float(hi), int(bins)
        edges = bin_edges(lo, hi, bins)
        probe, probe_below = _probe(edges)
        l0, linf = bounds.max_groups_per_unit, bounds.max_events_per_group
        interval = None
        draws_epsilon = float(epsilon)
        if value_interval:
            draws_epsilon = float(epsilon) / 2.0
            interval = ValueIntervalPlan.build(epsilon=draws_epsilon, q=levels, edges=edges, bounds=bounds)
        eps_q = draws_epsilon / len(levels)
        alphas, scales, score_scales = [], [], []
        cost = 0.0 if interval is None else interval.loss.epsilon
        for level in levels:
            num, den = opendp_alpha(opendp_level(level))
            reach = max(num, den - num)
            _check_score(edges, opendp_level(level), num, den, probe, probe_below)
            scale = 2.0 * l0 * linf * reach / (den * eps_q * CALIBRATION_MARGIN)
            # exactly the product make_private_quantile forms for its noisy max, so the certified draw is ours
            score_scale = scale * float(den)
            cost += l0 * float(private_quantile_measurement(edges.tolist(), opendp_level(level), scale).map(linf))
            alphas.append((num, den))
            scales.append(scale)
            score_scales.append(score_scale)
        if cost > epsilon:
            raise RuntimeError(f"OpenDP certifies epsilon={cost} above the budget {epsilon}; nothing is released")
        return cls(levels, lo, hi, bins, bounds, eps_q, tuple(alphas), tuple(scales), tuple(score_scales),
                   PrivacyLoss.pure(cost), interval)

    @property
    def candidates(self) -> NDArray[np.float64]:
        return bin_edges(self.lo, self.hi, self.bins)

    def stated_rank_error(self, sized_by_count: bool) -> NDArray[np.float64]:
        """Per quantile, the ``rank_error`` records state: at :func:`statement_beta` of ``sized_by_count``."""
        return self.rank_error(statement_beta(sized_by_count))

    def rank_error(self, beta: float) -> NDArray[np.float64]:
        """Per quantile, ``r`` with ``P(|L_out - q n| > OPT + r) <= beta`` (module docstring)."""
        if not 0.0 < beta < 1.0:
            raise ValueError(f"beta must be in (0, 1), got {beta}; 0.05 for a 95% statement")
        return np.array(self.scale) * math.log(max(self.bins, 1) / beta)

    def release(
        self,
        histograms: Any,
        noise: NoiseSource,
        noisy_counts: NDArray[Any] | None = None,
        count_ci: float | NDArray[Any] | None = None,
    ) -> QuantilesRelease:
        """Draw each group's quantiles from its value histogram.

        ``histograms``: a dense ``(groups, bins)`` integer array, or a sparse
        one (``stream_dp.dp.histogram.SparseHistogram``: ``shape`` and
        ``dense(start, stop)``). ``noisy_counts`` (the query's released count
        of each group) and ``count_ci`` (its half-width at level
        ``1 - COUNT_BETA``, one number or one per group) give ``q_interval``.
        """
        n_groups, rows = _histogram_rows(histograms, self.bins)
        low = self._size_lower_bound(n_groups, noisy_counts, count_ci)
        index = np.zeros((n_groups, len(self.q)), dtype=np.int64)
        value_ci = None if self.interval is None else np.empty((n_groups, len(self.q), 2), dtype=np.float64)
        chunk = max(1, _CHUNK_CELLS // (self.bins + 1))
        for start in range(0, n_groups, chunk):
            stop = min(n_groups, start + chunk)
            below = np.zeros((stop - start, self.bins + 1), dtype=np.int64)
            block = rows(start, stop)
            np.cumsum(block, axis=1, out=below[:, 1:])
            if value_ci is not None:
                value_ci[start:stop] = self.interval.intervals(block, noise)  # type: ignore[union-attr]
            sizes = below[:, -1:]
            for i, (num, den) in enumerate(self.alpha):
                if sizes.size and sizes.max() > np.iinfo(np.int64).max // (2 * den):
                    raise ValueError("a group holds too many values for int64 quantile scores; nothing is released")
                negated = -np.abs(den * below - num * sizes)  # top_k picks the highest: the lowest score
                for row in range(stop - start):
                    (pick,) = noise.top_k(negated[row], k=1, scale=self.score_scale[i])
                    index[start + row, i] = pick
        error = self.stated_rank_error(low is not None)
        interval = None
        if low is not None:
            offset = np.abs(np.array(self.q) - np.array([num / den for num, den in self.alpha]))
            width = error[None, :] / low[:, None] + offset[None, :]
            centre = np.array(self.q)[None, :]
            interval = np.stack([np.maximum(0.0, centre - width), np.minimum(1.0, centre + width)], axis=-1)
        return QuantilesRelease(self.q, self.candidates[index], index, error, interval, value_ci95=value_ci)

    @staticmethod
    def _size_lower_bound(n_groups: int, noisy_counts: Any, count_ci: Any) -> NDArray[np.float64] | None:
        if (noisy_counts is None) != (count_ci is None):
            raise ValueError(
                "pass noisy_counts and count_ci together (the released counts and their half-width at level "
                f"1 - {COUNT_BETA}), or neither to report the rank error only"
            )
        if noisy_counts is None:
            return None
        counts = np.asarray(noisy_counts, dtype=np.float64)
        if counts.shape != (n_groups,) or not np.all(np.isfinite(counts)):
            raise ValueError(
                f"noisy_counts must hold one finite count per group ({n_groups}), got shape {counts.shape}; "
                "pass the query's released counts in the order of the histograms"
            )
        width = np.broadcast_to(np.asarray(count_ci, dtype=np.float64), counts.shape)
        if not np.all(np.isfinite(width)) or np.any(width < 0):
            raise ValueError(
                f"count_ci must be non-negative and finite, got {count_ci!r}; pass the count's half-width from "
                f"accuracy.noise_ci_half_width(kind, scale, alpha={COUNT_BETA})"
            )
        return np.maximum(1.0, counts - width)

    def describe(self) -> dict[str, Any]:
        """JSON-serialisable statement of what every release of this plan spends and how."""
        return {
            "mechanism": "exponential",
            # report-noisy-max with exponential noise: permute-and-flip, OpenDP's pure-DP selection
            "selection": "permute_and_flip",
            "score": "opendp_quantile_score",
            "candidates": {"kind": "bin_edges", "count": self.bins + 1, "lo": self.lo, "hi": self.hi,
                           "bins": self.bins},
            "q": list(self.q),
            "alpha": [list(a) for a in self.alpha],
            "epsilon_per_quantile": self.epsilon_per_quantile,
            "scale": list(self.scale),
            "score_scale": list(self.score_scale),
            "bounds": {"max_groups_per_unit": self.bounds.max_groups_per_unit,
                       "max_events_per_group": self.bounds.max_events_per_group},
            "confidence": CONFIDENCE,
            "count_beta": COUNT_BETA,
            "rank_error": self.rank_error(1.0 - CONFIDENCE).tolist(),
            "value_interval": None if self.interval is None else self.interval.describe(),
            "loss": self.loss.to_dict(),
        }


def _histogram_rows(histograms: Any, bins: int) -> tuple[int, Any]:
    """``(groups, rows(start, stop) -> dense int64 block)`` of a dense or sparse histogram, checked."""
    if isinstance(histograms, (np.ndarray, list)):
        dense = np.asarray(histograms)
        if dense.ndim != 2 or dense.shape[1] != bins:
            raise ValueError(f"histograms must have shape (groups, {bins}), got {dense.shape}; one row per group")
        if dense.dtype.kind not in "iu":
            raise ValueError(f"histograms must hold integer counts, got dtype {dense.dtype}")
        if dense.size and dense.min() < 0:
            raise ValueError("histograms must hold counts >= 0; nothing is released")
        dense = dense.astype(np.int64, copy=False)
        return dense.shape[0], lambda start, stop: dense[start:stop]
    shape = getattr(histograms, "shape", None)
    if shape is None or not hasattr(histograms, "dense"):
        raise TypeError(
            "histograms must be a (groups, bins) integer array or a SparseHistogram; got "
            f"{type(histograms).__name__}"
        )
    if tuple(shape)[1:] != (bins,):
        raise ValueError(f"histograms have {tuple(shape)[1:]} bins, this plan {bins}; build both from one query")
    return int(shape[0]), histograms.dense


def _probe(edges: NDArray[np.float64]) -> tuple[list[float], NDArray[np.int64]]:
    """A data set of bin midpoints, 0 to 4 per bin, and its values below each edge."""
    bins = len(edges) - 1
    per_bin = (np.arange(bins) * 7 + 3) % 5
    mids = edges[:-1] + (edges[1:] - edges[:-1]) / 2
    if not np.all((mids > edges[:-1]) & (mids < edges[1:])):
        raise ValueError(f"{bins} bins are too narrow to hold a midpoint in float64; use fewer bins")
    below = np.zeros(bins + 1, dtype=np.int64)
    np.cumsum(per_bin, out=below[1:])
    return np.repeat(mids, per_bin).tolist(), below


def _check_score(
    edges: NDArray[np.float64], level: float, num: int, den: int, probe: list[float], probe_below: NDArray[np.int64]
) -> None:
    """Our histogram score must be OpenDP's on midpoints, and its sensitivity OpenDP's."""
    transformation = quantile_score_transformation(edges.tolist(), level)
    ours = np.abs(den * probe_below - num * probe_below[-1])
    theirs = np.asarray(transformation(probe), dtype=np.int64)
    if int(transformation.map(1)) != max(num, den - num) or not np.array_equal(ours, theirs):
        raise RuntimeError(
            f"OpenDP's quantile score for q={level} is not this plan's |den L - num n| with (num, den) = "
            f"({num}, {den}); the installed OpenDP changed it: pin opendp 0.16 or update stream_dp.dp.quantiles"
        )
