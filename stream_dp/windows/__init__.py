"""Event-time window engine: decoding, tumbling windows, watermarks and contribution bounding.

Pure logic with no I/O; the worker feeds it message batches and releases the
partials it emits. It may import ``stream_dp.dp`` (the shapes it shares with
the releases live there), never the worker, and ``dp`` never imports it.
"""

from stream_dp.windows.engine import BatchResult, RawBatch, WindowEngine
from stream_dp.windows.partial import GroupTotals, UnitTotals, WindowPartial
from stream_dp.windows.rejections import Rejection, RejectReason
from stream_dp.windows.specs import BoundingSpec, EventSchema, WindowSpec

__all__ = [
    "BatchResult",
    "BoundingSpec",
    "EventSchema",
    "GroupTotals",
    "RawBatch",
    "RejectReason",
    "Rejection",
    "UnitTotals",
    "WindowEngine",
    "WindowPartial",
    "WindowSpec",
]
