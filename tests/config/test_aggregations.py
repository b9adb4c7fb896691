"""Aggregation options refused up front when their stated errors could not hold."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from stream_dp.config.aggregations import QuantilesAggregation
from stream_dp.dp import ContributionBounds
from stream_dp.dp.quantiles import QuantilesPlan


def _quantiles(q: list[float]) -> QuantilesAggregation:
    return QuantilesAggregation(field="value", q=q, bounds=(0.0, 100.0))


@pytest.mark.parametrize("q", [[0.5], [0.9, 0.99], [0.001, 0.9999], [0.25, 0.75], [0.1234],
                               [0.0003, 0.57, 0.69]])  # (0.57 * 10^4 is 5699.99... in floating point)
def test_quantiles_the_score_aims_at_exactly_are_accepted(q):
    assert _quantiles(q).q == q


def test_every_level_of_at_most_four_decimals_is_aimed_at_exactly():
    plan = QuantilesPlan.build(epsilon=1.0, q=[0.0003, 0.57, 0.69], lo=0.0, hi=10.0, bins=4,
                               bounds=ContributionBounds(1, 1))
    assert plan.alpha == ((3, 10_000), (5_700, 10_000), (6_900, 10_000))
    refused = []
    for n in range(1, 10_000):
        try:
            _quantiles([n / 10_000])
        except ValidationError:
            refused.append(n)
    assert refused == []


@pytest.mark.parametrize(("q", "hint"), [
    (0.99999, r"9999/10000 = 0\.9999.*use q: 0\.9999 \("),  # five nines: would be aimed at 0.9999 (1 is no level)
    (0.33333, r"3333/10000 = 0\.3333.*use q: 0\.3333 or 0\.3334"),
    (1e-05, r"0/10000 = 0.*use q: 0\.0001 \("),  # (0 is no level)
])
def test_quantiles_the_score_would_round_are_refused_with_the_nearest_ones_it_can_aim_at(q, hint):
    # Independent of the code under test: 0.99999's rank error at n = 10^6 would be 10 ranks more than stated
    # (|0.99999 - 0.9999| * 10^6), and 0.00001 would become the minimum.
    with pytest.raises(ValidationError, match=hint):
        _quantiles([q])
