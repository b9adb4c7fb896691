from __future__ import annotations

import numpy as np
import pytest

from stream_dp.windows import BoundingSpec, EventSchema, WindowSpec


def test_schema_normalises_group_by_to_a_tuple():
    schema = EventSchema(unit_field="u", timestamp_field="t", group_by=["a", "b"])  # type: ignore[arg-type]
    assert schema.group_by == ("a", "b")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"unit_field": ""}, "non-empty strings"),
        ({"group_by": ("t",)}, "more than one role"),
        ({"value_field": "u"}, "more than one role"),
        ({"timestamp_format": "epoch_us"}, "is not one of"),
        ({"max_message_bytes": 10}, "at least 64"),
        ({"max_abs_value": float("inf")}, "positive finite"),
        ({"max_abs_value": 0}, "positive finite"),
        ({"max_future_skew_ms": -1}, "non-negative"),
        ({"max_unit_length": 0}, r"\[1, 65536\]"),
        ({"group_domain": ("a", "b")}, "one group_by field"),
        ({"group_by": ("g", "h"), "group_domain": ("a", "b")}, "one group_by field"),
        ({"group_by": ("g",), "group_domain": ("a", "a")}, "distinct"),
        ({"group_by": ("g",), "group_domain": ("a", True)}, "strings or signed 64-bit integers"),
        ({"group_by": ("g",), "group_domain": ("a", 2**63)}, "strings or signed 64-bit integers"),
    ],
)
def test_schema_rejects_bad_settings_and_says_how(kwargs, message):
    base = {"unit_field": "u", "timestamp_field": "t"}
    with pytest.raises(ValueError, match=message):
        EventSchema(**{**base, **kwargs})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"size_ms": 0}, "positive integer"),
        ({"size_ms": 1.5}, "positive integer"),
        ({"offset_ms": 60_000}, r"\[0, size_ms"),
        ({"offset_ms": -1}, r"\[0, size_ms"),
        ({"allowed_lateness_ms": -5}, "non-negative"),
        ({"idle_timeout_ms": 0}, "poll interval"),
    ],
)
def test_window_spec_rejects_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        WindowSpec(**{"size_ms": 60_000, **kwargs})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_groups_per_unit": 0}, "max_groups_per_unit"),
        ({"max_events_per_group": 0}, "max_events_per_group"),
        ({"clip_lo": float("nan")}, "finite"),
        ({"clip_lo": 5.0, "clip_hi": 1.0}, "swap them"),
        ({"secret": b"short"}, "token_bytes"),
    ],
)
def test_bounding_spec_rejects_bad_settings(kwargs, message):
    base = {"max_groups_per_unit": 1, "max_events_per_group": 1, "clip_lo": 0.0, "clip_hi": 1.0, "secret": b"s" * 16}
    with pytest.raises(ValueError, match=message):
        BoundingSpec(**{**base, **kwargs})


def test_bounding_secret_is_not_in_repr():
    spec = BoundingSpec(max_groups_per_unit=1, max_events_per_group=1, secret=b"very-secret-value-xyz")
    assert "very-secret" not in repr(spec)


def test_window_maths_with_offset():
    spec = WindowSpec(size_ms=60_000, offset_ms=15_000)
    assert spec.start_of(15_000) == 15_000
    assert spec.start_of(74_999) == 15_000
    assert spec.start_of(75_000) == 75_000
    assert spec.start_of(14_999) == -45_000
    starts = spec.start_of(np.array([0, 15_000, 200_000], dtype=np.int64))
    assert starts.tolist() == [-45_000, 15_000, 195_000]
    assert spec.boundary_at_or_before(74_999) == 15_000
    assert spec.boundary_at_or_before(75_000) == 75_000
