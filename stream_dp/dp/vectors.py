"""Vector aggregations: mean vectors (the Gaussian vector mechanism) and covariance ("Analyze Gauss").

A query with ``mean_vector`` or ``covariance`` reads ``d`` numeric fields. A
unit's vector in a group and window is the mean of its kept events' vectors,
clipped in l2 to ``clip_norm`` = C (``x <- x * min(1, C / ||x||)``). Each unit
adds one *feature vector* ``f(x)`` to each group it touches:

* ``mean_vector``: ``f(x) = (x, C)``, so the last coordinate of a group's sum
  is ``C`` times its number of units; ``||f(x)||_2 <= sqrt(2) C``.
* ``covariance``: ``f(x)`` = the upper triangle (diagonal included, row-major)
  of ``x~ x~^T`` with ``x~ = (x, C)``: the group's sum holds the second moments,
  ``C`` times the vector sum and ``C^2`` times the unit count in one symmetric
  matrix. ``||f(x)||_2^2 = (||x~||^4 + sum_i x~_i^4) / 2`` (each off-diagonal
  product once), and with ``||x~||^2 <= 2 C^2``, ``sum_i x~_i^4 <= ||x||^4 + C^4
  <= 2 C^4``: ``||f(x)||_2 <= sqrt(3) C^2``, reached when ``x`` lies along an axis.

A unit touches at most ``L0`` = ``max_groups_per_unit`` groups, so adding or
removing it moves the concatenation of every group's feature sum by at most
``sqrt(L0)`` times the feature bound in l2. Independent Gaussian noise of
``sigma = Delta_2 / sqrt(2 rho)`` on every coordinate is ``rho``-zCDP (Bun &
Steinke 2016, Proposition 1.6); the noise is OpenDP's, on a float grid, certified
by :func:`stream_dp.dp.calibration.calibrate_sums`. The grid's rounding is
certified for ``max_groups`` groups' coordinates; since each coordinate is
rounded and noised on its own, only the ``L0 * width`` coordinates one unit can
change cost anything, so a window of any number of groups is covered as long as
``L0 <= max_groups`` (``CalibratedNoise.apply``).

Covariance: the noisy upper triangle, mirrored, is Dwork, Talwar, Thakurta &
Zhang's "Analyze Gauss" (STOC 2014, Algorithm 1). It is then projected onto the
positive semi-definite cone (negative eigenvalues set to 0: the nearest PSD
matrix in Frobenius norm), and the covariance is the Schur complement
``(S - b b^T / c) / n`` of that projection -- PSD by construction, and all of it
post-processing. The Wishart mechanism (Jiang et al., AAAI 2016) is not used:
it adds a PSD matrix, so the output's support ``{A + W : W PSD}`` depends on
the input ``A``, and an output can be impossible under a neighbouring input
(``A' = A + x x^T`` with ``M - A'`` not PSD) -- an unbounded privacy loss, not
epsilon-DP.

Errors (:meth:`VectorPlan.errors_at`), to first order (the delta method): a
group of ``n`` units with mean ``mu`` and population covariance ``Sigma`` has
``S = n (Sigma + mu mu^T)``, ``b = C n mu`` and ``c = C^2 n``; the released
covariance is ``C^2 (S - b b^T / c) / c`` and mean ``C b / c``. With noise
``E`` of sd ``sigma`` on each upper entry (index ``d`` the last), a diagonal
entry moves by ``(E_ii - 2 (mu_i / C) E_id + ((mu_i^2 - Sigma_ii) / C^2) E_dd) / n``,
variance ``sigma^2 / n^2 (1 + 4 (mu_i/C)^2 + ((mu_i^2 - Sigma_ii) / C^2)^2)``; an
off-diagonal one ``sigma^2 / n^2 (1 + (mu_i^2 + mu_j^2) / C^2 + ((mu_i mu_j -
Sigma_ij) / C^2)^2)``; a mean coordinate ``sigma^2 / (C n)^2 (1 + (mu_i / C)^2)``
(a mean vector's, ``C s / w``, the same over ``n`` instead of ``C n``). Inside
the clip ball ``mu_i^2 + Sigma_ii <= C^2``, so the diagonal's factor is at most
``1 + 4 + 1 = 6`` and the mean's 2, both reached by every unit at ``C`` along
axis ``i``; the off-diagonal's at most ``1 + 1 + 1/4``. The 95% half-widths of
data near 0 (``1.96 sigma / n`` for an entry, ``1.96 sigma / (C n)`` for the
covariance's mean) thus grow by up to ``sqrt(6)`` and ``sqrt(2)`` for a mean
at norm ``C``: a non-centred mean costs accuracy, not only a larger ``C``.
When the noise is not small beside the matrix's eigenvalues the PSD
projection acts and the first order no longer holds (it shrank the errors in
every case ``tests/cli/test_plan_options.py`` ran).

Pure maths on numpy arrays; no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from stream_dp.dp.bounds import ContributionBounds
from stream_dp.dp.calibration import CalibratedNoise, calibrate_sums, smallest_sum_sensitivity
from stream_dp.dp.loss import PrivacyLoss
from stream_dp.dp.noise import NoiseSource

VectorKind = Literal["mean_vector", "covariance"]
VECTOR_KINDS: tuple[str, ...] = ("mean_vector", "covariance")
#: Most fields of a mean vector / a covariance (the covariance's features grow as d^2 / 2).
MAX_DIMENSIONS = {"mean_vector": 64, "covariance": 16}
# z of a two-sided 95% normal interval
_Z95 = 1.959963984540054
#: Most a first-order 95% error grows, for data inside the clip ball, over that of data near 0 (module
#: docstring): a covariance's diagonal entry, and a mean coordinate (of a mean vector or a covariance's mean).
WORST_COVARIANCE_ENTRY = math.sqrt(6.0)
WORST_MEAN_COORDINATE = math.sqrt(2.0)


def clip_l2(vectors: NDArray[np.float64], clip_norm: float, out: NDArray[np.float64] | None = None) -> NDArray[np.float64]:
    """Each row scaled down to l2 norm at most ``clip_norm`` (rows already inside are unchanged), into ``out``
    if given (an array of the same shape)."""
    norms = np.sqrt(np.einsum("ij,ij->i", vectors, vectors))
    # divided only where a row is longer than the bound: a norm near 0 (a subnormal field) would overflow
    factor = np.divide(clip_norm, norms, out=np.ones_like(norms), where=norms > clip_norm)
    return np.multiply(vectors, factor[:, None], out=out)


def _upper(d: int) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
    return np.triu_indices(d)


def group_row_sums(group: NDArray[Any], rows: NDArray[np.float64], n_groups: int, width: int) -> NDArray[np.float64]:
    """Per-group sums of ``rows`` (one row of ``width`` per entry of ``group``), ``(n_groups, width)``."""
    out = np.zeros((n_groups, width), dtype=np.float64)
    if len(group):
        for column in range(width):  # bincount adds in index order: bit-identical on every replay
            out[:, column] = np.bincount(group, weights=rows[:, column], minlength=n_groups)
    return out


#: Feature coordinates computed at once when summing a window's pairs (32 MB of float64): peak memory
#: stays at a few blocks of this size however many pairs a window holds.
FEATURE_BLOCK_ELEMENTS = 1 << 22


def group_row_sums_in_blocks(
    group: NDArray[Any], n_groups: int, width: int, rows_of: Callable[[NDArray[np.intp]], NDArray[np.float64]],
    *, block_elements: int | None = None,
) -> NDArray[np.float64]:
    """What ``group_row_sums(group, rows, n_groups, width)`` returns, bit for bit, where ``rows_of(positions)``
    gives the rows at those positions: never more than about ``block_elements`` (default
    ``FEATURE_BLOCK_ELEMENTS``) row values exist at once.

    Every group's rows are still added one after the other in their order, starting from 0.0 (as bincount
    does), so each sum rounds exactly as before: the positions are sorted by group (stably), cut into
    blocks, and a group cut by a block boundary resumes from its sum so far (entered as the first weight of
    the next block's bincount: ``0.0 + s == s``, and a sum that starts at +0.0 is never -0.0).
    """
    out = np.zeros((n_groups, width), dtype=np.float64)
    group = np.asarray(group, dtype=np.int64)
    if not len(group):
        return out
    order = np.argsort(group, kind="stable")
    step = max(1, (block_elements or FEATURE_BLOCK_ELEMENTS) // max(width, 1))
    for start in range(0, len(order), step):
        positions = order[start:start + step]
        block_group = group[positions]
        first, span = int(block_group[0]), int(block_group[-1]) - int(block_group[0]) + 1
        # slot 0 carries the first group's sum so far; the block's rows follow, each in its group's slot
        slot = np.concatenate(([0], block_group - first))
        columns = np.ascontiguousarray(rows_of(positions).T)  # one contiguous column per bincount
        for column in range(width):
            weights = np.concatenate((out[first:first + 1, column], columns[column]))
            out[first:first + span, column] = np.bincount(slot, weights=weights, minlength=span)
    return out


@dataclass(frozen=True)
class FeatureSpec:
    """What one (unit, group) pair adds to its group: see the module docstring."""

    kind: VectorKind
    dimensions: int
    clip_norm: float

    def __post_init__(self) -> None:
        if self.kind not in VECTOR_KINDS:
            raise ValueError(f"vector aggregation must be one of {', '.join(VECTOR_KINDS)}, got {self.kind!r}")
        most = MAX_DIMENSIONS[self.kind]
        if isinstance(self.dimensions, bool) or not isinstance(self.dimensions, int) or not 1 <= self.dimensions <= most:
            raise ValueError(
                f"{self.kind} takes 1 to {most} fields, got {self.dimensions!r}; release more fields with a second query"
            )
        if not (isinstance(self.clip_norm, (int, float)) and math.isfinite(self.clip_norm) and self.clip_norm > 0):
            raise ValueError(
                f"clip_norm must be a positive finite number, got {self.clip_norm!r}; choose the l2 norm a typical "
                "unit's vector stays under (larger vectors are scaled down to it)"
            )

    @property
    def width(self) -> int:
        """Length of one feature vector."""
        d1 = self.dimensions + 1
        return d1 if self.kind == "mean_vector" else d1 * (d1 + 1) // 2

    @property
    def norm_bound(self) -> float:
        """Largest l2 norm of one feature vector."""
        c = float(self.clip_norm)
        return math.sqrt(2.0) * c if self.kind == "mean_vector" else math.sqrt(3.0) * c * c

    def of_means(self, means: NDArray[np.float64]) -> NDArray[np.float64]:
        """Feature vectors (rows) of the pairs' mean vectors ``means`` (one row of ``d`` values per pair)."""
        return self.of_augmented(self.augmented(means))

    def augmented(self, means: NDArray[np.float64]) -> NDArray[np.float64]:
        """``x~ = (x, C)`` of each pair's clipped mean ``x`` (rows), from which :meth:`of_augmented` builds
        features -- ``d + 1`` values per pair where a feature vector has up to ``(d + 1)(d + 2) / 2``."""
        means = np.asarray(means, dtype=np.float64).reshape(-1, self.dimensions)
        augmented = np.empty((len(means), self.dimensions + 1), dtype=np.float64)
        clip_l2(means, float(self.clip_norm), out=augmented[:, :-1])  # in place: no third copy of the pairs
        augmented[:, -1] = float(self.clip_norm)
        return augmented

    def of_augmented(self, augmented: NDArray[np.float64]) -> NDArray[np.float64]:
        """Feature vectors (rows) of rows of :meth:`augmented` (each row on its own: any subset of rows gives
        the same features for them)."""
        if self.kind == "mean_vector":
            return augmented
        rows, cols = _upper(self.dimensions + 1)
        return augmented[:, rows] * augmented[:, cols]

    def group_sums(self, pair_group: NDArray[Any], features: NDArray[np.float64], n_groups: int) -> NDArray[np.float64]:
        """Per-group sums of the pairs' feature vectors, ``(n_groups, width)``, added in pair order."""
        return group_row_sums(pair_group, features, n_groups, self.width)


def _check_norm_calibrates(spec: FeatureSpec, sensitivity: float, l0: int, coordinates: int) -> None:
    """Refuse a clip norm whose sensitivity the float noise cannot serve (a covariance's C^2 underflows far
    sooner than C), naming it and the smallest that can: ``calibrate_sums`` could only name the sensitivity."""
    floor = smallest_sum_sensitivity("gaussian", coordinates)
    if sensitivity >= floor:
        return
    # the sensitivity is sqrt(L0) times the norm bound, which grows as C (mean vector) or C^2 (covariance)
    per_unit_norm = math.sqrt(l0) * FeatureSpec(spec.kind, spec.dimensions, 1.0).norm_bound
    smallest = (floor / per_unit_norm) ** (1.0 if spec.kind == "mean_vector" else 0.5)
    raise ValueError(
        f"{spec.kind} clip_norm {spec.clip_norm:g} is too small to calibrate: its l2 sensitivity {sensitivity:.3g} "
        f"is below {floor:.3g}, the smallest the float noise's finest grid serves for {coordinates} coordinates; "
        f"rescale the fields to larger units (e.g. millimetres instead of kilometres) for a clip_norm of at least "
        f"{smallest * 1.01:.3g}"  # rounded up: the stated norm builds
    )


@dataclass(frozen=True)
class VectorPlan:
    """Calibrated Gaussian noise for one query's per-group feature sums. Use :meth:`build`."""

    features: FeatureSpec
    fields: tuple[str, ...]
    noise: CalibratedNoise
    loss: PrivacyLoss
    sensitivity: float
    #: Coordinates of the feature sums one unit can change: L0 groups' features. None: every coordinate.
    changed_coordinates: int | None = None

    @classmethod
    def build(
        cls, *, kind: str, fields: tuple[str, ...] | list[str], clip_norm: float, rho: float, delta: float,
        bounds: ContributionBounds, max_groups: int = 1_000_000,
    ) -> VectorPlan:
        """Noise every group's feature sum for ``rho``-zCDP per unit (``delta`` states its (epsilon, delta))."""
        fields = tuple(fields)
        if len(set(fields)) != len(fields):
            raise ValueError(f"{kind} fields {list(fields)} repeat a field; list each field once")
        spec = FeatureSpec(kind, len(fields), float(clip_norm))  # type: ignore[arg-type]
        if not (math.isfinite(rho) and rho > 0):
            raise ValueError(f"the {kind}'s rho must be positive and finite, got {rho}")
        if bounds.max_groups_per_unit > max_groups:
            raise ValueError(
                f"max_groups_per_unit {bounds.max_groups_per_unit} exceeds max_groups={max_groups}, the groups one "
                "unit may change that the float rounding is certified for; raise max_groups to at least "
                "max_groups_per_unit"
            )
        sensitivity = math.sqrt(bounds.max_groups_per_unit) * spec.norm_bound
        _check_norm_calibrates(spec, sensitivity, bounds.max_groups_per_unit, max_groups * spec.width)
        noise = calibrate_sums("gaussian", rho, sensitivity, max_groups=max_groups * spec.width)
        return cls(spec, fields, noise, PrivacyLoss.from_zcdp(noise.cost, delta), sensitivity,
                   bounds.max_groups_per_unit * spec.width)

    @property
    def sigma(self) -> float:
        return self.noise.scale

    def noisy(self, sums: NDArray[np.float64], noise: NoiseSource) -> NDArray[np.float64]:
        """The feature sums ``(groups, width)`` with Gaussian noise on every coordinate, for any number of
        groups (one unit changes at most ``changed_coordinates`` of them: module docstring)."""
        sums = np.asarray(sums, dtype=np.float64)
        if sums.ndim != 2 or sums.shape[1] != self.features.width:
            raise ValueError(
                f"feature sums must have shape (groups, {self.features.width}), got {sums.shape}; they come from "
                "the partials of this query (FeatureSpec.group_sums)"
            )
        if not sums.size:
            return sums.copy()
        return self.noise.apply(sums.reshape(-1), noise, changed=self.changed_coordinates).reshape(sums.shape)

    def rows(self, noisy: NDArray[np.float64]) -> list[dict[str, Any]]:
        """One JSON-able block per group: the post-processed statistics of its noisy feature sum."""
        if self.features.kind == "mean_vector":
            return [mean_vector_block(row, float(self.features.clip_norm), self.sigma, self.fields) for row in noisy]
        return [covariance_block(row, float(self.features.clip_norm), self.sigma, self.fields) for row in noisy]

    def errors_at(self, units: float) -> dict[str, tuple[float, float]]:
        """First-order 95% half-widths at ``units`` units (module docstring), each as (for data near 0,
        at most for any data inside the clip ball -- a mean at norm C): ``"mean"`` for a mean coordinate,
        and for a covariance ``"covariance"`` for an entry."""
        entry = _Z95 * self.sigma / units
        if self.features.kind == "mean_vector":  # the mean is C s / w: the sum's noise over the units
            return {"mean": (entry, entry * WORST_MEAN_COORDINATE)}
        mean = entry / float(self.features.clip_norm)  # the mean is b / (C n): entries over C n
        return {"covariance": (entry, entry * WORST_COVARIANCE_ENTRY), "mean": (mean, mean * WORST_MEAN_COORDINATE)}

    def describe(self) -> dict[str, Any]:
        return {
            "aggregation": self.features.kind,
            "mechanism": "gaussian_vector" if self.features.kind == "mean_vector" else "analyze_gauss",
            "fields": list(self.fields),
            "clip_norm": float(self.features.clip_norm),
            "l2_sensitivity": self.sensitivity,
            "noise_sd": self.sigma,
            **self.loss.to_dict(),
        }


def mean_vector_block(row: NDArray[np.float64], clip_norm: float, sigma: float, fields: tuple[str, ...]) -> dict[str, Any]:
    """Noisy vector sum, unit count and mean, with per-field 95% intervals for the mean.

    ``mean_j = C s_j / w`` from the noisy sum ``s`` and weight ``w = C n + noise``; by the delta
    method its standard error is ``(sigma / n) sqrt(1 + (mean_j / C)^2)`` (clipping bias aside).
    The mean is null when fewer than one unit is estimated.
    """
    d = len(fields)
    units = float(row[d]) / clip_norm
    sums = row[:d]
    block: dict[str, Any] = {"fields": list(fields), "sum": sums.tolist(), "units": units,
                             "sum_sd": sigma, "mean": None, "mean_ci95": None}
    if units >= 1.0:
        mean = sums / units
        block["mean"] = mean.tolist()
        block["mean_ci95"] = (_Z95 * sigma / units * np.sqrt(1.0 + (mean / clip_norm) ** 2)).tolist()
    return block


def symmetric(upper: NDArray[np.float64], size: int) -> NDArray[np.float64]:
    """The symmetric matrix whose upper triangle (row-major, diagonal included) is ``upper``."""
    matrix = np.zeros((size, size), dtype=np.float64)
    rows, cols = _upper(size)
    matrix[rows, cols] = upper
    matrix[cols, rows] = upper
    return matrix


def psd_projection(matrix: NDArray[np.float64]) -> tuple[NDArray[np.float64], int]:
    """The nearest positive semi-definite matrix in Frobenius norm, and how many eigenvalues were raised to 0."""
    eigenvalues, eigenvectors = np.linalg.eigh(matrix)
    negative = int((eigenvalues < 0).sum())
    clipped = np.maximum(eigenvalues, 0.0)
    projected = (eigenvectors * clipped) @ eigenvectors.T
    return (projected + projected.T) / 2.0, negative


def covariance_block(row: NDArray[np.float64], clip_norm: float, sigma: float, fields: tuple[str, ...]) -> dict[str, Any]:
    """Units, mean and covariance from one group's noisy augmented second-moment matrix (module docstring)."""
    d = len(fields)
    projected, raised = psd_projection(symmetric(row, d + 1))
    c = float(projected[d, d])
    units = c / (clip_norm * clip_norm)
    block: dict[str, Any] = {"fields": list(fields), "units": units, "mean": None, "covariance": None,
                             "second_moment": None, "entry_sd": sigma, "psd_projected": True,
                             "eigenvalues_raised": raised}
    if units >= 1.0:
        b = projected[:d, d]
        second = projected[:d, :d]
        covariance = (second - np.outer(b, b) / c) / units
        block["mean"] = (b / (clip_norm * units)).tolist()
        block["covariance"] = ((covariance + covariance.T) / 2.0).tolist()
        block["second_moment"] = (second / units).tolist()
    return block
