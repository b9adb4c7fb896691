"""Garbage through a real worker: a clean stream with generated hostile messages shuffled in.

The worker must stay up, dead-letter every hostile message with a reason
that describes it (and its original bytes), and publish for every window
exactly the partials the window engine computes from the clean messages
alone -- the deterministic path to the released values, which are noisy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

from stream_dp.config import load_config
from stream_dp.windows.record_clock import PRODUCER_QUORUM
from tests.reliability.checks import CheckReport, Observed, check_partials, dead_letter_sources, is_copy_of
from tests.reliability.fuzz_messages import collect, garbage, oversized
from tests.reliability.model import compute_truth
from tests.reliability.scenario import PAGES, SECRET, Scenario
from tests.reliability.topics import kafka_partition, read_topic

PARTITIONS = 2
WINDOWS = 4
UNITS = 80
CLEAN = frozenset({"clean"})
CLOSER = frozenset({"closer"})


@dataclass
class FuzzOutcome:
    messages: int
    report: CheckReport = field(default_factory=CheckReport)
    seconds: float = 0.0
    work_dir: Path | None = None

    @property
    def passed(self) -> bool:
        return not self.report.violations

    def describe(self) -> str:
        lines = [f"--- worker fuzz: {self.messages} hostile messages: {'survived' if self.passed else 'FAILED'} "
                 f"in {self.seconds:.0f}s; dead letters by reason: "
                 + ", ".join(f"{k.split(': ')[1]}={v}" for k, v in sorted(self.report.stats.items())
                             if k.startswith("dead letters: "))]
        lines += [f"    VIOLATION: {v}" for v in self.report.violations[:20]]
        lines.append(f"    logs: {self.work_dir}")
        return "\n".join(lines)


def run_worker_fuzz(bootstrap: str, work_dir: Path, *, messages: int, seed: int) -> FuzzOutcome:
    started = time.monotonic()
    work_dir.mkdir(parents=True, exist_ok=True)
    outcome = FuzzOutcome(messages, work_dir=work_dir)
    report = outcome.report
    s = Scenario(work_dir, bootstrap, partitions=PARTITIONS)
    try:
        rng = np.random.default_rng(seed)  # synthetic data and shuffling only
        now_ms = int(time.time() * 1000)
        hostile = collect(garbage(now_ms, s.base_ms, oversize=False), messages - messages // 500, seed=seed)
        hostile += collect(oversized(s.base_ms), messages // 500, seed=seed + 1, chunk=max(1, messages // 500))
        clean = {p: [] for p in range(PARTITIONS)}
        for k in range(WINDOWS):
            for u in range(UNITS):
                for page in PAGES[: 1 + u % 2]:
                    clean[kafka_partition(f"c{u}", PARTITIONS)].append(
                        s.event(f"c{u}", k, page=page, value=float(u % 11), at_ms=u * 20))
        streams: dict[int, list[tuple[bytes, frozenset | None]]] = {}
        for p in range(PARTITIONS):
            mine = [hostile[i] for i in range(p, len(hostile), PARTITIONS)]
            slots = np.sort(rng.integers(0, len(clean[p]) + 1, len(mine)))
            merged: list[tuple[bytes, frozenset | None]] = []
            j = 0
            for position, value in enumerate(clean[p]):
                while j < len(mine) and slots[j] <= position:
                    merged.append(mine[j])
                    j += 1
                merged.append((value, CLEAN))
            merged += mine[j:]
            # its own window stays open: not part of the check
            # as many as a trusted producer clock needs (``record_clock``) to close the last window checked
            merged += [(s.closer(WINDOWS, unit=unit), CLOSER) for unit in _units_on(p, PRODUCER_QUORUM)]
            streams[p] = merged
        s.start_worker()
        for p, merged in streams.items():
            stamps = _send_times(s, merged)
            for first in range(0, len(merged), 5_000):
                s.produce([m for m, _ in merged[first:first + 5_000]], partition=p,
                          timestamps=stamps[first:first + 5_000])
        if not s.wait_released(WINDOWS - 1, 120 + messages / 1_000):
            report.fail("release stalled", f"window {WINDOWS - 1} was not released")
        time.sleep(2.0)
        if not s.worker.alive:
            report.fail("crash", f"the worker died (exit {s.worker.reap()}); see {s.worker.log_path}")
        elif (logged := s.worker.first_traceback()) is not None:
            report.fail("traceback", f"the worker logged a traceback; see {s.worker.log_path}:\n{logged}")
        _check(s, streams, report)
    finally:
        s.close()
    outcome.seconds = time.monotonic() - started
    return outcome


def _send_times(s: Scenario, merged: list[tuple[bytes, frozenset | None]]) -> list[int]:
    """Record timestamps as a producer sending the stream live gives them: a clean event's own time,
    and for a hostile message the time of the clean one before it (its contents are not a clock)."""
    stamps, last = [], s.base_ms
    for value, kind in merged:
        if kind in (CLEAN, CLOSER):
            last = int(orjson.loads(value)["ts"])
        stamps.append(last)
    return stamps


def _units_on(partition: int, count: int) -> list[str]:
    """``count`` unit ids the default partitioner places on ``partition``."""
    units = (f"closer-{i}" for i in range(100 * count * PARTITIONS))
    return [unit for unit in units if kafka_partition(unit, PARTITIONS) == partition][:count]


def _check(s: Scenario, streams: dict[int, list[tuple[bytes, frozenset | None]]], report: CheckReport) -> None:
    inputs = read_topic(s.bootstrap, s.input_topic)
    kind = {(r.partition, r.offset): streams[r.partition][r.offset][1] for r in inputs}
    if len(inputs) != sum(map(len, streams.values())):
        report.fail("produce", f"{len(inputs)} messages on the input topic, {sum(map(len, streams.values()))} sent")
    clean = [r for r in inputs if kind[(r.partition, r.offset)] == CLEAN]
    config = load_config(s.config_path)
    observed = Observed(
        input_topic=s.input_topic, input_records=inputs, partials=read_topic(s.bootstrap, f"{s.prefix}partials"),
        outputs={}, dead_letters=s.dead_letters(),
        public_groups={q.name: q.public_group_keys() or [] for q in config.queries}, window_ms=0,
    )
    check_partials(observed, compute_truth(config, SECRET.encode(), clean), PARTITIONS, report)
    sources = dead_letter_sources(observed)
    values = {(r.partition, r.offset): r.value for r in inputs}
    for record in observed.dead_letters:
        parts = record.headers.get("source", b"").decode().rsplit("/", 2)
        if len(parts) == 3 and not is_copy_of(record, values.get((int(parts[1]), int(parts[2])))):
            report.fail("dead letter altered", f"dead letter of {parts[1]}@{parts[2]} is not the bounded copy "
                        "(head, size, digest) of the original bytes")
        if not record.headers.get("detail"):
            report.fail("no detail", f"dead letter of {parts[1:]} has no detail header")
    for (partition, offset), allowed in kind.items():
        reasons = sources.get((s.query, partition, offset), set())
        if allowed in (CLEAN, CLOSER):
            if reasons:
                report.fail("clean rejected", f"clean message {partition}@{offset} was dead-lettered as {reasons}")
            continue
        report.count("hostile")
        if len(reasons) != 1:
            report.fail("dead letter missing", f"hostile message {partition}@{offset} has dead-letter reasons {reasons}")
        elif "late" in reasons or (allowed is not None and not reasons <= allowed):
            report.fail("wrong reason", f"hostile message {partition}@{offset} dead-lettered as {reasons}, "
                                        f"expected one of {sorted(allowed or ['any but late'])}")
    for record in observed.dead_letters:
        report.count(f"dead letters: {record.headers.get('reason', b'').decode()}")
