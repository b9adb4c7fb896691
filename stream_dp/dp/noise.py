"""The injectable source of secure noise.

:class:`OpenDPNoise` is the only production implementation: every sample comes
from OpenDP's Rust samplers (never Python's ``random`` nor numpy's generator).
It caches measurements per ``(kind, scale, grid, size)`` and noises long
vectors in chunks, optionally on an injected executor: OpenDP's FFI calls
release the GIL, so a thread pool spreads one release over several cores.

Chunking does not change the mechanism: OpenDP's vector measurements add
independent noise to each coordinate (after rounding each coordinate on its
own for floats), so noising ``x[:c]`` and ``x[c:]`` separately draws from the
same distribution as noising ``x`` at once. The privacy cost is certified on
the whole vector by :mod:`stream_dp.dp.calibration`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Executor
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from stream_dp.dp.exact_sampling import UrandomBits
from stream_dp.dp.measurements import (
    NoiseKind,
    float_vector_measurement,
    integer_vector_measurement,
    top_k_measurement,
)


class NoiseSource(Protocol):
    """What a release plan needs from a noise source."""

    def integers(self, values: NDArray[np.int64], *, kind: NoiseKind, scale: float) -> NDArray[np.int64]:
        """``values`` plus discrete Laplace / discrete Gaussian noise of ``scale``."""
        ...

    def floats(
        self, values: NDArray[np.float64], *, kind: NoiseKind, scale: float, k: int
    ) -> NDArray[np.float64]:
        """``values`` rounded to ``2^k`` plus Laplace / Gaussian noise of ``scale`` on that grid."""
        ...

    def top_k(self, scores: NDArray[np.int64], *, k: int, scale: float) -> NDArray[np.int64]:
        """Indices of ``k`` scores chosen by report-noisy-max (permute-and-flip), best first."""
        ...

    def words(self, n: int) -> NDArray[np.uint64]:
        """``n`` uniform random 64-bit words (the exact samplers' bits, e.g. the staircase's)."""
        ...


class OpenDPNoise:
    """Secure noise from OpenDP measurements.

    :param executor: runs the chunks of one vector concurrently (e.g. a
        ``ThreadPoolExecutor`` with one worker per core); ``None`` runs them in
        the calling thread.
    :param chunk_size: most elements per OpenDP call; a vector is cut into
        equal chunks no longer than this.
    :param cache_size: measurements kept (least recently used are dropped).
    """

    def __init__(
        self,
        *,
        executor: Executor | None = None,
        chunk_size: int = 8_192,
        cache_size: int = 64,
    ) -> None:
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}; the default is 8192")
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 1:
            raise ValueError(f"cache_size must be a positive int, got {cache_size!r}; the default is 64")
        self._executor = executor
        self._chunk_size = chunk_size
        self._cache_size = cache_size
        self._cache: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()
        self._words = UrandomBits()  # OpenDP has no staircase: its exact sampler takes kernel CSPRNG words

    def integers(self, values: NDArray[np.int64], *, kind: NoiseKind, scale: float) -> NDArray[np.int64]:
        values = np.ascontiguousarray(values, dtype=np.int64)
        measurement = self._measurement(("int", kind, scale), lambda: integer_vector_measurement(kind, scale))
        return self._noise_in_chunks(values, lambda _size: measurement, np.int64)

    def floats(
        self, values: NDArray[np.float64], *, kind: NoiseKind, scale: float, k: int
    ) -> NDArray[np.float64]:
        values = np.ascontiguousarray(values, dtype=np.float64)

        def for_size(size: int) -> Any:
            return self._measurement(
                ("float", kind, scale, k, size), lambda: float_vector_measurement(kind, scale, k, size)
            )

        return self._noise_in_chunks(values, for_size, np.float64)

    def top_k(self, scores: NDArray[np.int64], *, k: int, scale: float) -> NDArray[np.int64]:
        scores = np.ascontiguousarray(scores, dtype=np.int64)
        if scores.size == 0:
            return np.empty(0, dtype=np.int64)
        measurement = self._measurement(("top_k", k, scale), lambda: top_k_measurement(k, scale))
        return np.asarray(measurement(scores), dtype=np.int64)

    def words(self, n: int) -> NDArray[np.uint64]:
        return self._words(n)

    def _measurement(self, key: Hashable, build: Callable[[], Any]) -> Any:
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                return cached
        built = build()
        with self._lock:
            self._cache[key] = built
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return built

    def _noise_in_chunks(
        self,
        values: NDArray[Any],
        measurement_for_size: Callable[[int], Any],
        dtype: type[np.generic],
    ) -> NDArray[Any]:
        if values.ndim != 1:
            raise ValueError(f"noise is added to 1-d vectors, got shape {values.shape}; flatten the array first")
        if values.size == 0:
            return np.empty(0, dtype=dtype)
        # equal chunks of at most chunk_size, so that threads get balanced work
        chunks = np.array_split(values, -(-values.size // self._chunk_size))
        jobs = [(measurement_for_size(chunk.size), chunk) for chunk in chunks]
        if self._executor is None or len(jobs) == 1:
            outputs = [measurement(chunk) for measurement, chunk in jobs]
        else:
            outputs = list(self._executor.map(lambda job: job[0](job[1]), jobs))
        noisy = np.concatenate([np.asarray(out, dtype=dtype) for out in outputs])
        if noisy.shape != values.shape:
            raise RuntimeError(
                f"OpenDP returned {noisy.size} noisy values for {values.size} inputs; nothing is released"
            )
        return noisy
