"""Merging worker processes' /metrics pages: every series kept, told apart by a process label."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from stream_dp.metrics.merge import merge_expositions


def _page(accepted: float, watermark: float, latency: float) -> str:
    registry = CollectorRegistry()
    Counter("stream_dp_events_total", "Events.", ["query", "outcome"], registry=registry).labels("q", "ok").inc(accepted)
    Gauge("stream_dp_watermark_seconds", "Watermark.", ["query"], registry=registry).labels("q").set(watermark)
    Histogram("stream_dp_release_latency_seconds", "Latency.", ["query"], registry=registry).labels("q").observe(latency)
    return generate_latest(registry).decode()


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")
    }


def test_every_series_of_every_process_is_kept_with_its_process_label():
    pages = {"0": _page(3, 10, 0.3), "1": _page(4, 11, 2.0)}
    merged = _samples(merge_expositions(pages).decode())
    expected = {}
    for process, page in pages.items():
        for (name, labels), value in _samples(page).items():
            expected[(name, tuple(sorted({**dict(labels), "process": process}.items())))] = value
    assert merged == expected
    assert merged[("stream_dp_watermark_seconds", (("process", "1"), ("query", "q")))] == 11  # not summed


def test_help_and_type_appear_once_per_family():
    text = merge_expositions({"0": _page(1, 1, 1), "1": _page(2, 2, 2)}).decode()
    assert text.count("# TYPE stream_dp_events_total counter") == 1
    assert text.count("# TYPE stream_dp_release_latency_seconds histogram") == 1


def test_a_page_that_already_has_a_process_label_is_refused():
    registry = CollectorRegistry()
    Gauge("g", "G.", ["process"], registry=registry).labels("x").set(1)
    with pytest.raises(ValueError, match="already has a 'process' label"):
        merge_expositions({"0": generate_latest(registry).decode()})


def test_no_pages_give_an_empty_page():
    assert merge_expositions({}) == b""
