"""Helpers of the end-to-end worker tests: ports, reading topics, scraping metrics."""

from __future__ import annotations

import datetime
import socket
import time
import urllib.request

from kafka import KafkaConsumer

from tests.conftest import PRODUCER_STAMPED as PRODUCER_STAMPED  # for the backfilling tests, beside BACKFILL


#: What a test that backfills past windows adds to its query. Its records are stamped with their events'
#: times (as a backfill's producer stamps them, on a topic created with ``tests.conftest.PRODUCER_STAMPED``) and
#: the query trusts those stamps, so that its windows close as the backfill is read, in seconds, rather than
#: after the minutes its events are old (by the broker's stamps, every record of it would arrive now).
BACKFILL = {"trust_producer_timestamps": True}


def iso_ms(ms: int) -> str:
    """``ms`` as a query file writes an instant: ``window.publish_from`` of a test that backfills public groups."""
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).isoformat()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def consume_all(bootstrap: str, topic: str, *, until, timeout_s: float, settle_s: float = 0.0) -> list:
    """The records of ``topic`` from its start, read until ``until(records)`` holds (or ``timeout_s``); with
    ``settle_s``, then on to the ends its partitions had ``settle_s`` later: a window's records are on several
    partitions, each acknowledged on its own, so the one that satisfies ``until`` can be read before its
    siblings. (Not by default: a query of public groups keeps publishing windows as the clock moves on.)"""
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False)
    records = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                records.extend(batch)
            if until(records):
                break
        else:
            return records
        if settle_s <= 0:
            return records
        time.sleep(settle_s)
        ends = consumer.end_offsets(list(consumer.assignment()))
        while time.monotonic() < deadline and any(consumer.position(tp) < end for tp, end in ends.items()):
            for batch in consumer.poll(timeout_ms=500).values():
                records.extend(batch)
    finally:
        consumer.close()
    return records


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def metric_sum(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def page_query(name: str, topic: str, output: str, namespace: str, *, pages, window: str, release_timeout: str,
               publish_from_ms: int | None = None, **options) -> dict:
    """A query of ``user_id`` units grouped by ``page`` over the public ``pages``: the option tests' base (they
    backfill past windows: ``BACKFILL``, on a topic created with ``PRODUCER_STAMPED``).
    ``publish_from_ms``: where a test that backfills windows before the worker's first start publishes from."""
    since = {} if publish_from_ms is None else {"publish_from": iso_ms(publish_from_ms)}
    return {
        "name": name, "input_topic": topic, "output_topic": output,
        "privacy_unit": {"namespace": namespace, "field": "user_id"},
        "timestamp_field": "ts",
        "window": {"size": window, "allowed_lateness": "1s", "idle_timeout": "2s", **since},
        "group_by": ["page"], "groups": {"public": list(pages)},
        "bounds": {"max_groups_per_unit": 3, "max_events_per_group": 3},
        "release_timeout": release_timeout,
        **BACKFILL,
        **options,
    }
