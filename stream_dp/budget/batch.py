"""Batch helpers shared by the backends: packing unit ids, digests, decoding results."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from stream_dp.budget.ledger import NamespaceLedger
from stream_dp.budget.policy import from_units
from stream_dp.budget.store import AlertRecord, ChargeOutcome, HorizonSpend

ALERT_DTYPE = np.dtype(
    [
        ("position", "<u4"),
        ("horizon", "u1"),
        ("old_level", "u1"),
        ("new_level", "u1"),
        ("refused", "u1"),
        ("spent", "<f8"),
        ("lapse_ms", "<f8"),
    ]
)
"""One packed alert transition (``struct.pack('<I4BBBBdd', ...)`` in charge.lua)."""


def as_unit_list(units: Sequence[str]) -> list[str]:
    """Validate a batch of unit ids: non-empty strings, all distinct."""
    listed = units.tolist() if isinstance(units, np.ndarray) else list(units)
    distinct = set(listed)
    if not all(type(u) is str for u in distinct):
        bad = next(u for u in listed if not isinstance(u, str))
        raise TypeError(f"unit ids must be str, got {type(bad).__name__} ({bad!r}); convert ids with str()")
    if len(distinct) != len(listed):
        raise ValueError(
            "unit ids in one charge must be distinct: each unit is charged once per window; "
            "deduplicate them (e.g. np.unique) before charging"
        )
    if "" in distinct:
        raise ValueError("unit ids must be non-empty: drop events without a privacy-unit id before windowing")
    return listed


def encode_unit(unit: str) -> bytes:
    return unit.encode("utf-8", "surrogatepass")


def decode_unit(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogatepass")


def pack_units(units: list[str]) -> tuple[bytes, bytes]:
    """Unit ids as one separator-joined blob plus their byte lengths (uint32 LE).

    Lengths make the blob unambiguous even if an id contains the separator;
    in the usual case they are found with numpy from the separator positions
    instead of encoding each id on its own.
    """
    blob = encode_unit("\x00".join(units))
    raw = np.frombuffer(blob, dtype=np.uint8)
    separators = np.flatnonzero(raw == 0)
    if len(separators) == len(units) - 1:
        bounds = np.concatenate(([-1], separators, [len(raw)]))
        lengths = np.diff(bounds) - 1
    else:
        lengths = np.fromiter((len(encode_unit(u)) for u in units), dtype=np.int64, count=len(units))
    return blob, lengths.astype("<u4").tobytes()


def cost_argument(cost_units: Sequence[int]) -> str:
    """Per-limit costs as the charge script reads them: one number when all are equal, else a comma list."""
    return str(cost_units[0]) if len(set(cost_units)) == 1 else ",".join(map(str, cost_units))


def charge_digest(cost_units: Sequence[int], time_ms: int, blob: bytes, lengths: bytes, order: bytes = b"") -> str:
    """Fingerprint of a charge's arguments, to detect a charge id reused for another call.

    ``order`` is the permutation that took the caller's units to ``blob``'s order, if any.
    """
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{cost_argument(cost_units)}|{time_ms}|{len(lengths)}|{len(order)}|".encode())
    h.update(lengths)
    h.update(order)
    h.update(blob)
    return h.hexdigest()


def excluded_mask(n: int, positions: bytes) -> np.ndarray:
    mask = np.zeros(n, dtype=bool)
    if positions:
        mask[np.frombuffer(positions, dtype="<u4")] = True
    return mask


def alert_records(
    ledger: NamespaceLedger, units: list[str], transitions: np.ndarray, time_ms: int
) -> list[AlertRecord]:
    """One record per threshold entered, from packed transitions."""
    policy = ledger.policy
    records: list[AlertRecord] = []
    for t in transitions:
        plan = ledger.horizons[int(t["horizon"])]
        for level in range(int(t["old_level"]) + 1, int(t["new_level"]) + 1):
            records.append(
                AlertRecord(
                    namespace=policy.name,
                    unit=units[int(t["position"])],
                    horizon_ms=plan.horizon_ms,
                    spent=from_units(int(t["spent"]), plan.scale),
                    limit=from_units(plan.limit_units, plan.scale),
                    threshold=policy.alert_at[level - 1],
                    time_ms=time_ms,
                    accounting="delta" if plan.delta else policy.accounting,
                    exhausted=bool(t["refused"]),
                )
            )
    return records


def level_entries(ledger: NamespaceLedger, transitions: np.ndarray) -> list[tuple[str, float, int]]:
    """(horizon label, threshold, lapse_ms) for each threshold entered, for the level gauge."""
    entries = []
    for t in transitions:
        plan = ledger.horizons[int(t["horizon"])]
        for level in range(int(t["old_level"]) + 1, int(t["new_level"]) + 1):
            entries.append((plan.label, ledger.policy.alert_at[level - 1], int(t["lapse_ms"])))
    return entries


def event_time(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= int(value) < 2**47:
        raise ValueError(f"times must be integer Unix milliseconds (0 <= t < 2**47), got {value!r}")
    return int(value)


def spend_report(ledger: NamespaceLedger, state: dict[int, int], time_ms: int) -> list[HorizonSpend]:
    report = []
    for plan, spent_units in zip(ledger.horizons, ledger.spent_units(state, time_ms), strict=True):
        spent = from_units(spent_units, plan.scale)
        epsilon, delta = (None, None) if plan.delta else ledger.policy.to_epsilon_delta(spent)
        report.append(
            HorizonSpend(
                horizon_ms=plan.horizon_ms,
                spent=spent,
                limit=from_units(plan.limit_units, plan.scale),
                fraction=spent_units / plan.limit_units,
                epsilon=epsilon,
                delta=delta,
                currency="delta" if plan.delta else ledger.policy.accounting,
            )
        )
    return report


class ChunkResult:
    """One script call's outcome and its refusals per horizon."""

    __slots__ = ("outcome", "refusals")

    def __init__(self, outcome: ChargeOutcome, refusals: list[int]) -> None:
        self.outcome = outcome
        self.refusals = refusals


def combine_chunks(parts: list[ChunkResult]) -> ChargeOutcome:
    if len(parts) == 1:
        return parts[0].outcome
    outcomes = [p.outcome for p in parts]
    by_horizon: dict[str, int] = {}
    for o in outcomes:
        for h, c in o.excluded_by_horizon.items():
            by_horizon[h] = by_horizon.get(h, 0) + c
    return ChargeOutcome(
        excluded=np.concatenate([o.excluded for o in outcomes]),
        charged=sum(o.charged for o in outcomes),
        alerts=[a for o in outcomes for a in o.alerts],
        replayed=all(o.replayed for o in outcomes),
        excluded_by_horizon=by_horizon,
    )


def refusal_counts(parts: list[ChunkResult]) -> list[int]:
    totals = [0] * len(parts[0].refusals)
    for p in parts:
        if not p.outcome.replayed:
            totals = [a + b for a, b in zip(totals, p.refusals, strict=True)]
    return totals
