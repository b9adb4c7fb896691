"""Differential-privacy core: bounds, sensitivities, calibration, noise, accounting.

Pure library: no I/O and nothing done at import time. Noise comes only from
OpenDP's secure samplers, through an injected :class:`OpenDPNoise`.
"""

from stream_dp.dp.bounds import ClipRange, ContributionBounds
from stream_dp.dp.calibration import CalibratedNoise
from stream_dp.dp.loss import PrivacyLoss, cdp_delta, zcdp_epsilon, zcdp_rho
from stream_dp.dp.noise import NoiseSource, OpenDPNoise
from stream_dp.dp.plan import AGGREGATIONS, ReleasePlan
from stream_dp.dp.release import NoisyRelease
from stream_dp.dp.selection import PartitionSelection
from stream_dp.dp.sensitivity import (
    Sensitivity,
    count_sensitivity,
    distinct_units_sensitivity,
    sum_sensitivity,
)
from stream_dp.dp.topk import TopKPlan

__all__ = [
    "AGGREGATIONS",
    "CalibratedNoise",
    "ClipRange",
    "ContributionBounds",
    "NoiseSource",
    "NoisyRelease",
    "OpenDPNoise",
    "PartitionSelection",
    "PrivacyLoss",
    "ReleasePlan",
    "Sensitivity",
    "TopKPlan",
    "cdp_delta",
    "count_sensitivity",
    "distinct_units_sensitivity",
    "sum_sensitivity",
    "zcdp_epsilon",
    "zcdp_rho",
]
