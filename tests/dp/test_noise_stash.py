"""Noise drawn ahead (``stream_dp.dp.noise_stash``): each vector taken once, by its owner, with the exact law.

The law is checked against OpenDP's own measurement (an independent implementation) with the
two-sample chi-square test of ``test_vectorised_noise``; it fails only below P_MIN = 1e-4.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from stream_dp.dp.exact_sampling import UrandomBits
from stream_dp.dp.measurements import integer_vector_measurement
from stream_dp.dp.vectorised_noise import VectorisedExactNoise
from tests.dp.test_vectorised_noise import OPENDP_DRAWS, P_MIN, two_sample_p_value

N = 50_000


class CountingBits:
    """Kernel CSPRNG words, counted: a release that takes stashed noise draws none."""

    def __init__(self) -> None:
        self.words = 0
        self._bits = UrandomBits()
        self._lock = threading.Lock()

    def __call__(self, n: int) -> np.ndarray:
        with self._lock:
            self.words += n
        return self._bits(n)


def _release(noise: VectorisedExactNoise, owner: str | None, n: int = N, scale: float = 3.0):
    zeros = np.zeros(n, dtype=np.int64)
    if owner is None:
        return noise.integers(zeros, kind="laplace", scale=scale), []
    with noise.drawing_for(owner) as drawn:
        counts = noise.integers(zeros, kind="laplace", scale=scale)
        sums = noise.floats(np.zeros(n), kind="laplace", scale=scale, k=-2)
    return (counts, sums), list(drawn)


def test_a_release_takes_the_vectors_drawn_for_it_once_and_then_draws_its_own():
    bits = CountingBits()
    noise = VectorisedExactNoise(bits=bits)
    first, keys = _release(noise, "q")
    assert [key[2] for key in keys] == [N, N]  # both vectors recorded, with their lengths
    assert noise.predraw("q", keys) and noise.stashed("q") == 2

    before = bits.words
    second, again = _release(noise, "q")
    assert bits.words == before, "the release drew words although its vectors were stashed"
    assert again == keys and noise.stashed("q") == 0  # taken, not copied

    before = bits.words
    third, _ = _release(noise, "q")
    assert bits.words > before  # nothing left: drawn afresh
    for a, b in [(first, second), (second, third)]:  # 50k draws of scale 3 never repeat a whole vector
        assert not np.array_equal(a[0], b[0]) and not np.array_equal(a[1], b[1])


def test_another_owner_and_a_release_outside_drawing_for_never_take_them():
    bits = CountingBits()
    noise = VectorisedExactNoise(bits=bits)
    _, keys = _release(noise, "public")
    noise.predraw("public", keys)
    for owner in ("other", None):
        before = bits.words
        _release(noise, owner)
        assert bits.words > before
    assert noise.stashed("public") == 2


def test_a_vector_of_another_length_or_scale_is_not_taken():
    noise = VectorisedExactNoise()
    _, keys = _release(noise, "q")
    noise.predraw("q", keys)
    _release(noise, "q", n=N + 1)
    _release(noise, "q", scale=4.0)
    assert noise.stashed("q") == 2


def test_a_new_draw_replaces_the_stash_and_only_one_runs_at_a_time():
    noise = VectorisedExactNoise()
    _, keys = _release(noise, "q")
    noise.predraw("q", keys)
    noise.predraw("q", keys[:1])
    assert noise.stashed("q") == 1  # one release's worth at most
    assert noise._stash.start_drawing("q")  # as a draw under way holds it
    assert not noise.predraw("q", keys)
    noise._stash.abandon("q")
    assert noise.predraw("q", keys)


@pytest.mark.parametrize("scale", [0.5, 3.7, 1e4])
def test_stashed_noise_follows_opendps_law(scale: float):
    noise = VectorisedExactNoise()
    samples = []
    for _ in range(4):  # each release takes the vector drawn after the one before
        (counts, _), keys = _release(noise, "q", n=N, scale=scale)
        noise.predraw("q", keys)
        samples.append(counts)
    stashed = np.concatenate(samples[1:])
    theirs = np.asarray(integer_vector_measurement("laplace", scale)(np.zeros(OPENDP_DRAWS, dtype=np.int64)))
    assert two_sample_p_value(stashed, theirs) > P_MIN
