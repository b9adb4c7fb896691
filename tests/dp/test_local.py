"""Local randomizers against their laws, written here from Wang et al. (2017), and their estimators; fed by
the kernel CSPRNG and by the keyed bits a producer draws its memoized reports from.

Statistical tests fail below P_MIN = 1e-4 (a correct randomizer fails one of
these about once in 800 runs); the doctored law (epsilon 20% off) gives
p-values below 1e-20 on the same draws.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
from scipy import stats

from stream_dp.dp.exact_sampling import UrandomBits
from stream_dp.dp.keyed_bits import MIN_SECRET_BYTES, KeyedBits
from stream_dp.dp.local import LocalRandomizer, report_tag

P_MIN = 1e-4


def krr_law(epsilon: float, k: int, truth: int) -> np.ndarray:
    law = np.full(k, 1.0 / (math.exp(epsilon) + k - 1))
    law[truth] = math.exp(epsilon) / (math.exp(epsilon) + k - 1)
    return law


@pytest.mark.parametrize(("epsilon", "k"), [(0.5, 2), (1.0, 5), (3.0, 20)])
def test_randomized_response_reports_the_krr_law(epsilon, k):
    randomizer = LocalRandomizer.build("krr", epsilon, k)
    reports = randomizer.randomize(np.full(200_000, 1), UrandomBits())
    observed = np.bincount(reports, minlength=k)
    assert stats.chisquare(observed, krr_law(epsilon, k, 1) * reports.size).pvalue > P_MIN
    assert stats.chisquare(observed, krr_law(1.2 * epsilon, k, 1) * reports.size).pvalue < 1e-20
    # the probabilities the estimator debiases with are the definition's, whose ratio e^eps makes a report eps-LDP
    assert randomizer.p == pytest.approx(krr_law(epsilon, k, 1)[1], rel=1e-12)
    assert randomizer.q == pytest.approx(krr_law(epsilon, k, 1)[0], rel=1e-12)


@pytest.mark.parametrize("epsilon", [0.5, 2.0])
def test_unary_encoding_sets_bits_with_the_oue_probabilities(epsilon):
    k, n = 8, 30_000
    randomizer = LocalRandomizer.build("oue", epsilon, k)
    reports = randomizer.randomize(np.full(n, 3), UrandomBits())
    q = 1.0 / (math.exp(epsilon) + 1.0)
    assert stats.binomtest(int(reports[:, 3].sum()), n, 0.5).pvalue > P_MIN
    others = np.delete(reports, 3, axis=1)
    assert stats.binomtest(int(others.sum()), others.size, q).pvalue > P_MIN
    assert stats.binomtest(int(others.sum()), others.size, 1.0 / (math.exp(1.2 * epsilon) + 1.0)).pvalue < 1e-20
    # the probabilities the estimator debiases with are the definition's; with them two inputs, which differ
    # in two bits, change a report's probability by at most p (1 - q) / ((1 - p) q) = e^eps
    assert randomizer.p == 0.5
    assert randomizer.q == pytest.approx(q, rel=1e-12)


@pytest.mark.parametrize("mechanism", ["krr", "oue"])
def test_estimates_are_unbiased_with_the_stated_variance(mechanism):
    k, epsilon, repeats = 6, 1.0, 400
    truth = np.array([500, 300, 120, 60, 20, 0])
    values = np.repeat(np.arange(k), truth)
    randomizer = LocalRandomizer.build(mechanism, epsilon, k)
    bits = UrandomBits()
    estimates, variances = [], []
    for _ in range(repeats):
        estimate, variance = randomizer.estimate(randomizer.support_counts(randomizer.randomize(values, bits)),
                                                 values.size)
        estimates.append(estimate)
        variances.append(variance)
    estimates, stated = np.array(estimates), np.mean(variances, axis=0)
    # the mean over repeats is within 5 standard errors of the truth (simultaneous over 6 values: p < 1e-5)
    assert np.all(np.abs(estimates.mean(axis=0) - truth) <= 5 * np.sqrt(stated / repeats))
    # the empirical variance matches the stated one: each estimate is a sum of many independent reports, close
    # to normal, so (repeats - 1) s^2 / variance is about chi-square with repeats - 1 degrees of freedom; both
    # tails at 1e-7 per value (about [0.67, 1.41] times the stated variance; a variance off by 2x still fails)
    df = repeats - 1
    ratio = estimates.var(axis=0, ddof=1) / stated
    assert np.all(ratio >= stats.chi2.ppf(1e-7, df) / df) and np.all(ratio <= stats.chi2.isf(1e-7, df) / df), ratio


def test_bad_parameters_say_how_to_fix_them():
    with pytest.raises(ValueError, match="krr for small domains"):
        LocalRandomizer.build("rappor", 1.0, 4)
    with pytest.raises(ValueError, match="e.g. 1.0"):
        LocalRandomizer.build("krr", 0.0, 4)
    with pytest.raises(ValueError, match="local_dp.domain"):
        LocalRandomizer.build("oue", 1.0, 1)
    with pytest.raises(ValueError, match=r"indices in \[0, 4\)"):
        LocalRandomizer.build("krr", 1.0, 4).randomize(np.array([4]), UrandomBits())



def test_a_report_tag_is_mechanism_epsilon_k_and_domain_digest():
    """As the README defines it, with the domain's compact JSON written out by hand."""
    assert report_tag(LocalRandomizer.build("krr", 2.0, 4), ["a", "b", "c", 7]) == (
        "krr:0x1.0000000000000p+1:4:" + hashlib.sha256(b'["a","b","c",7]').hexdigest()[:16])
    randomizer = LocalRandomizer.build("oue", 0.1, 3)  # epsilon as the randomizer holds it, exactly
    assert report_tag(randomizer, ["x", "y", "z"]).split(":")[:3] == ["oue", randomizer.epsilon.hex(), "3"]


def test_report_tags_differ_whenever_the_randomizer_or_its_domain_does():
    domain = ["a", "b", "c", "d"]
    tags = [
        report_tag(LocalRandomizer.build("krr", 2.0, 4), domain),
        report_tag(LocalRandomizer.build("krr", 2.0 + 2**-40, 4), domain),  # prints as 2 with %g
        report_tag(LocalRandomizer.build("oue", 2.0, 4), domain),
        report_tag(LocalRandomizer.build("krr", 2.0, 4), ["b", "a", "c", "d"]),  # another order: another groups.public
        report_tag(LocalRandomizer.build("krr", 2.0, 4), ["a", "b", "c", "e"]),
        report_tag(LocalRandomizer.build("krr", 2.0, 4), ["a", "b", "c", "4"]),
    ]
    assert len(set(tags)) == len(tags), tags


SECRET = bytes(range(32))


def test_keyed_bits_are_a_function_of_the_secret_and_the_message_alone():
    words = KeyedBits(SECRET, b"q", b"u1", b"0")(100)
    assert words.dtype == np.uint64
    # the same stream however it is asked for: the samplers' requests depend on their earlier draws
    split = KeyedBits(SECRET, b"q", b"u1", b"0")
    assert np.array_equal(np.concatenate([split(1), split(0), split(37), split(62)]), words)
    assert not np.array_equal(KeyedBits(bytes(32), b"q", b"u1", b"0")(100), words)  # another secret
    assert not np.array_equal(KeyedBits(SECRET, b"q", b"u10")(100), words)  # another message
    # parts are length-prefixed: moving a byte from one part to the next is another message
    assert not np.array_equal(KeyedBits(SECRET, b"q", b"u", b"10")(100), KeyedBits(SECRET, b"q", b"u1", b"0")(100))
    with pytest.raises(ValueError, match=f"needs at least {MIN_SECRET_BYTES}"):
        KeyedBits(b"too short", b"q")


def test_keyed_words_are_uniform():
    words = np.concatenate([KeyedBits(SECRET, str(i).encode())(64) for i in range(2_000)])
    observed = np.bincount((words >> np.uint64(60)).astype(np.int64), minlength=16)  # top 4 bits
    assert stats.chisquare(observed).pvalue > P_MIN
    bits = np.unpackbits(words.view(np.uint8)).reshape(-1, 64).sum(axis=0)  # every bit position fair
    assert stats.chisquare(np.stack([bits, words.size - bits]).ravel(), np.full(128, words.size / 2)).pvalue > P_MIN


@pytest.mark.parametrize(("mechanism", "epsilon", "k", "n"),
                         [("krr", 1.0, 5, 20_000), pytest.param("krr", 3.0, 20, 6_000, marks=pytest.mark.full),  # 40 s
                          ("oue", 1.0, 4, 20_000)])
def test_memoized_reports_follow_the_exact_law(mechanism, epsilon, k, n):
    # One report per (unit, window), each from its own keyed stream, as the producer draws them: the reports of
    # many distinct pairs with one true value follow the randomizer's law (oue: all 2^k bit patterns).
    truth = 1
    randomizer = LocalRandomizer.build(mechanism, epsilon, k)
    reports = np.concatenate([randomizer.randomize(np.array([truth]), KeyedBits(SECRET, b"q", b"u%d" % (i % 2_000),
                                                                                  b"%d" % (i // 2_000)))
                              for i in range(n)])
    if mechanism == "krr":
        observed = np.bincount(reports, minlength=k)
        law = krr_law
    else:
        patterns = reports.reshape(n, k).astype(np.int64) @ (1 << np.arange(k))
        observed = np.bincount(patterns, minlength=1 << k)

        def law(eps, k, truth):
            on = np.full(k, 1.0 / (math.exp(eps) + 1.0))
            on[truth] = 0.5
            cells = (np.arange(1 << k)[:, None] >> np.arange(k)) & 1
            return np.prod(np.where(cells == 1, on, 1.0 - on), axis=1)
    assert stats.chisquare(observed, law(epsilon, k, truth) * n).pvalue > P_MIN
    assert stats.chisquare(observed, law(1.2 * epsilon, k, truth) * n).pvalue < 1e-20
