"""One ``/metrics`` page from several worker processes: each process's series, labelled with its index.

A labelled union rather than sums: counters and histograms would add up, but
gauges would not (the lowest watermark is not the sum of two), and rules and
dashboards already aggregate over workers (``sum by``, ``max by``), to which
a process of ``stream-dp run --processes N`` is one more worker.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

PROCESS_LABEL = "process"


class _Families:
    """A collector that yields families built elsewhere (for ``generate_latest``)."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterable[Metric]:
        return iter(self._families)


def merge_expositions(pages: Mapping[str, str]) -> bytes:
    """Merge Prometheus text pages, keyed by process label value, into one page.

    Raises ``ValueError`` when a page carries the ``process`` label already
    (its series would be ambiguous after merging).
    """
    merged: dict[str, Metric] = {}
    for process, text in pages.items():
        for family in text_string_to_metric_families(text):
            target = merged.get(family.name)
            if target is None:
                target = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
            for sample in family.samples:
                if PROCESS_LABEL in sample.labels:
                    raise ValueError(f"{sample.name} already has a {PROCESS_LABEL!r} label; rename it to merge pages")
                labels = {**sample.labels, PROCESS_LABEL: process}
                target.add_sample(sample.name, labels, sample.value, sample.timestamp, sample.exemplar)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(merged.values()))
    return generate_latest(registry)
