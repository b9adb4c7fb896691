"""Why a message the fast decoder refused is not a valid event: a slow, thorough second reading.

Only messages the typed decoder of :mod:`stream_dp.windows.decoding` refused
come here, so its cost is paid per bad message, never per good one.
"""

from __future__ import annotations

import json
import math
from typing import Any

from stream_dp.windows.rejections import RejectReason
from stream_dp.windows.specs import EventSchema

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _reject_inf(token: str) -> float:
    raise ValueError(f"{token} is not valid JSON")


def classify_message(raw: bytes, schema: EventSchema) -> tuple[RejectReason, str] | None:
    """Why ``raw`` is not a valid event, or ``None`` if no reason is found.

    Slow and thorough; only messages the typed decoder refused come here.
    """
    try:
        text = bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        return RejectReason.INVALID_UTF8, f"byte {exc.start} is not valid UTF-8"
    if not text.strip():
        return RejectReason.INVALID_JSON, "the message is empty"
    try:
        # Python's parser reads 1e999 as inf, which lets it be reported as non-finite
        event = json.loads(text, parse_constant=_reject_inf)
    except (ValueError, RecursionError) as exc:
        return RejectReason.INVALID_JSON, str(exc)[:200]
    if not isinstance(event, dict):
        return RejectReason.WRONG_TYPE, f"an event must be a JSON object, got {_describe(event)}"
    if schema.report_tag_field is not None and (problem := _check_tag(event.get(schema.report_tag_field), schema)):
        return problem  # before the other fields: an event without a tag is most likely a true value
    fields = [(schema.unit_field, "unit"), (schema.timestamp_field, "timestamp")]
    fields += [(name, "group") for name in schema.group_by]
    fields += [(name, "value") for name in schema.value_fields]
    if schema.report_field is not None:
        fields.append((schema.report_field, "report"))
    for name, role in fields:
        if name not in event:
            return RejectReason.MISSING_FIELD, f"field {name!r} is missing"
        value = event[name]
        if value is None:
            return RejectReason.NULL_FIELD, f"field {name!r} is null"
        problem = _check_field(name, role, value, schema)
        if problem is not None:
            return problem
    return None


def _check_field(name: str, role: str, value: Any, schema: EventSchema) -> tuple[RejectReason, str] | None:
    is_int = isinstance(value, int) and not isinstance(value, bool)
    is_number = is_int or isinstance(value, float)
    if role in ("unit", "group"):
        if not (isinstance(value, str) or is_int):
            return RejectReason.WRONG_TYPE, f"field {name!r} must be a string or an integer, got {_describe(value)}"
        if is_int and not _INT64_MIN <= value <= _INT64_MAX:
            return RejectReason.WRONG_TYPE, f"field {name!r} is an integer outside the signed 64-bit range"
        if role == "group" and schema.group_domain and value not in schema.group_domain_set:
            return RejectReason.VALUE_OUT_OF_RANGE, (
                f"field {name!r} reports {value!r:.64}, which is not in the local_dp domain (the query's "
                "groups.public); `stream-dp produce --local-dp` with the query's --config and --query reports "
                "values of the domain only")
        if role == "unit" and value == "":
            return RejectReason.EMPTY_UNIT, f"field {name!r} (the privacy unit) is an empty string"
        if role == "unit" and isinstance(value, str) and len(value) > schema.max_unit_length:
            return RejectReason.BAD_UNIT, (
                f"field {name!r} (the privacy unit) has {len(value)} characters, more than max_unit_length {schema.max_unit_length}"
            )
        return None
    if role == "report":
        if not isinstance(value, list):
            return RejectReason.WRONG_TYPE, f"field {name!r} must be a list of reported values, got {_describe(value)}"
        for item in value:
            item_is_int = isinstance(item, int) and not isinstance(item, bool)
            if not (isinstance(item, str) or item_is_int):
                return RejectReason.WRONG_TYPE, f"field {name!r} holds {_describe(item)}; a report lists strings or integers"
        return check_report(name, value, schema)
    if role == "timestamp":
        allowed_number = schema.timestamp_format != "iso8601"
        allowed_string = schema.timestamp_format in ("auto", "iso8601")
        if not ((is_number and allowed_number) or (isinstance(value, str) and allowed_string)):
            expected = {"iso8601": "an ISO-8601 string", "auto": "a number or an ISO-8601 string"}
            wanted = expected.get(schema.timestamp_format, "a number")
            return RejectReason.WRONG_TYPE, f"field {name!r} must be {wanted}, got {_describe(value)}"
        if isinstance(value, float) and not math.isfinite(value):
            return RejectReason.BAD_TIMESTAMP, f"field {name!r} is not a finite number"
        return None
    if not is_number:
        return RejectReason.WRONG_TYPE, f"field {name!r} must be a number, got {_describe(value)}"
    try:
        as_float = float(value)
    except OverflowError:
        as_float = math.inf
    if not math.isfinite(as_float):
        return RejectReason.NON_FINITE, f"field {name!r} is too large to be a finite double"
    if abs(as_float) > schema.max_abs_value:
        return (
            RejectReason.VALUE_OUT_OF_RANGE,
            f"field {name!r} = {as_float:g} exceeds max_abs_value {schema.max_abs_value:g}",
        )
    return None


def _check_tag(tag: Any, schema: EventSchema) -> tuple[RejectReason, str] | None:
    """Why an event is not a report of the query's own randomizer, or None."""
    name, wanted = schema.report_tag_field, schema.report_tag
    if tag is None:
        return RejectReason.NOT_RANDOMIZED, (
            f"field {name!r} is missing or null: not a randomized report (a true value, never used); send this "
            "topic's events with `stream-dp produce --local-dp FIELD` and the query's --config and --query")
    if tag != wanted:
        got = repr(tag[:100]) if isinstance(tag, str) else _describe(tag)
        return RejectReason.RANDOMIZER_MISMATCH, (
            f"field {name!r} is {got}, a report of another randomizer than the query's {wanted!r} "
            "(mechanism:epsilon:k:domain hash); produce with the query's local_dp settings and groups.public")
    return None


def check_report(name: str, items: list[Any], schema: EventSchema) -> tuple[RejectReason, str] | None:
    """Why a unary report is not a set of domain values, or None."""
    domain = set(schema.report_domain)
    if len(items) > len(domain):
        return RejectReason.VALUE_OUT_OF_RANGE, f"field {name!r} lists {len(items)} values, more than the domain's {len(domain)}"
    for item in items:
        if item not in domain or isinstance(item, bool):
            return RejectReason.VALUE_OUT_OF_RANGE, f"field {name!r} reports {str(item)[:64]!r}, which is not in the domain"
    if len(set(items)) != len(items):
        return RejectReason.WRONG_TYPE, f"field {name!r} lists a value twice; a report is a set of values"
    return None
