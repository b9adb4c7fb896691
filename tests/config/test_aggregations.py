"""Aggregation options refused up front when their stated errors could not hold."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from stream_dp.config.aggregations import QuantilesAggregation


def _quantiles(q: list[float]) -> QuantilesAggregation:
    return QuantilesAggregation(field="value", q=q, bounds=(0.0, 100.0))


@pytest.mark.parametrize("q", [[0.5], [0.9, 0.99], [0.001, 0.9999], [0.25, 0.75], [0.1234]])
def test_quantiles_the_score_aims_at_exactly_are_accepted(q):
    assert _quantiles(q).q == q


@pytest.mark.parametrize(("q", "hint"), [
    (0.99999, r"9999/10000 = 0\.9999.*use q: 0\.9999 or 1"),  # five nines: would be aimed at 0.9999
    (0.33333, r"3333/10000 = 0\.3333.*use q: 0\.3333 or 0\.3334"),
    (1e-05, r"0/10000 = 0.*use q: 0 or 0\.0001"),
])
def test_quantiles_the_score_would_round_are_refused_with_the_nearest_ones_it_can_aim_at(q, hint):
    # Independent of the code under test: 0.99999's rank error at n = 10^6 would be 10 ranks more than stated
    # (|0.99999 - 0.9999| * 10^6), and 0.00001 would become the minimum.
    with pytest.raises(ValidationError, match=hint):
        _quantiles([q])
