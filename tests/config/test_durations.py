import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_dp.config import format_duration_ms, parse_duration_ms


@pytest.mark.parametrize(
    ("text", "ms"),
    [("250ms", 250), ("10s", 10_000), ("1.5s", 1_500), ("1m", 60_000), ("24h", 86_400_000), ("7d", 604_800_000), (42, 42)],
)
def test_parses_units(text, ms):
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("bad", ["", "10", "1 week", "-1s", "1.0001ms", True, None, 1.5, -3])
def test_rejects_with_a_hint(bad):
    with pytest.raises(ValueError, match=r"duration|milliseconds|negative"):
        parse_duration_ms(bad)


@given(st.integers(min_value=1, max_value=10**12))
def test_format_round_trips(ms):
    assert parse_duration_ms(format_duration_ms(ms)) == ms
