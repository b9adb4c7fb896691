"""Why an input message was not used, with stable snake_case reason codes.

The codes are part of the interface: they label metrics and dead-letter
records, so they are never renamed.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class RejectReason(StrEnum):
    TOMBSTONE = "tombstone"  # the message value is null (a Kafka tombstone)
    OVERSIZE = "oversize"  # longer than max_message_bytes
    INVALID_UTF8 = "invalid_utf8"
    INVALID_JSON = "invalid_json"  # not one JSON document (syntax, nesting depth, empty message)
    WRONG_TYPE = "wrong_type"  # not an object, or a field of the wrong JSON type
    MISSING_FIELD = "missing_field"
    NULL_FIELD = "null_field"  # a required field is JSON null
    EMPTY_UNIT = "empty_unit"  # the privacy-unit id is the empty string
    BAD_UNIT = "bad_unit"  # the privacy-unit id is longer than max_unit_length or contains NUL
    NON_FINITE = "non_finite"  # the value overflows to infinity
    VALUE_OUT_OF_RANGE = "value_out_of_range"  # |value| above max_abs_value, or a local-DP report outside its domain
    BAD_TIMESTAMP = "bad_timestamp"  # unparsable, zone-less, negative or beyond year 9999
    FUTURE_TIMESTAMP = "future_timestamp"  # more than max_future_skew_ms ahead of the wall clock
    AHEAD_OF_RECORD = "ahead_of_record"  # more than max_future_skew_ms ahead of its Kafka record timestamp
    WRONG_KEY = "wrong_key"  # the message key is not the privacy-unit id
    WRONG_PARTITION = "wrong_partition"  # not on the partition the configured partitioner assigns its key
    LATE = "late"  # its window had already closed
    NOT_RANDOMIZED = "not_randomized"  # a local_dp query's event without a report tag: likely a true value
    RANDOMIZER_MISMATCH = "randomizer_mismatch"  # a report tagged with another mechanism, epsilon or domain


@dataclass(frozen=True, slots=True)
class Rejection:
    """One message that was not used, with the original bytes for a dead-letter topic."""

    partition: int
    offset: int
    reason: RejectReason
    detail: str
    value: bytes | None
