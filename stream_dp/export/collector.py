"""The latest releases as Prometheus gauges, rendered at each scrape, and the exporter's own counters.

A collector rather than labelled gauges: each scrape renders exactly the series of each query's newest
window, so a group that stops being released has no series from the next window on, with nothing to remove.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from stream_dp.export.latest import LatestReleases
from stream_dp.export.samples import FAMILIES


class ReleaseCollector(Collector):
    def __init__(self, latest: LatestReleases) -> None:
        self.latest = latest

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = {name: GaugeMetricFamily(name, help_text, labels=["query", *labels])
                    for name, (help_text, labels) in FAMILIES.items()}
        for metric, labels, value in self.latest.samples():
            families[metric].add_metric([v for _k, v in labels], value)
        yield from families.values()

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())  # the families are only known at scrape time


class ExportMetrics:
    """The exporter's release series and its own health, on an injected registry."""

    def __init__(self, registry: CollectorRegistry, latest: LatestReleases) -> None:
        registry.register(ReleaseCollector(latest))
        self.records = Counter("stream_dp_export_records", "Output records read, by what became of them "
                               "(shown, older_window, unknown_query, outside_groups, not_a_release)",
                               ["outcome"], registry=registry)
        self.last_read = Gauge("stream_dp_export_last_record_seconds", "Wall-clock time of the last record read",
                               registry=registry)
