"""Exact samplers of Canonne, Kamath & Steinke, vectorised over numpy arrays.

Reference: C. Canonne, G. Kamath, T. Steinke, "The Discrete Gaussian for
Differential Privacy", NeurIPS 2020 (arXiv:2004.00010), Section 5: every
probability is a ratio of integers and every coin is drawn from uniform random
integers, so the output law is exactly the stated one -- no floating point
ever touches a probability. OpenDP's ``traits/samplers/cks20`` implements the
same algorithms one sample at a time on big integers; here one numpy operation
serves every sample still running, and the rare sample whose integers would
leave ``uint64`` finishes the *same* computation on Python integers (which
never overflow), so no draw is truncated or restarted.

The random bits come from an injected ``bits(n) -> uint64[n]`` callable;
production uses :class:`UrandomBits` (the kernel CSPRNG). Tests inject
deterministic words to exercise each path.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import numpy as np
from numpy.typing import NDArray

BitSource = Callable[[int], NDArray[np.uint64]]

_U64_MAX = (1 << 64) - 1
# Largest discrete Laplace scale numerator / denominator the vectorised path accepts:
# with t <= 2^56 the Bernoulli(u / (t k)) coins fit uint64 up to k = 256 and
# u + t v fits for v <= 255; longer runs (probability < 1/256! resp. e^-256)
# finish on Python integers.
MAX_SCALE_NUMERATOR = 1 << 56
MAX_SCALE_DENOMINATOR = 1 << 63
# Noise magnitudes at or above this are carried as Python ints so that adding a
# value of the same size cannot overflow int64.
INT64_SAFE = 1 << 62


class UnsupportedScale(ValueError):
    """The scale's exact fraction is outside the range the vectorised sampler supports."""


class UrandomBits:
    """Random 64-bit words from ``os.urandom`` (the kernel CSPRNG), read in large blocks.

    Thread-safe: one lock guards the buffer, so two threads never get the same words.
    """

    def __init__(self, block_words: int = 1 << 17) -> None:
        if block_words < 1:
            raise ValueError(f"block_words must be positive, got {block_words}")
        self._block_words = block_words
        self._buffer = np.empty(0, dtype=np.uint64)
        self._lock = threading.Lock()

    def __call__(self, n: int) -> NDArray[np.uint64]:
        with self._lock:
            if n > self._buffer.size:
                fresh = max(n - self._buffer.size, self._block_words)
                block = np.frombuffer(os.urandom(8 * fresh), dtype=np.uint64)
                self._buffer = np.concatenate([self._buffer, block])
            words, self._buffer = self._buffer[:n], self._buffer[n:]
        return words


def laplace_scale_fraction(scale: float, k: int = 0) -> tuple[int, int]:
    """``scale * 2^-k`` as a reduced fraction ``t / s`` (a float is exactly ``m 2^e``).

    :raises UnsupportedScale: if ``t > 2^56`` or ``s > 2^63`` (roughly scales
        above 7.2e16 or below 1e-19 grid units), where ``uint64`` arithmetic
        could overflow; :class:`~stream_dp.dp.noise.OpenDPNoise` handles those.
    """
    if not (isinstance(scale, float | int) and np.isfinite(scale) and scale > 0):
        raise UnsupportedScale(
            f"the vectorised sampler needs a positive finite scale, got {scale!r}; OpenDPNoise decides what "
            "other scales mean"
        )
    numerator, denominator = float(scale).as_integer_ratio()  # reduced; denominator is 2^j
    if k < 0:
        numerator <<= -k
    else:
        denominator <<= k
    while numerator % 2 == 0 and denominator % 2 == 0:
        numerator //= 2
        denominator //= 2
    if numerator > MAX_SCALE_NUMERATOR or denominator > MAX_SCALE_DENOMINATOR:
        raise UnsupportedScale(
            f"scale {scale!r} on the grid 2^{k} is the fraction {numerator}/{denominator}; the vectorised "
            f"sampler supports numerators up to 2^56 and denominators up to 2^63 (scales from about "
            f"5.4e-20 to 7.2e16 grid units); use OpenDPNoise for this scale"
        )
    return numerator, denominator


# --- uniform integers -----------------------------------------------------------------


def uniform_below(bound: NDArray[np.uint64], bits: BitSource, *, word_bits: int = 64) -> NDArray[np.uint64]:
    """Uniform integers in ``[0, bound)`` per element, by rejection (no modulo bias).

    A ``word_bits``-bit word ``w`` is accepted when ``w < R - (R mod bound)``
    with ``R = 2^word_bits``; the accepted range holds every residue equally
    often, so ``w mod bound`` is uniform. ``word_bits`` below 64 is for tests.
    """
    bound = np.asarray(bound, dtype=np.uint64)
    if np.any(bound == 0):
        raise ValueError("uniform_below needs bounds of at least 1")
    if word_bits == 64:
        # R mod b == (R - b) mod b, and R - b wraps correctly in uint64 (array ops wrap silently)
        remainder = (np.zeros_like(bound) - bound) % bound
        limit = np.zeros_like(bound) - remainder  # R - remainder, 0 standing for "accept all"
    else:
        span = np.uint64(1 << word_bits)
        remainder = span % bound
        limit = span - remainder
    mask = np.uint64(_U64_MAX if word_bits == 64 else (1 << word_bits) - 1)
    out = np.empty_like(bound)
    pending = np.arange(bound.size)
    while pending.size:
        words = bits(pending.size) & mask
        accepted = (remainder[pending] == 0) | (words < limit[pending])
        chosen = pending[accepted]
        out[chosen] = words[accepted] % bound[chosen]
        pending = pending[~accepted]
    return out


def uniform_below_int(bound: int, bits: BitSource) -> int:
    """As :func:`uniform_below` for one Python-int bound of any size (several words per try)."""
    if bound < 1:
        raise ValueError("uniform_below_int needs a bound of at least 1")
    words = -(-bound.bit_length() // 64) + 1  # one spare word keeps rejections rare
    span = 1 << (64 * words)
    limit = span - span % bound
    while True:
        value = int.from_bytes(bits(words).tobytes(), "little")
        if value < limit:
            return value % bound


# --- Bernoulli coins ------------------------------------------------------------------


def bernoulli_half(n: int, bits: BitSource) -> NDArray[np.bool_]:
    """``n`` fair coins, the low bit of one word each."""
    return (bits(n) & np.uint64(1)).astype(bool)


def bernoulli_rational(numerator: NDArray[np.uint64], denominator: NDArray[np.uint64], bits: BitSource
                       ) -> NDArray[np.bool_]:
    """Bernoulli(``numerator / denominator``) per element, ``0 <= numerator <= denominator``.

    With one denominator ``d`` for all elements (every call in this module),
    no division per element: a word ``w`` is kept when ``w < d q`` with
    ``q = floor(2^64 / d)``, so ``floor(w / q)`` is uniform in ``[0, d)``, and
    ``floor(w / q) < n`` exactly when ``w < n q``.
    """
    numerator = np.asarray(numerator, dtype=np.uint64)
    if np.ndim(denominator) != 0:
        return uniform_below(denominator, bits) < numerator
    d = int(denominator)
    if d < 1:
        raise ValueError("bernoulli_rational needs a denominator of at least 1")
    if d == 1:  # numerator is 0 or 1: no coin to flip
        return numerator == np.uint64(1)
    q = (1 << 64) // d
    accept_all = d * q == 1 << 64  # d is a power of two: every word is kept
    limit, step = np.uint64((d * q) & _U64_MAX), np.uint64(q)
    certain = numerator == np.uint64(d)  # n q may be 2^64, which uint64 cannot hold
    threshold = numerator * step  # wraps only where certain
    out = np.empty(numerator.size, dtype=bool)
    pending = np.arange(numerator.size)
    while pending.size:
        words = bits(pending.size)
        kept = np.ones(pending.size, dtype=bool) if accept_all else words < limit
        chosen = pending[kept]
        out[chosen] = certain[chosen] | (words[kept] < threshold[chosen])
        pending = pending[~kept]
    return out


def bernoulli_exp_fraction(numerator: NDArray[np.uint64], denominator: NDArray[np.uint64], bits: BitSource
                           ) -> NDArray[np.bool_]:
    """Bernoulli(exp(-gamma)) for ``gamma = numerator / denominator`` in ``[0, 1]`` (CKS20, Algorithm 1).

    Draw ``A_k ~ Bernoulli(gamma / k)`` for ``k = 1, 2, ...`` until the first
    failure at ``K``; ``P(K odd) = exp(-gamma)``. The coin ``gamma / k`` is
    ``numerator / (denominator k)``; a run whose ``denominator k`` would leave
    uint64 continues on Python ints.
    """
    numerator = np.asarray(numerator, dtype=np.uint64)
    denominator = np.broadcast_to(np.asarray(denominator, dtype=np.uint64), numerator.shape)
    if np.any(numerator > denominator):
        raise ValueError("bernoulli_exp_fraction needs gamma = numerator / denominator in [0, 1]")
    k_limit = np.uint64(_U64_MAX) // denominator  # largest k with denominator * k in uint64
    # one coin denominator per round when all elements share one (every call in this module)
    shared = int(denominator[0]) if numerator.size and (denominator == denominator[0]).all() else None
    stopped_at = np.zeros(numerator.size, dtype=np.uint64)
    k = np.uint64(1)
    pending = np.arange(numerator.size)
    while pending.size:
        overflowing = k > k_limit[pending]
        for index in pending[overflowing]:
            stopped_at[index] = _exp_fraction_run_from(int(numerator[index]), int(denominator[index]), int(k), bits)
        pending = pending[~overflowing]
        if pending.size == 0:
            break
        coin_denominator = np.uint64(shared * int(k)) if shared is not None else denominator[pending] * k
        success = bernoulli_rational(numerator[pending], coin_denominator, bits)
        stopped_at[pending[~success]] = k
        pending = pending[success]
        k += np.uint64(1)
    return (stopped_at & np.uint64(1)).astype(bool)


def _exp_fraction_run_from(numerator: int, denominator: int, k: int, bits: BitSource) -> int:
    """The rest of :func:`bernoulli_exp_fraction`'s run from coin ``k``, on Python ints: returns ``K``."""
    while uniform_below_int(denominator * k, bits) < numerator:
        k += 1
    return k


def bernoulli_exp(numerator: NDArray[np.uint64], denominator: NDArray[np.uint64], bits: BitSource
                  ) -> NDArray[np.bool_]:
    """Bernoulli(exp(-gamma)) for any rational ``gamma = numerator / denominator >= 0`` (CKS20, Algorithm 1).

    ``exp(-gamma) = exp(-1)^floor(gamma) exp(-(gamma - floor(gamma)))``: the
    coin succeeds when ``floor(gamma)`` Bernoulli(exp(-1)) coins and one
    Bernoulli(exp(-fractional part)) coin all succeed.
    """
    numerator = np.asarray(numerator, dtype=np.uint64)
    denominator = np.broadcast_to(np.asarray(denominator, dtype=np.uint64), numerator.shape)
    whole, fraction = numerator // denominator, numerator % denominator
    alive = np.ones(numerator.size, dtype=bool)
    remaining = whole.copy()
    while True:
        running = np.flatnonzero(alive & (remaining > 0))
        if running.size == 0:
            break
        alive[running] = bernoulli_exp_fraction(np.ones(running.size, np.uint64), np.uint64(1), bits)
        remaining[running] -= np.uint64(1)
    survivors = np.flatnonzero(alive)
    alive[survivors] = bernoulli_exp_fraction(fraction[survivors], denominator[survivors], bits)
    return alive


def geometric_exp_minus_one(n: int, bits: BitSource) -> NDArray[np.uint64]:
    """Successes before the first failure of Bernoulli(exp(-1)) coins: ``P(V = v) = (1 - 1/e) e^-v``."""
    counts = np.zeros(n, dtype=np.uint64)
    pending = np.arange(n)
    while pending.size:
        success = bernoulli_exp_fraction(np.ones(pending.size, np.uint64), np.uint64(1), bits)
        pending = pending[success]
        counts[pending] += np.uint64(1)
    return counts


# --- discrete Laplace -----------------------------------------------------------------


def geometric(n: int, scale_numerator: int, scale_denominator: int, bits: BitSource
              ) -> tuple[NDArray[np.int64], dict[int, int]]:
    """``n`` draws of ``P(Y = y) ~ exp(-y s / t)`` on ``y >= 0`` for scale ``t / s`` (CKS20, Algorithm 2's core).

    Per draw: ``U`` uniform in ``[0, t)``, kept with probability ``exp(-U/t)``
    (else start over); ``V`` geometric with ``P(V = v) ~ e^-v``; ``X = U + t V``
    is then geometric with ``P(X = x) ~ exp(-x / t)``, and ``Y = floor(X / s)``
    geometric with ``P(Y = y) ~ exp(-y s / t)``.

    :returns: the draws as int64, and ``{index: draw}`` for the draws ``>= 2^62``
        (their int64 slot holds 0) so callers add them exactly.
    :raises UnsupportedScale: outside ``t <= 2^56, s <= 2^63``.
    """
    t, s = scale_numerator, scale_denominator
    if not (1 <= t <= MAX_SCALE_NUMERATOR and 1 <= s <= MAX_SCALE_DENOMINATOR):
        raise UnsupportedScale(f"geometric scale {t}/{s} is outside t <= 2^56, s <= 2^63; use OpenDPNoise")
    t64, s64 = np.uint64(t), np.uint64(s)
    safe_v = np.uint64((_U64_MAX - (t - 1)) // t)  # u + t v fits uint64 for v <= safe_v
    draws = np.zeros(n, dtype=np.int64)
    huge: dict[int, int] = {}
    pending = np.arange(n)
    while pending.size:
        u = uniform_below(np.full(pending.size, t64), bits)
        kept = bernoulli_exp_fraction(u, t64, bits)
        pending_u, u = pending[kept], u[kept]
        v = geometric_exp_minus_one(u.size, bits)
        fits = v <= safe_v
        y = np.where(fits, (u + t64 * np.where(fits, v, 0)) // s64, np.uint64(0))
        small = fits & (y < np.uint64(INT64_SAFE))
        for i in np.flatnonzero(~small):
            huge[int(pending_u[i])] = (int(u[i]) + t * int(v[i])) // s
        draws[pending_u[small]] = y[small].astype(np.int64)
        pending = pending[~kept]
    return draws, huge


def discrete_laplace(n: int, scale_numerator: int, scale_denominator: int, bits: BitSource
                     ) -> tuple[NDArray[np.int64], dict[int, int]]:
    """``n`` draws of ``P(x) ~ exp(-|x| s / t)`` for scale ``t / s`` (CKS20, Algorithm 2).

    A :func:`geometric` magnitude ``Y`` and a fair sign ``B`` give ``(1 - 2B) Y``,
    except that ``B = 1, Y = 0`` starts over (zero would count twice).

    :returns: the draws as int64, and ``{index: draw}`` for the draws with
        ``|draw| >= 2^62`` (their int64 slot holds 0) so callers add them exactly.
    :raises UnsupportedScale: outside ``t <= 2^56, s <= 2^63``.
    """
    draws = np.zeros(n, dtype=np.int64)
    huge: dict[int, int] = {}
    pending = np.arange(n)
    while pending.size:
        magnitude, big = geometric(pending.size, scale_numerator, scale_denominator, bits)
        negative = bernoulli_half(pending.size, bits)
        for i, value in big.items():  # nonzero, so never rejected
            huge[int(pending[i])] = -value if negative[i] else value
        retry = negative & (magnitude == 0)
        for i in big:
            retry[i] = False
        draws[pending] = np.where(negative, -magnitude, magnitude)
        pending = pending[retry]
    return draws, huge
