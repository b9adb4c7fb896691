"""One scenario's stream through the worker's own stages in this process: no Kafka, no Redis.

The records ``neighbours.records`` sends to the broker go, in sending order and on the partitions the
producer's partitioner gives their keys (or the explicit ones), through the query's window engine in
batches, the budget charge (in-memory store and journal, the ingest stage's ``charge_in_order``),
the partials' binary records, the window combiner, and the release build the release stage calls
(noise drawn by the worker's default noise source, continual trees carried from window to window).
The transport, the release ledger and the output producer are left out, so a release costs about a
millisecond and needs no service: the negative controls run their scenarios here, at sizes the
real-worker audit could not afford.

A doctoring (``tests/audit/doctor.py``) is switched on around the run when asked for.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from kafka.partitioner.default import murmur2

from stream_dp.budget import MemoryBudgetStore, policy_from_config
from stream_dp.config import parse_config
from stream_dp.windows import RawBatch
from stream_dp.worker import app
from stream_dp.worker.assemble.runtimes import build_runtimes
from stream_dp.worker.ingest.charge import charge_in_order, excluded_units
from stream_dp.worker.ingest.closed_windows import window_charge
from stream_dp.worker.ingest.partials_out import partial_message
from stream_dp.worker.partials.wire import Progress, partial_records
from stream_dp.worker.release import draw as release_draw
from stream_dp.worker.release.continual import period_of
from stream_dp.worker.release.intake import PartialsReader
from stream_dp.worker.release.publication_start import first_window_start
from stream_dp.worker.store.ledger import MemoryReleaseLedger
from stream_dp.worker.store.period_register import MemoryPeriodRegister
from tests.audit.doctor import doctored
from tests.audit.neighbours import SCENARIOS, SECRET, TOPIC_PARTITIONS, Scenario, _config, records
from tests.audit.releases import Releases

BATCH_RECORDS = 20_000  # records per engine batch (the real workers read a few thousand at a time)
START_MS = 1_795_438_896_000  # an even second: continual periods of two windows begin on the stream's first


@dataclass
class Combined:
    """One stream's windows of a scenario, charged and combined, ready for release (and released again)."""

    scenario: Scenario
    windows: int
    start_ms: int
    runtime: Any
    windows_combined: list[Any]
    clock: Any

    def release(self, doctoring: str | None = None, repeats: int = 1) -> Releases:
        """The records of every window, released ``repeats`` times with fresh noise: ``windows * repeats``
        samples, as many windows of the same events would give (a continual query's trees drawn anew each
        time). The ``r``-th release of window ``w`` is window ``r * windows + w`` of the result."""
        if repeats > 1 and self.windows % 2:
            raise ValueError("repeat an even number of windows: continual periods of two windows must stay whole")
        if repeats > 1 and self.runtime.plan.local is not None:
            raise ValueError("a local-DP release draws no noise (the producers do): take more windows, not repeats")
        out = Releases(self.start_ms, self.windows * repeats)
        with doctored(doctoring):
            noise = app.noise_source("exact")  # the worker's default sampler (doctored when asked)
            for r in range(repeats):
                shift = r * self.windows * 1000
                for record in _release(self.runtime, self.windows_combined, noise, self.clock):
                    record["window"]["start_ms"] += shift
                    record["window"]["end_ms"] += shift
                    out.add(self.scenario, record)
        return out

    def close(self) -> None:
        if self.runtime.sandbox is not None:
            self.runtime.sandbox.close()


def combine(scenario: Scenario, windows: int, *, with_target: bool, doctoring: str | None = None,
            start_ms: int = START_MS) -> Combined:
    """D (``with_target`` False) or D' of ``scenario`` through engine, charge, partials and combiner
    (``doctoring``: the local-DP producers', see ``neighbours.records``). Close it when done."""
    config = _config("ip", {s.topic: f"in-{s.topic}" for s in SCENARIOS}, {s.name: f"out-{s.name}" for s in SCENARIOS},
                     start_ms)
    config["queries"] = [q for q in config["queries"] if q["name"] == f"ip_{scenario.name}"]
    config["namespaces"] = {q["privacy_unit"]["namespace"]: config["namespaces"][q["privacy_unit"]["namespace"]]
                            for q in config["queries"]}
    parsed = parse_config(config)
    # The wall clock stands past every window (none waits for it, none is too old to release).
    now_ms = start_ms + (windows + 10) * 1000 + 10 * 60_000
    clock = lambda: now_ms  # noqa: E731
    (runtime,) = build_runtimes(parsed, secret=SECRET.encode(), clock_ms=clock)
    window = parsed.queries[0].window
    if runtime.public_groups is not None:  # as the release stage learns it: the file's publish_from, the backlog's start
        runtime.combiner.query_start_ms = first_window_start(window.publish_from_ms, window.size_ms, window.offset_ms)
    try:
        partitions = TOPIC_PARTITIONS[scenario.topic]
        sent = records(scenario.topic, start_ms, windows, with_target=with_target, doctoring=doctoring)
        partials = _closed_partials(runtime, scenario, sent, partitions, windows, with_target)
        _combine(runtime, parsed, partials, partitions, clock)
        combiner = runtime.combiner
        combined = [combiner.take(start) for start in combiner.ready()]
    except BaseException:
        if runtime.sandbox is not None:
            runtime.sandbox.close()
        raise
    return Combined(scenario, windows, start_ms, runtime, combined, clock)


def run_stream(scenario: Scenario, windows: int, *, with_target: bool, doctoring: str | None = None,
               repeats: int = 1, start_ms: int = START_MS) -> Releases:
    """What the scenario's query publishes for D (``with_target`` False) or D', doctored when asked."""
    combined = combine(scenario, windows, with_target=with_target, doctoring=doctoring, start_ms=start_ms)
    try:
        return combined.release(doctoring, repeats)
    finally:
        combined.close()


def _closed_partials(runtime: Any, scenario: Scenario, sent: list[tuple[bytes, bytes, int, int | None]],
                     partitions: int, windows: int, with_target: bool) -> list[Any]:
    engine = runtime.engine
    engine.set_partition_count(partitions)
    engine.assign(list(range(partitions)))
    placed = np.array([(murmur2(key) & 0x7FFFFFFF) % partitions if partition is None else partition
                       for key, _, _, partition in sent], dtype=np.int32)
    offsets = np.zeros(len(sent), dtype=np.int64)
    for p in range(partitions):
        mine = placed == p
        offsets[mine] = np.arange(int(mine.sum()))
    stamps = np.array([stamp for _, _, stamp, _ in sent], dtype=np.int64)
    partials, rejected = [], Counter()
    for lo in range(0, len(sent), BATCH_RECORDS):
        hi = min(lo + BATCH_RECORDS, len(sent))
        batch = RawBatch([value for _, value, _, _ in sent[lo:hi]], placed[lo:hi], offsets[lo:hi], stamps[lo:hi],
                         [key for key, _, _, _ in sent[lo:hi]])
        result = engine.process(batch)
        partials += result.partials
        rejected.update({reason.value: n for reason, n in result.rejected.items()})
    # As in the real-worker audit: D and D' differ by the target's events only, none lost on either side
    # but the spread target's two events a window on partitions its key does not map to.
    expected = Counter({"wrong_partition": 2 * windows}) if scenario.topic == "spread" and with_target else Counter()
    if rejected != expected:
        raise AssertionError(f"{scenario.name}: events rejected {dict(rejected)}, expected {dict(expected)}")
    return partials + engine.tick()


def _combine(runtime: Any, parsed: Any, partials: list[Any], partitions: int, clock: Any) -> None:
    """Charge every partial, as the ingest stage does, and hand it to the combiner through its records."""
    store = MemoryBudgetStore(policy_from_config(parsed), clock_ms=clock)
    journal, periods = MemoryReleaseLedger(), MemoryPeriodRegister(clock_ms=clock)
    ordered = sorted(partials, key=lambda p: (p.window_start_ms, p.partition))
    charges = [window_charge(runtime, partial) for partial in ordered]
    reader, now = PartialsReader(), clock()
    for partial, charge in zip(ordered, charge_in_order(journal, store, charges, periods)):
        if charge.error is not None:
            raise AssertionError(f"charge {charge} failed in process: nothing here should refuse it")
        excluded, _ = excluded_units(charge.units, charge.charged_units, charge.excluded)
        totals = partial.aggregate(excluded if excluded.any() else None, histogram=runtime.histogram,
                                   features=runtime.features, blocks=runtime.blocks)
        message = partial_message(runtime, partial, totals, input_partitions=partitions, units=len(charge.units),
                                  excluded=int(excluded.sum()), closed_at_ms=now)
        for chunk in partial_records(message, 1 << 20):
            read = reader.read(0, 0, chunk)
            if read is not None:
                runtime.combiner.add_partial(read, now_ms=now)
    closed_through = max((p.window_end_ms for p in partials), default=0)
    for p in range(partitions):
        runtime.combiner.add_progress(Progress(runtime.name, p, partitions, closed_through), runtime.combiner.home(0))


def _release(runtime: Any, combined: list[Any], noise: Any, clock: Any) -> list[dict]:
    """The records of the ``combined`` windows, drawn in window order by the release stage's build.

    As the stage does (``release.stage.ReleaseStage._publish``): ``release.draw.build_release`` draws every noise
    of a window once, a continual window continues the tree state stored with the window before it in its
    period; the records are those the stage would publish. The stage's ledger and producer are left out.
    """
    published: list[dict] = []
    previous: tuple[int, Any] | None = None  # (window start, tree state) of the window drawn last
    size = runtime.config.window.size_ms
    for window in combined:
        state = None
        if runtime.plan.continual is not None:
            start = window.window_start_ms
            period_start, _ = period_of(runtime, start)
            if previous is not None and previous[0] == start - size and start != period_start:
                state = previous[1]  # the tree continues from the window before, in its period
        entry = release_draw.build_release(runtime, window, noise, clock(), state)
        previous = (window.window_start_ms, entry.state)
        published.extend(orjson.loads(value) for _, value in entry.render())
    return published


def neighbours(scenario: Scenario, windows: int, doctoring: str | None = None,
               repeats: int = 1) -> tuple[Releases, Releases, float]:
    """(D's releases, D''s releases, seconds both took)."""
    started = time.perf_counter()
    d = run_stream(scenario, windows, with_target=False, doctoring=doctoring, repeats=repeats)
    d_prime = run_stream(scenario, windows, with_target=True, doctoring=doctoring, repeats=repeats)
    return d, d_prime, time.perf_counter() - started
