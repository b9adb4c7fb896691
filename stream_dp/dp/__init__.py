"""Differential-privacy core: bounds, sensitivities, calibration, noise, accounting.

Pure library: no I/O and nothing done at import time. Noise comes from an
injected :class:`NoiseSource`: :class:`VectorisedExactNoise` (exact discrete
Laplace samplers on numpy arrays from kernel CSPRNG bits, the same laws as
OpenDP's measurements) or :class:`OpenDPNoise` (OpenDP's samplers, one FFI call
per draw), chosen by :func:`noise_source`.

The bottom of the stack: ``dp`` imports no other package of ``stream_dp``. The
window engine (``stream_dp.windows``) imports the pieces it shares with the
releases from here -- the histograms quantiles read (``dp.histogram``), the
local-DP reports (``dp.local``), the blocks of sample-and-aggregate
(``dp.sample_aggregate.block_of``) and the vector features (``dp.vectors``) --
never the other way (``tests/architecture/test_import_cycles.py``).
"""

from stream_dp.dp.bounds import ClipRange, ContributionBounds
from stream_dp.dp.calibration import CalibratedNoise
from stream_dp.dp.loss import PrivacyLoss, cdp_delta, zcdp_epsilon, zcdp_rho
from stream_dp.dp.noise import NoiseSource, OpenDPNoise
from stream_dp.dp.plan import AGGREGATIONS, ReleasePlan
from stream_dp.dp.quantiles import QuantilesPlan, QuantilesRelease
from stream_dp.dp.release import NoisyRelease
from stream_dp.dp.selection import PartitionSelection
from stream_dp.dp.sensitivity import (
    Sensitivity,
    count_sensitivity,
    distinct_units_sensitivity,
    sum_sensitivity,
)
from stream_dp.dp.topk import TopKPlan
from stream_dp.dp.vectorised_noise import NOISE_SAMPLERS, VectorisedExactNoise, noise_source

__all__ = [
    "AGGREGATIONS",
    "NOISE_SAMPLERS",
    "CalibratedNoise",
    "ClipRange",
    "ContributionBounds",
    "NoiseSource",
    "NoisyRelease",
    "OpenDPNoise",
    "PartitionSelection",
    "PrivacyLoss",
    "QuantilesPlan",
    "QuantilesRelease",
    "ReleasePlan",
    "Sensitivity",
    "TopKPlan",
    "VectorisedExactNoise",
    "cdp_delta",
    "count_sensitivity",
    "distinct_units_sensitivity",
    "noise_source",
    "sum_sensitivity",
    "zcdp_epsilon",
    "zcdp_rho",
]
