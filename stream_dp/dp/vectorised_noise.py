"""A second production :class:`~stream_dp.dp.noise.NoiseSource`: OpenDP's laws, drawn vectorised.

:class:`VectorisedExactNoise` draws the discrete Laplace noise of OpenDP's
``make_laplace`` measurements with the exact samplers of
:mod:`stream_dp.dp.exact_sampling` (Canonne, Kamath & Steinke 2020) on numpy
arrays, from kernel CSPRNG bits: about a hundred times faster than one FFI call
per draw, and the *same distribution*, so the privacy cost that
:mod:`stream_dp.dp.calibration` reads from OpenDP's measurement still applies.

What "the same" means, from OpenDP 0.16's source (``measurements/noise``):

* integers: ``x + Z``, ``Z ~ P(z) ~ exp(-|z| / scale)``, with the float
  ``scale`` taken as the exact rational it is, and the sum *saturating* at the
  int64 bounds (``then_saturating_cast``);
* floats with grid ``2^k`` (``make_float_to_bigint`` then
  ``then_deintegerize_vec``): each input is clamped to the finite range, rounded
  to the nearest multiple of ``2^k`` with ties toward +infinity
  (``find_nearest_multiple_of_2k`` returns the largest minimiser), discrete
  Laplace of scale ``scale * 2^-k`` is added to the integer index, and the
  index times ``2^k`` is rounded to the nearest float, ties to even (dashu's
  ``to_f64``; overflow gives +-infinity).

With an executor, a long vector's draws are split in two halves drawn on two of
its threads at once: the draws are independent and identically distributed, so
which thread draws which coordinate changes nothing of their law; most of the
sampler's time is in numpy operations and ``os.urandom``, which release the GIL.

Discrete Gaussian noise, noisy top-k, and scales whose exact fraction would
overflow uint64 are delegated to an :class:`~stream_dp.dp.noise.OpenDPNoise`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Executor
from contextlib import contextmanager
from typing import Any

import numpy as np
from numpy.typing import NDArray

from stream_dp.dp.exact_sampling import (
    INT64_SAFE,
    BitSource,
    UnsupportedScale,
    UrandomBits,
    discrete_laplace,
    laplace_scale_fraction,
)
from stream_dp.dp.measurements import NoiseKind
from stream_dp.dp.noise import NoiseSource, OpenDPNoise
from stream_dp.dp.noise_stash import DrawKey, NoiseStash

NOISE_SAMPLERS = ("exact", "opendp")
"""Names of the production noise sources (the worker's ``STREAM_DP_NOISE_SAMPLER``)."""

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_FLOAT64_MAX = float(np.finfo(np.float64).max)
_SMALLEST_NORMAL = float(np.finfo(np.float64).tiny)
# OpenDP refuses grids finer than the smallest subnormal step 2^-1074 (get_min_k).
_FINEST_GRID_K = -1074
#: Vectors at least this long are drawn in two halves on two executor threads.
SPLIT_DRAW_MIN = 1 << 16


class VectorisedExactNoise:
    """Discrete Laplace noise from exact vectorised samplers; the rest from OpenDP.

    :param bits: source of random 64-bit words; production leaves it ``None``
        (``os.urandom``). Tests may inject deterministic words.
    :param fallback: serves Gaussian noise, top-k and out-of-range scales;
        defaults to ``OpenDPNoise(executor=executor)``.
    :param executor: handed to the default fallback (OpenDP's FFI releases the GIL), and draws the two
        halves of a long vector at once (at least two threads; see the module docstring).
    """

    def __init__(
        self,
        *,
        bits: BitSource | None = None,
        fallback: NoiseSource | None = None,
        executor: Executor | None = None,
    ) -> None:
        self._bits: BitSource = bits if bits is not None else UrandomBits()
        self._fallback: NoiseSource = fallback if fallback is not None else OpenDPNoise(executor=executor)
        self._executor = executor
        self._stash = NoiseStash()
        self._context = threading.local()  # the owner whose release this thread builds, and its draws

    @contextmanager
    def drawing_for(self, owner: str) -> Iterator[list[DrawKey]]:
        """In this thread, until the block ends: discrete Laplace vectors come from ``owner``'s stash when it
        holds one of their scale and length (see :mod:`stream_dp.dp.noise_stash`), and the list yielded
        collects the key of every vector drawn, for ``predraw``."""
        drawn: list[DrawKey] = []
        self._context.owner, self._context.drawn = owner, drawn
        try:
            yield drawn
        finally:
            self._context.owner = self._context.drawn = None

    def predraw(self, owner: str, keys: list[DrawKey]) -> bool:
        """Draw the vectors ``keys`` name into ``owner``'s stash, replacing what it held; False (and nothing
        drawn) while another draw for ``owner`` is under way. Blocks for the draw: call it from a thread."""
        if not self._stash.start_drawing(owner):
            return False
        try:  # not through ``_laplace``: its halves would wait for the executor's threads, which draws may hold
            drawn = [(key, discrete_laplace(key[2], key[0], key[1], self._bits)) for key in keys]
        except BaseException:
            self._stash.abandon(owner)
            raise
        self._stash.fill(owner, drawn)
        return True

    def stashed(self, owner: str) -> int:
        """How many vectors wait in ``owner``'s stash."""
        return self._stash.held(owner)

    def integers(self, values: NDArray[np.int64], *, kind: NoiseKind, scale: float) -> NDArray[np.int64]:
        values = _one_dimensional(np.ascontiguousarray(values, dtype=np.int64))
        fraction = self._laplace_fraction(kind, scale, 0)
        if fraction is None:
            return self._fallback.integers(values, kind=kind, scale=scale)
        noise, huge = self._laplace(values.size, fraction)
        return add_integer_noise(values, noise, huge)

    def floats(
        self, values: NDArray[np.float64], *, kind: NoiseKind, scale: float, k: int
    ) -> NDArray[np.float64]:
        values = _one_dimensional(np.ascontiguousarray(values, dtype=np.float64))
        fraction = self._laplace_fraction(kind, scale, k) if k >= _FINEST_GRID_K else None
        if fraction is None:
            return self._fallback.floats(values, kind=kind, scale=scale, k=k)
        noise, huge = self._laplace(values.size, fraction)
        return add_grid_noise(values, k, noise, huge)

    def _laplace(self, n: int, fraction: tuple[int, int]) -> tuple[NDArray[np.int64], dict[int, int]]:
        """``n`` discrete Laplace draws of scale ``t / s``: from the stash of the owner this thread draws for
        when it holds such a vector, else drawn here, in two halves on the executor when ``n`` is large."""
        t, s = fraction
        owner = getattr(self._context, "owner", None)
        if owner is not None:
            key = (t, s, n)
            self._context.drawn.append(key)
            ready = self._stash.take(owner, key)
            if ready is not None:
                return ready
        if self._executor is None or n < SPLIT_DRAW_MIN:
            return discrete_laplace(n, t, s, self._bits)
        half = n // 2
        first, second = self._executor.map(lambda size: discrete_laplace(size, t, s, self._bits), (half, n - half))
        huge = {**first[1], **{half + index: draw for index, draw in second[1].items()}}
        return np.concatenate([first[0], second[0]]), huge

    def top_k(self, scores: NDArray[np.int64], *, k: int, scale: float) -> NDArray[np.int64]:
        return self._fallback.top_k(scores, k=k, scale=scale)

    def words(self, n: int) -> NDArray[np.uint64]:
        return self._bits(n)

    @staticmethod
    def _laplace_fraction(kind: NoiseKind, scale: float, k: int) -> tuple[int, int] | None:
        """``scale * 2^-k`` as ``(t, s)``, or ``None`` when OpenDP must serve the request."""
        if kind != "laplace":
            return None
        try:
            return laplace_scale_fraction(scale, k)
        except UnsupportedScale:
            return None


def noise_source(sampler: str, *, executor: Executor | None = None) -> NoiseSource:
    """The production noise source named ``sampler`` (one of :data:`NOISE_SAMPLERS`).

    Both draw the distributions of the OpenDP measurements that calibration
    certifies; ``executor`` spreads OpenDP's FFI calls over threads.
    """
    if sampler == "exact":
        return VectorisedExactNoise(executor=executor)
    if sampler == "opendp":
        return OpenDPNoise(executor=executor)
    raise ValueError(f"unknown noise sampler {sampler!r}; use one of {', '.join(NOISE_SAMPLERS)}")


def _one_dimensional(values: NDArray[Any]) -> NDArray[Any]:
    if values.ndim != 1:
        raise ValueError(f"noise is added to 1-d vectors, got shape {values.shape}; flatten the array first")
    return values


def add_integer_noise(values: NDArray[np.int64], noise: NDArray[np.int64], huge: dict[int, int]) -> NDArray[np.int64]:
    """``values + noise`` saturating at the int64 bounds, as OpenDP's ``then_saturating_cast``.

    ``huge`` holds the noise draws too large for int64 (their slot in ``noise`` is 0); values or
    noise of magnitude ``>= 2^62`` are added on Python ints.
    """
    risky = (values >= INT64_SAFE) | (values <= -INT64_SAFE)
    noisy = values + np.where(risky, 0, noise)  # |value|, |noise| < 2^62: no int64 overflow
    for index in set(np.flatnonzero(risky).tolist()) | huge.keys():
        exact = int(values[index]) + huge.get(index, int(noise[index]))
        noisy[index] = min(max(exact, _INT64_MIN), _INT64_MAX)
    return noisy


def add_grid_noise(values: NDArray[np.float64], k: int, noise: NDArray[np.int64], huge: dict[int, int]
                   ) -> NDArray[np.float64]:
    """``values`` rounded to the grid ``2^k`` plus ``noise`` grid steps, back as floats (as OpenDP rounds).

    ``huge`` as in :func:`add_integer_noise`.
    """
    if np.isnan(values).any():
        raise ValueError("float values to noise must not be NaN; clip or drop NaN before the release")
    indices, big_indices = round_to_grid(values, k)
    big = np.zeros(values.size, dtype=bool)
    big[list(big_indices)] = True
    noisy_indices = indices + np.where(big, 0, noise)  # both below 2^62 in magnitude: no overflow
    exact = {index: big_indices.get(index, int(indices[index])) + huge.get(index, int(noise[index]))
             for index in big_indices.keys() | huge.keys()}
    return grid_to_floats(noisy_indices, exact, k)


def round_to_grid(values: NDArray[np.float64], k: int) -> tuple[NDArray[np.int64], dict[int, int]]:
    """Index of the nearest multiple of ``2^k`` to each value, ties toward +infinity, as OpenDP rounds.

    Infinities are clamped to the largest finite float first (OpenDP does the
    same). Returns int64 indices, and ``{position: index}`` as Python ints for
    the indices of magnitude ``>= 2^62`` (their int64 slot holds 0).
    """
    clamped = np.clip(values, -_FLOAT64_MAX, _FLOAT64_MAX)
    with np.errstate(over="ignore"):
        scaled = np.ldexp(clamped, -k)  # exact unless it overflows (handled below) or underflows (rounds to 0 anyway)
    small = np.abs(scaled) < INT64_SAFE  # False for inf
    floor = np.floor(np.where(small, scaled, 0.0))
    # scaled - floor is exact (Sterbenz) except for -0.5 < scaled < 0, where it is > 0.5 either way
    indices = floor.astype(np.int64) + ((np.where(small, scaled, 0.0) - floor) >= 0.5)
    big: dict[int, int] = {}
    for position in np.flatnonzero(~small).tolist():
        numerator, denominator = float(clamped[position]).as_integer_ratio()
        if k < 0:
            numerator <<= -k
        else:
            denominator <<= k
        big[position] = (2 * numerator + denominator) // (2 * denominator)  # floor(x / 2^k + 1/2)
    return indices, big


def grid_to_floats(indices: NDArray[np.int64], exact: dict[int, int], k: int) -> NDArray[np.float64]:
    """``index * 2^k`` rounded to the nearest float, ties to even; ``exact`` overrides positions with Python ints."""
    out = np.ldexp(indices.astype(np.float64), k)  # astype rounds ties to even; ldexp is exact for normal results
    # subnormal results would be rounded twice: redo them (and the Python-int positions) exactly
    redo = np.flatnonzero((np.abs(out) < _SMALLEST_NORMAL) & (indices != 0)).tolist()
    for position in set(redo) | exact.keys():
        out[position] = _int_times_2k_to_float(exact.get(position, int(indices[position])), k)
    return out


def _int_times_2k_to_float(index: int, k: int) -> float:
    """Correctly rounded (ties to even) ``index * 2^k``, +-infinity when out of range."""
    try:
        return index / (1 << -k) if k < 0 else float(index << k)  # int / int is correctly rounded in Python
    except OverflowError:
        return float("inf") if index > 0 else float("-inf")
