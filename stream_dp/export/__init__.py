"""``stream-dp export``: the latest release of each query as Prometheus series, read from the output topics.

A process of its own rather than a part of the worker's release stage: it reads only what is already public
(the output topics), so it needs no access to the input, Redis or the internal topics; its series do not
move between workers when partitions are reassigned; and a restart rebuilds them by reading each output
partition's last records. Imports ``config`` and ``metrics``; nothing at import time (the registry and the
settings are passed in).
"""

from stream_dp.export.collector import ExportMetrics, ReleaseCollector
from stream_dp.export.latest import LatestReleases, QueryBounds
from stream_dp.export.runner import run_exporter

__all__ = ["ExportMetrics", "LatestReleases", "QueryBounds", "ReleaseCollector", "run_exporter"]
