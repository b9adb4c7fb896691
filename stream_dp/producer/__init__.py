"""Publishing events from Python: ``EventProducer`` checks each event against its query, keys it by the
privacy unit with the query's partitioner, creates the input topic as the worker expects it and randomizes
local-DP reports at the source. ``stream-dp produce`` sends through the same pieces.

Imports ``config``, ``windows``, ``dp`` and, for topic creation, ``stream_dp.worker.kafka``; nothing at import
time connects anywhere.
"""

from stream_dp.producer.event_producer import EventProducer
from stream_dp.producer.events import EventError

__all__ = ["EventError", "EventProducer"]
