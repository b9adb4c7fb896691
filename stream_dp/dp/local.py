"""Local differential privacy: randomizers a producer applies before sending, and the collector's estimators.

Reference: T. Wang, J. Blocki, N. Li, S. Jha, "Locally Differentially Private
Protocols for Frequency Estimation", USENIX Security 2017 (k-ary randomized
response, called direct encoding there, and optimized unary encoding).

* **k-ary randomized response** (``krr``) over a domain of ``k`` values: report
  the true value with probability ``p = e^eps / (e^eps + k - 1)``, each other
  value with ``q = 1 / (e^eps + k - 1)``; ``p / q = e^eps``, so one report is
  ``eps``-LDP. Best for small domains (``k < 3 e^eps + 2``).
* **optimized unary encoding** (``oue``): a bit per value; the true value's bit
  is 1 with ``p = 1/2``, every other bit with ``q = 1 / (e^eps + 1)``. Two
  inputs differ in two bits, each changing the report's probability by at
  most a factor ``sqrt(e^eps)``... precisely ``p (1 - q) / ((1 - p) q) =
  e^eps``, so one report is ``eps``-LDP. Its variance does not grow with ``k``.

Both are unbiased after debiasing ``c_v`` (reports supporting ``v`` among
``n``): ``f_v = (c_v - n q) / (p - q)``, with variance
``n q (1 - q) / (p - q)^2 + f_v (1 - p - q) / (p - q)`` (Wang et al., Theorem 2).

Sampling is exact from uniform random words: randomized response draws a
uniform candidate and keeps a candidate other than the truth with an exact
``Bernoulli(e^-eps)`` coin (else redraws), which gives the truth probability
``1 / (1 + (k - 1) e^-eps) = p``; unary encoding's ``Bernoulli(q)`` bit is a
fair coin whose 1 is kept with ``Bernoulli(e^-eps)`` (else redrawn), which is
1 with probability ``e^-eps / (1 + e^-eps) = q``.

Every report a producer sends carries, in the field ``REPORT_TAG_FIELD``, the
tag of the randomizer that made it (``report_tag``); the worker takes only
reports whose tag is its query's own, so a true value sent by a producer that
did not randomize is rejected instead of being debiased as if it were a report.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

import numpy as np
import orjson
from numpy.typing import NDArray

from stream_dp.dp.exact_sampling import BitSource, bernoulli_exp, bernoulli_half, uniform_below
from stream_dp.dp.staircase import exact_epsilon

LocalMechanism = Literal["krr", "oue"]
LOCAL_MECHANISMS: tuple[LocalMechanism, ...] = ("krr", "oue")
MAX_LOCAL_EPSILON = 20.0
MAX_DOMAIN = 1 << 20
#: The event field holding the report's tag (``report_tag``).
REPORT_TAG_FIELD = "_local_dp"


@dataclass(frozen=True, slots=True)
class LocalRandomizer:
    """One ``eps``-LDP report of a value in ``[0, domain_size)``. Use :meth:`build`."""

    mechanism: LocalMechanism
    epsilon: float
    domain_size: int

    @classmethod
    def build(cls, mechanism: str, epsilon: float, domain_size: int) -> LocalRandomizer:
        if mechanism not in LOCAL_MECHANISMS:
            raise ValueError(f"local_dp mechanism must be one of {', '.join(LOCAL_MECHANISMS)}, got {mechanism!r}: "
                             "krr for small domains, oue for large ones")
        if not (isinstance(epsilon, float | int) and not isinstance(epsilon, bool) and math.isfinite(epsilon)
                and 0 < epsilon <= MAX_LOCAL_EPSILON):
            raise ValueError(f"local_dp epsilon must be in (0, {MAX_LOCAL_EPSILON:g}], got {epsilon!r}; e.g. 1.0")
        if isinstance(domain_size, bool) or not isinstance(domain_size, int) or not 2 <= domain_size <= MAX_DOMAIN:
            raise ValueError(f"local_dp needs a domain of 2 to {MAX_DOMAIN} values, got {domain_size!r}: the local_dp "
                             "domain is the query's groups.public; list there every value a producer may report "
                             "(e.g. groups: {public: [chrome, safari, other]})")
        return cls(mechanism, exact_epsilon(float(epsilon)), domain_size)  # type: ignore[arg-type]

    @property
    def p(self) -> float:
        """Probability that the report supports the true value."""
        if self.mechanism == "krr":
            return 1.0 / (1.0 + (self.domain_size - 1) * math.exp(-self.epsilon))
        return 0.5

    @property
    def q(self) -> float:
        """Probability that the report supports a given other value."""
        if self.mechanism == "krr":
            return math.exp(-self.epsilon) * self.p
        return 1.0 / (1.0 + math.exp(self.epsilon))

    def randomize(self, values: NDArray[np.int64], bits: BitSource) -> NDArray[np.int64] | NDArray[np.bool_]:
        """Reports of ``values``: one value each (``krr``), or a ``(n, k)`` bit matrix (``oue``)."""
        values = np.asarray(values, dtype=np.int64)
        if values.ndim != 1 or (values.size and (values.min() < 0 or values.max() >= self.domain_size)):
            raise ValueError(f"values must be a 1-d array of indices in [0, {self.domain_size})")
        numerator, denominator = Fraction(self.epsilon).as_integer_ratio()
        if self.mechanism == "krr":
            out = np.empty(values.size, dtype=np.int64)
            pending = np.arange(values.size)
            while pending.size:
                candidate = uniform_below(np.full(pending.size, np.uint64(self.domain_size)), bits).astype(np.int64)
                other = np.flatnonzero(candidate != values[pending])
                kept = np.ones(pending.size, dtype=bool)
                kept[other] = bernoulli_exp(np.full(other.size, np.uint64(numerator)), np.uint64(denominator), bits)
                out[pending[kept]] = candidate[kept]
                pending = pending[~kept]
            return out
        cells = values.size * self.domain_size
        report = np.zeros(cells, dtype=bool)
        pending = np.arange(cells)
        while pending.size:  # Bernoulli(q) per cell: a fair coin whose 1 survives an exp(-eps) coin
            one = bernoulli_half(pending.size, bits)
            ones = np.flatnonzero(one)
            kept = np.ones(pending.size, dtype=bool)
            kept[ones] = bernoulli_exp(np.full(ones.size, np.uint64(numerator)), np.uint64(denominator), bits)
            report[pending[kept]] = one[kept]
            pending = pending[~kept]
        matrix = report.reshape(values.size, self.domain_size)
        matrix[np.arange(values.size), values] = bernoulli_half(values.size, bits)  # the true bit: p = 1/2
        return matrix

    def support_counts(self, reports: NDArray[np.int64] | NDArray[np.bool_]) -> NDArray[np.int64]:
        """``c_v``: how many reports support each value."""
        if self.mechanism == "krr":
            return np.bincount(np.asarray(reports, dtype=np.int64), minlength=self.domain_size).astype(np.int64)
        return np.asarray(reports, dtype=bool).sum(axis=0).astype(np.int64)

    def estimate(self, support: NDArray[np.int64], reports: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Unbiased frequency estimates from the support counts of ``reports`` reports, and their variances."""
        support = np.asarray(support, dtype=np.float64)
        p, q = self.p, self.q
        estimate = (support - reports * q) / (p - q)
        base = reports * q * (1 - q) / (p - q) ** 2
        variance = base + np.clip(estimate, 0, reports) * (1 - p - q) / (p - q)
        return estimate, variance

    def estimate_bounds(self, reports: int) -> tuple[float, float]:
        """(smallest, largest) variance of one value's estimate among ``reports`` reports, over its frequency."""
        p, q = self.p, self.q
        base = reports * q * (1 - q) / (p - q) ** 2
        spread = reports * (1 - p - q) / (p - q)
        return min(base, base + spread), max(base, base + spread)


def report_tag(randomizer: LocalRandomizer, domain: Sequence[str | int]) -> str:
    """``mechanism:epsilon:k:domain``, what made a report.

    E.g. ``krr:0x1.0000000000000p+1:4:bb037af03d977ec8``: k-ary randomized response at epsilon 2 over
    ``["a", "b", "c", "d"]``.

    ``epsilon`` is the randomizer's epsilon as ``float.hex`` (exact, so two settings that print alike still
    differ), ``k`` the domain size and ``domain`` the first 16 hex digits of the SHA-256 of the domain as a
    compact JSON array, in its order (``groups.public``). A report is a report of the worker's randomizer
    only if every part agrees: at another epsilon or over another domain its debiasing would be wrong, and
    an event with no tag at all is most likely a true value.
    """
    digest = hashlib.sha256(orjson.dumps(list(domain))).hexdigest()[:16]
    return f"{randomizer.mechanism}:{float(randomizer.epsilon).hex()}:{randomizer.domain_size}:{digest}"


@dataclass(frozen=True, slots=True)
class UnaryReports:
    """How the worker holds and adds up unary (``oue``) reports.

    A kept report is held as its bits over the domain, packed eight to a byte (value ``v`` is bit ``v % 8``
    of byte ``v // 8``): ``ceil(k / 8)`` bytes whatever the report lists (at most ``k`` values), 512 at a
    4,096-value domain where a float per value would take 32 KiB. A group's feature sum is the support
    count of every value (what ``estimate`` debiases).

    A partial's ``features`` for a local_dp oue query (``WindowPartial`` tells it from a vector
    ``FeatureSpec``): one report per unit and window is kept, so a pair's row is its report, and its
    group's sums are counts.
    """

    width: int
    kind: str = "oue_reports"
    #: Reports unpacked at a time when they are added up: a few MiB however many there are.
    chunk_rows: int = 1024

    @property
    def dimensions(self) -> int:
        return self.width

    @property
    def packed_width(self) -> int:
        return (self.width + 7) // 8

    def pack(self, rows: NDArray[np.int64], values: NDArray[np.int64], n: int) -> NDArray[np.uint8]:
        """``n`` packed reports, report ``rows[i]`` supporting value ``values[i]`` (each pair listed once)."""
        rows, values = np.asarray(rows, dtype=np.int64), np.asarray(values, dtype=np.int64)
        packed = np.zeros(n * self.packed_width, dtype=np.uint8)
        bits = np.left_shift(np.uint8(1), (values & 7).astype(np.uint8))
        np.bitwise_or.at(packed, rows * self.packed_width + (values >> 3), bits)
        return packed.reshape(n, self.packed_width)

    def unpack(self, packed: NDArray[np.uint8]) -> NDArray[np.uint8]:
        """The 0/1 rows ``(n, width)`` of packed reports."""
        return np.unpackbits(packed, axis=1, count=self.width, bitorder="little")

    def group_sums(
        self, reports: NDArray[np.uint8], pair_count: NDArray[np.int64], pair_group: NDArray[np.int64],
        n_groups: int, keep: NDArray[np.bool_] | None = None,
    ) -> NDArray[np.float64]:
        """``(n_groups, width)`` support counts of the packed ``reports`` of pairs (``keep``: those kept).

        Counts are integers, so they are exact and the same in any order of addition; they are returned
        as the float64 sums a vector query's features are.
        """
        if reports.dtype != np.uint8 or reports.ndim != 2 or reports.shape[1] != self.packed_width:
            raise ValueError(
                f"unary reports are held as ({self.packed_width},) packed bytes each, got {reports.dtype} of shape "
                f"{reports.shape}; build the partial with an engine reading the query's report field"
            )
        if len(pair_count) != len(reports) or (pair_count != 1).any():
            raise ValueError(
                "a unary report is kept whole, one per unit and window: the query needs bounds "
                "{max_groups_per_unit: 1, max_events_per_group: 1}"
            )
        rows = np.arange(len(reports)) if keep is None else np.flatnonzero(keep)
        counts = np.zeros((n_groups, self.width), dtype=np.int64)
        for first in range(0, len(rows), self.chunk_rows):
            chunk = rows[first:first + self.chunk_rows]
            group = np.asarray(pair_group)[chunk]
            order = np.argsort(group, kind="stable")
            starts = np.flatnonzero(np.r_[True, group[order][1:] != group[order][:-1]])
            bits = self.unpack(reports[chunk[order]])
            counts[group[order][starts]] += np.add.reduceat(bits, starts, axis=0, dtype=np.int64)
        return counts.astype(np.float64)
