"""How a release record names its window and group on the output topics.

One ``release`` record per released group per window, plus one per group of each coarser level of a
hierarchy query and one ``{"kind": "top_k"}`` record per window of a top_k query (schema:
``deploy/schemas/release.schema.json``); only noisy values. Pure functions, no I/O.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

import orjson

from stream_dp.worker.partials.wire import GroupKey


def iso_utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def release_id(query: str, window_start_ms: int, group: GroupKey) -> str:
    """Stable id of one (query, window, group) release: consumers dedupe on it."""
    digest = hashlib.blake2b(orjson.dumps([query, window_start_ms, list(group)]), digest_size=12).hexdigest()
    return f"{query}:{window_start_ms}:{digest}"
