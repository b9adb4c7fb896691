"""What a query's events look like, how they are windowed and how they are bounded.

Each spec validates itself when built and says how to fix a bad field, so a
bad configuration fails at start-up rather than on the first event.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from stream_dp.windows.exact_sums import PairSumGrid

TimestampFormat = Literal["auto", "epoch_s", "epoch_ms", "iso8601"]
TIMESTAMP_FORMATS: tuple[str, ...] = ("auto", "epoch_s", "epoch_ms", "iso8601")

#: In ``timestamp_format="auto"``, numbers below this are epoch seconds, others
#: epoch milliseconds: 1e11 s is the year 5138, 1e11 ms is March 1973.
AUTO_SECONDS_BELOW = 1e11

#: Latest accepted event time, 9999-12-31T23:59:59.999Z.
MAX_TIMESTAMP_MS = 253_402_300_799_999

#: Default largest magnitude of an event's value; larger values are rejected as out of range.
MAX_ABS_VALUE = 1e15


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


@dataclass(frozen=True)
class EventSchema:
    """The JSON fields of one query's events and the limits on them.

    ``unit_field`` names the privacy unit (a non-empty string of at most
    ``max_unit_length`` characters without NUL, or an integer, which is read
    as its decimal string); ``group_by`` the fields whose values
    (strings or integers) form the group key; ``value_field`` a finite number,
    or ``None`` for a query that only counts; ``vector_fields`` the finite
    numbers of a mean-vector or covariance query (then ``value_field`` is None);
    ``report_field`` a list of distinct values of ``report_domain``, the 1-bits
    of a unary-encoded local-DP report (read as a 0/1 vector over the domain). Where ``group_domain`` is
    set (a k-RR report, whose value is the one group-by field), the group value must be one of it, matched
    exactly (``"7"`` is not ``7``), else the event is rejected as out of range. Where ``report_tag_field``
    is set, every event must hold there the string ``report_tag`` (a local-DP report's randomizer, see
    ``stream_dp.dp.local.report_tag``); nothing else of it is kept. ``timestamp_format`` is
    ``"epoch_s"``, ``"epoch_ms"``, ``"iso8601"`` (a string with a zone) or
    ``"auto"`` (numbers below 1e11 are seconds, larger ones milliseconds,
    strings ISO-8601).
    """

    unit_field: str
    timestamp_field: str
    group_by: tuple[str, ...] = ()
    value_field: str | None = None
    vector_fields: tuple[str, ...] = ()
    report_field: str | None = None
    report_domain: tuple[str | int, ...] = ()
    group_domain: tuple[str | int, ...] = ()
    report_tag_field: str | None = None
    report_tag: str = ""
    timestamp_format: TimestampFormat = "auto"
    max_message_bytes: int = 65_536
    max_abs_value: float = MAX_ABS_VALUE
    max_future_skew_ms: int = 300_000
    max_unit_length: int = 256

    @property
    def keeps_values(self) -> bool:
        """Whether events carry numbers the partials keep (a value, a vector or a report)."""
        return bool(self.value_fields) or self.report_field is not None

    @cached_property
    def group_domain_set(self) -> frozenset[str | int]:
        """``group_domain`` for membership tests (built once: each rejected message is checked against it)."""
        return frozenset(self.group_domain)

    @property
    def value_fields(self) -> tuple[str, ...]:
        """The numeric fields read per event: the value field, or the vector's fields (possibly none)."""
        return (self.value_field,) if self.value_field is not None else self.vector_fields

    def __post_init__(self) -> None:
        object.__setattr__(self, "group_by", tuple(self.group_by))
        object.__setattr__(self, "vector_fields", tuple(self.vector_fields))
        object.__setattr__(self, "report_domain", tuple(self.report_domain))
        object.__setattr__(self, "group_domain", tuple(self.group_domain))
        _require(
            sum((self.value_field is not None, bool(self.vector_fields), self.report_field is not None)) <= 1,
            "an event schema reads one of value_field, vector_fields or report_field; use one query for each",
        )
        _require(
            (self.report_field is None) == (not self.report_domain)
            and len(set(self.report_domain)) == len(self.report_domain),
            "report_field needs report_domain, the distinct values a report may hold (and only then)",
        )
        _require(
            not self.group_domain or (
                len(self.group_by) == 1 and len(set(self.group_domain)) == len(self.group_domain)
                and all(isinstance(v, str) or (type(v) is int and -(2**63) <= v < 2**63) for v in self.group_domain)),
            "group_domain needs one group_by field and lists the distinct strings or signed 64-bit integers it may "
            "hold",
        )
        _require(
            (self.report_tag_field is None) == (not self.report_tag) and isinstance(self.report_tag, str),
            "report_tag_field needs report_tag, the string every event must hold there (and only then)",
        )
        names = [self.unit_field, self.timestamp_field, *self.group_by, *self.vector_fields]
        if self.report_field is not None:
            names.append(self.report_field)
        if self.report_tag_field is not None:
            names.append(self.report_tag_field)
        if self.value_field is not None:
            names.append(self.value_field)
        for name in names:
            _require(
                isinstance(name, str) and name != "",
                f"event field names must be non-empty strings, got {name!r}; use the JSON key as written by the producer",
            )
        repeated = sorted({n for n in names if names.count(n) > 1})
        _require(
            not repeated,
            f"field(s) {repeated} are used for more than one role (unit, timestamp, group-by, value, report tag); "
            "give each role its own field",
        )
        _require(
            self.timestamp_format in TIMESTAMP_FORMATS,
            f"timestamp_format {self.timestamp_format!r} is not one of {', '.join(TIMESTAMP_FORMATS)}",
        )
        _require(
            isinstance(self.max_message_bytes, int) and self.max_message_bytes >= 64,
            f"max_message_bytes must be an integer of at least 64, got {self.max_message_bytes!r}",
        )
        _require(
            isinstance(self.max_abs_value, (int, float))
            and math.isfinite(self.max_abs_value)
            and self.max_abs_value > 0,
            f"max_abs_value must be a positive finite number, got {self.max_abs_value!r}",
        )
        _require(
            isinstance(self.max_unit_length, int) and 1 <= self.max_unit_length <= 65_536,
            f"max_unit_length must be an integer in [1, 65536], got {self.max_unit_length!r}; 256 fits UUIDs and e-mail addresses",
        )
        _require(
            isinstance(self.max_future_skew_ms, int) and self.max_future_skew_ms >= 0,
            f"max_future_skew_ms must be a non-negative integer, got {self.max_future_skew_ms!r}; 300000 (5 minutes) is typical",
        )


@dataclass(frozen=True)
class WindowSpec:
    """Tumbling event-time windows ``[offset_ms + i*size_ms, offset_ms + (i+1)*size_ms)``.

    ``allowed_lateness_ms`` is how far behind the newest event of a partition
    an event may be and still count; ``idle_timeout_ms`` is how long (wall
    clock) a partition may stay silent before it stops holding windows open.
    """

    size_ms: int
    offset_ms: int = 0
    allowed_lateness_ms: int = 0
    idle_timeout_ms: int = 30_000

    def __post_init__(self) -> None:
        _require(
            isinstance(self.size_ms, int) and self.size_ms > 0,
            f"size_ms must be a positive integer, got {self.size_ms!r}; e.g. 60000 for one-minute windows",
        )
        _require(
            isinstance(self.offset_ms, int) and 0 <= self.offset_ms < self.size_ms,
            f"offset_ms must be an integer in [0, size_ms={self.size_ms}), got {self.offset_ms!r}",
        )
        _require(
            isinstance(self.allowed_lateness_ms, int) and self.allowed_lateness_ms >= 0,
            f"allowed_lateness_ms must be a non-negative integer, got {self.allowed_lateness_ms!r}",
        )
        _require(
            isinstance(self.idle_timeout_ms, int) and self.idle_timeout_ms > 0,
            f"idle_timeout_ms must be a positive integer, got {self.idle_timeout_ms!r}; "
            "make it longer than the consumer's poll interval",
        )

    @classmethod
    def of(cls, window: Any) -> WindowSpec:
        """The spec of a query's ``window`` setting (``size_ms``, ``offset_ms``, ``allowed_lateness_ms``,
        ``idle_timeout_ms``): the worker and the producer's ``--local-dp`` assign windows alike."""
        return cls(size_ms=window.size_ms, offset_ms=window.offset_ms,
                   allowed_lateness_ms=window.allowed_lateness_ms, idle_timeout_ms=window.idle_timeout_ms)

    def start_of(self, ts_ms: Any) -> Any:
        """Start of the window holding ``ts_ms`` (an int or an int64 array)."""
        return (ts_ms - self.offset_ms) // self.size_ms * self.size_ms + self.offset_ms

    def boundary_at_or_before(self, ms: int) -> int:
        """The latest window boundary (an end, equally a start) that is ``<= ms``."""
        return int(self.start_of(ms))


@dataclass(frozen=True)
class BoundingSpec:
    """Per-window contribution bounds of one privacy unit.

    A unit keeps at most ``max_groups_per_unit`` groups and at most
    ``max_events_per_group`` events in each, each value clipped to
    ``[clip_lo, clip_hi]``. Which ones are kept is decided by keyed hashes
    under ``secret`` (at least 16 bytes; never logged or shown in repr).
    """

    max_groups_per_unit: int
    max_events_per_group: int
    clip_lo: float = 0.0
    clip_hi: float = 0.0
    secret: bytes = field(default=b"", repr=False)

    def __post_init__(self) -> None:
        _require(
            isinstance(self.max_groups_per_unit, int) and self.max_groups_per_unit >= 1,
            f"max_groups_per_unit must be a positive integer, got {self.max_groups_per_unit!r}",
        )
        _require(
            isinstance(self.max_events_per_group, int) and self.max_events_per_group >= 1,
            f"max_events_per_group must be a positive integer, got {self.max_events_per_group!r}",
        )
        for name in ("clip_lo", "clip_hi"):
            bound = getattr(self, name)
            _require(
                isinstance(bound, (int, float)) and math.isfinite(bound),
                f"{name} must be a finite number, got {bound!r}",
            )
        _require(
            self.clip_lo <= self.clip_hi,
            f"clip_lo ({self.clip_lo}) must not exceed clip_hi ({self.clip_hi}); swap them",
        )
        _require(
            isinstance(self.secret, bytes) and len(self.secret) >= 16,
            "secret must be at least 16 bytes; generate one with secrets.token_bytes(32) "
            "and load it from the worker's secret store",
        )
        _ = self.pair_sums  # refuses a clip range too narrow for the pair sums' grid, here rather than mid-stream

    @cached_property
    def pair_sums(self) -> PairSumGrid:
        """Where one unit's clipped sum in one group goes (:mod:`stream_dp.windows.exact_sums`)."""
        return PairSumGrid(float(self.clip_lo), float(self.clip_hi), self.max_events_per_group)
