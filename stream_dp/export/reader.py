"""Reading the output topics for the exporter: every partition from a little before its end, then onwards.

Starting ``lookback`` records before each partition's end (never from a committed position: the exporter
keeps no state) rebuilds each query's newest window after a restart; a window's records are spread over the
partitions, so ``lookback`` must exceed the records of one window per partition (the default does for a
few hundred groups). A topic that does not exist yet is looked for again until it does.
"""

from __future__ import annotations

import logging
import time
import uuid
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import orjson

log = logging.getLogger(__name__)

TOPIC_RETRY_S = 5.0


class OutputReader:
    """Polls ``topics`` and hands each batch of decoded records (None for an undecodable one) to ``take``."""

    def __init__(self, client_options: dict[str, Any], topics: Iterable[str], *, lookback: int) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # kafka-python 3.x import-time warnings
            from kafka import KafkaConsumer

        self.topics = sorted(set(topics))
        self.lookback = lookback
        # never creates a topic: the worker creates its output topics with their planned settings
        self._consumer = KafkaConsumer(**client_options, group_id=None, enable_auto_commit=False,
                                       allow_auto_create_topics=False,
                                       client_id=f"stream-dp-export-{uuid.uuid4().hex[:6]}")
        self._assigned: set[str] = set()
        self._next_look_s = 0.0

    def _assign_new_topics(self) -> None:
        from kafka import TopicPartition

        if len(self._assigned) == len(self.topics) or time.monotonic() < self._next_look_s:
            return
        self._next_look_s = time.monotonic() + TOPIC_RETRY_S
        found = {topic: self._consumer.partitions_for_topic(topic) for topic in self.topics
                 if topic not in self._assigned}
        new = [TopicPartition(topic, p) for topic, parts in found.items() if parts for p in sorted(parts)]
        if not new:
            return
        owned = list(self._consumer.assignment())
        self._consumer.assign(owned + new)
        ends = self._consumer.end_offsets(new)
        starts = self._consumer.beginning_offsets(new)
        for tp in new:
            self._consumer.seek(tp, max(starts[tp], ends[tp] - self.lookback))
        self._assigned |= {tp.topic for tp in new}
        missing = sorted(set(self.topics) - self._assigned)
        if missing:
            log.info("output topics %s do not exist yet; looking again every %.0f s", missing, TOPIC_RETRY_S)

    def poll(self, take: Callable[[list[Any]], None], timeout_ms: int = 500) -> None:
        self._assign_new_topics()
        if not self._consumer.assignment():
            time.sleep(timeout_ms / 1000)
            return
        batch = self._consumer.poll(timeout_ms=timeout_ms)
        records = []
        for tp in sorted(batch, key=lambda tp: (tp.topic, tp.partition)):
            for message in batch[tp]:
                try:
                    records.append(orjson.loads(message.value))
                except (orjson.JSONDecodeError, TypeError):
                    records.append(None)
        if records:
            take(records)

    def close(self) -> None:
        self._consumer.close()
