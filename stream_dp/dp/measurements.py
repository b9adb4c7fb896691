"""The OpenDP measurements behind every noisy value, built in one place.

Calibration (which reads their privacy maps) and :class:`~stream_dp.dp.noise.OpenDPNoise`
(which invokes them) both build measurements here, so the mechanism that is
certified is the mechanism that runs. OpenDPNoise samples inside OpenDP's
Rust core with its cryptographically secure samplers (Canonne, Kamath &
Steinke 2020; OpenDP proof documents linked from each constructor's docs);
the default :class:`~stream_dp.dp.vectorised_noise.VectorisedExactNoise`
draws the same Laplace laws with the same exact algorithms, vectorised
(tests/dp/test_vectorised_noise.py compares the two), and leaves the
Gaussian ones to OpenDP.

Nothing here runs at import time: ``contrib`` is enabled when a measurement
is built.
"""

from __future__ import annotations

from typing import Any, Literal

NoiseKind = Literal["laplace", "gaussian"]
NOISE_KINDS: tuple[NoiseKind, ...] = ("laplace", "gaussian")


def opendp() -> Any:
    """The OpenDP prelude with the ``contrib`` feature switched on."""
    import opendp.prelude as dp

    dp.enable_features("contrib")
    return dp


def integer_vector_measurement(kind: NoiseKind, scale: float) -> Any:
    """Discrete Laplace (l1) or discrete Gaussian (l2) noise on an ``i64`` vector.

    Discrete Laplace ``P(z) ~ exp(-|z| / scale)`` (the two-sided geometric,
    Ghosh, Roughgarden & Sundararajan 2012); discrete Gaussian
    ``P(z) ~ exp(-z^2 / (2 scale^2))`` (Canonne, Kamath & Steinke 2020). The
    privacy map takes the l1 (resp. l2) sensitivity and returns epsilon
    (resp. rho). Each coordinate gets independent noise, so the vector may be
    noised in chunks without changing the output distribution.
    """
    dp = opendp()
    domain = dp.vector_domain(dp.atom_domain(T="i64"))
    if kind == "laplace":
        return dp.m.make_laplace(domain, dp.l1_distance(T="i64"), scale=scale)
    return dp.m.make_gaussian(domain, dp.l2_distance(T=float), scale=scale)


def float_vector_measurement(kind: NoiseKind, scale: float, k: int, size: int) -> Any:
    """Laplace (l1) or Gaussian (l2) noise on an ``f64`` vector of ``size`` elements.

    OpenDP rounds each input to the grid ``2^k Z`` and adds discrete noise of
    scale ``scale / 2^k`` on that grid. Rounding can widen the distance between
    two neighbouring vectors by up to ``size * 2^k`` in l1 (``sqrt(size) * 2^k``
    in l2), which the privacy map adds to the sensitivity; the map is monotone
    in ``size``, so certifying the largest size covers every smaller vector.
    """
    dp = opendp()
    domain = dp.vector_domain(dp.atom_domain(T=float, nan=False), size=size)
    if kind == "laplace":
        return dp.m.make_laplace(domain, dp.l1_distance(T=float), scale=scale, k=k)
    return dp.m.make_gaussian(domain, dp.l2_distance(T=float), scale=scale, k=k)


def exact_float_vector_measurement(kind: NoiseKind, scale: float, size: int) -> Any:
    """As :func:`float_vector_measurement` on OpenDP's finest grid (no rounding cost).

    Its sampler is several times slower; it serves as the reference for the
    cost of a coarser grid.
    """
    dp = opendp()
    domain = dp.vector_domain(dp.atom_domain(T=float, nan=False), size=size)
    if kind == "laplace":
        return dp.m.make_laplace(domain, dp.l1_distance(T=float), scale=scale)
    return dp.m.make_gaussian(domain, dp.l2_distance(T=float), scale=scale)


def laplace_threshold_measurement(scale: float, threshold: int) -> Any:
    """OpenDP's ``make_laplace_threshold`` on a hashmap ``group -> distinct units``.

    Each value gets independent discrete Laplace noise of ``scale`` and only
    pairs whose noisy value is ``>= threshold`` are kept. Its privacy map takes
    ``(l0, l1, linf)`` and returns ``(epsilon, delta)`` (Rogers 2023, "A
    Unifying Privacy Analysis Framework for Unknown Domain Algorithms").
    """
    dp = opendp()
    domain = dp.map_domain(dp.atom_domain(T="i64"), dp.atom_domain(T="i64"))
    metric = dp.l01inf_distance(dp.absolute_distance(T="i64"))
    return dp.m.make_laplace_threshold(domain, metric, scale=scale, threshold=threshold)


def top_k_measurement(k: int, scale: float) -> Any:
    """OpenDP's ``make_noisy_top_k`` under pure DP on ``i64`` scores.

    Under pure DP it peels ``k`` winners with permute-and-flip (McKenna &
    Sheldon 2020). The scores are declared *monotonic* (adding a unit never
    lowers a count), which halves the privacy cost; the map takes the
    l-infinity sensitivity and returns ``k * linf / scale``.
    """
    dp = opendp()
    space = dp.vector_domain(dp.atom_domain(T="i64")), dp.linf_distance(T="i64", monotonic=True)
    return dp.m.make_noisy_top_k(*space, dp.max_divergence(), k=k, scale=scale)


def quantile_score_transformation(candidates: list[float], alpha: float) -> Any:
    """OpenDP's ``make_quantile_score_candidates`` on ``f64`` vectors under the symmetric distance.

    Scores ``|(den - num) #(x < c) - num #(x > c)|`` per candidate ``c``, with
    ``num / den`` OpenDP's rational approximation of ``alpha`` (Smith 2011);
    its stability map takes the number of records added or removed and
    returns the l-infinity change of the scores, ``d * max(num, den - num)``.
    """
    dp = opendp()
    domain = dp.vector_domain(dp.atom_domain(T=float, nan=False))
    return dp.t.make_quantile_score_candidates(domain, dp.symmetric_distance(), candidates, alpha)


def private_quantile_measurement(candidates: list[float], alpha: float, scale: float) -> Any:
    """OpenDP's ``make_private_quantile`` under pure DP: the score above, then report-noisy-max.

    Under ``max_divergence`` the selection is report-noisy-max with exponential
    noise of ``scale * den`` on the integer scores, which is permute-and-flip
    (McKenna & Sheldon 2020; Ding, Kifer, Steinke, Wang, Xiao, Zhang and Zhang,
    "The permute-and-flip mechanism is identical to report-noisy-max with
    exponential noise", 2021); the scores are not monotonic, so the map takes
    the records added or removed and returns ``2 d max(num, den - num) / (den scale)``.
    """
    dp = opendp()
    domain = dp.vector_domain(dp.atom_domain(T=float, nan=False))
    return dp.m.make_private_quantile(domain, dp.symmetric_distance(), dp.max_divergence(), candidates, alpha, scale)
