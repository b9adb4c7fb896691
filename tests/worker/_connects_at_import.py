"""A sample-and-aggregate module that reaches the service named in ``$TMPDIR/service.txt`` when it is imported."""

from __future__ import annotations

import numpy as np

from tests.worker._network_probe import reach_the_service

REACHED = reach_the_service()


def statistic(values: np.ndarray) -> float:
    return REACHED
