"""Where an event must be: keyed by its privacy unit's id, on the partition its key maps to.

A unit's contribution is bounded by the one worker that owns its partition, so
an event keyed or placed otherwise (a producer sending one unit's events to
several partitions, explicitly or by another key) is rejected, with how to fix
the producer, rather than counted by a worker that cannot see the unit's other
events. Pure logic over a batch's columns.
"""

from __future__ import annotations

import numpy as np

from stream_dp.windows.batch import RawBatch
from stream_dp.windows.decoding import DecodedEvents, Problem
from stream_dp.windows.partitioning import Partitioner, expected_partitions
from stream_dp.windows.rejections import Rejection, RejectReason


def check_placement(batch: RawBatch, decoded: DecodedEvents, problems: list[Problem], *, partition_count: int | None,
                    partitioner: Partitioner, unit_field: str) -> DecodedEvents:
    """Drop (into ``problems``) valid events not keyed by their unit or not on their key's partition."""
    if batch.keys is None:
        raise ValueError("this engine checks co-partitioning: pass the records' keys in RawBatch.keys")
    count = partition_count
    if count is None:
        raise ValueError("call set_partition_count() with the input topic's partition count before process()")
    if not len(decoded):
        return decoded
    if len(decoded) == len(batch):  # every message decoded: the index is the identity
        keys = batch.keys if isinstance(batch.keys, list) else list(batch.keys)
    else:
        keys = list(map(batch.keys.__getitem__, decoded.index.tolist()))
    wrong_key = key_differs(keys, decoded.units)
    expected = expected_partitions(decoded.units, count, partitioner)  # type: ignore[arg-type]
    actual = batch.partitions[decoded.index]
    wrong_partition = ~wrong_key & (expected != actual)
    if not (wrong_key.any() or wrong_partition.any()):
        return decoded
    field = unit_field
    for i in np.flatnonzero(wrong_key).tolist():
        shown = "no key" if keys[i] is None else f"key {bytes(keys[i])[:64]!r}"
        problems.append((int(decoded.index[i]), RejectReason.WRONG_KEY, (
            f"the record has {shown}, not the privacy-unit id {decoded.units[i][:64]!r}; "
            f"key every event by its {field!r} (UTF-8) so that all of a unit's events share a partition"
        )))
    for i in np.flatnonzero(wrong_partition).tolist():
        problems.append((int(decoded.index[i]), RejectReason.WRONG_PARTITION, (
            f"the record is on partition {int(actual[i])}, but the {partitioner} partitioner puts its key "
            f"on partition {int(expected[i])} of {count}; produce with that partitioner and no explicit partition"
        )))
    return decoded.take(~(wrong_key | wrong_partition))


def rejection_of(batch: RawBatch, index: int, reason: RejectReason, detail: str) -> Rejection:
    """The dead-letter record of message ``index`` of ``batch``."""
    value = batch.values[index]
    return Rejection(
        partition=int(batch.partitions[index]),
        offset=int(batch.offsets[index]),
        reason=reason,
        detail=detail,
        value=None if value is None else bytes(value),
    )


def key_differs(keys: list[bytes | None], units: np.ndarray) -> np.ndarray:
    """Per event, whether its message key is not exactly its unit id's bytes (``units``: an ``S`` array)."""
    # One byte wider than the widest id: a key longer than its id stays longer when truncated to it.
    width = f"S{units.dtype.itemsize + 1}"
    try:
        as_array = np.array(keys, dtype=width)
    except TypeError:  # a null key, or a key that is not bytes
        as_array = np.array([k if isinstance(k, bytes) else b"" for k in keys], dtype=width)
    differs = as_array != units
    try:
        joined = b"".join(keys)  # type: ignore[arg-type]
    except TypeError:  # a null key, or a key that is not bytes
        joined = b"".join(k for k in keys if isinstance(k, bytes))
    if b"\x00" in joined:
        # A fixed-width array drops trailing NULs; unit ids never contain one, so such a key never matches.
        differs |= np.fromiter((isinstance(k, bytes) and b"\x00" in k for k in keys), dtype=bool, count=len(keys))
    return differs
