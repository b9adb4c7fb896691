"""Evidence that a fault had the effect its kind must have: read from the topics, the logs and the counters.

A fault that happened without its effect proves nothing: a Redis outage
during which no window closed held nothing, a worker removed whose
partitions nobody took over was no rebalance. Each fault records what it
expected with ``RunContext.expect``; these helpers read the evidence.
Output and partials topics are stamped by the broker (``LogAppendTime``),
so release times are the broker's, whatever the workers' clocks say.
"""

from __future__ import annotations

import time

import orjson

from tests.reliability.harness import RunContext, assigned_partitions
from tests.reliability.topics import TopicRecord, read_topic
from tests.reliability.workers import WorkerProcess, metric_total

GRACE_MS = 1_500  # a publish already past its last Redis call when Redis went may still land


def wall_ms() -> int:
    return int(time.time() * 1000)


def output_records(ctx: RunContext) -> list[TopicRecord]:
    """Every release record of the run so far, of deleted output topics too."""
    records = [r for rs in ctx.removed_outputs.values() for r in rs]
    for topic in ctx.output_topics.values():
        records += read_topic(ctx.bootstrap, topic)
    return records


def published_between(records: list[TopicRecord], since_ms: int, until_ms: int) -> int:
    return sum(since_ms <= r.timestamp < until_ms for r in records)


def held_then_released(records: list[TopicRecord], ended_by_ms: int, back_ms: int) -> int:
    """Releases of windows that ended by ``ended_by_ms`` (closed during an outage) published once the
    service was back (``back_ms`` on): windows held through the outage, not lost."""
    count = 0
    for record in records:
        end = orjson.loads(record.value)["window"]["end_ms"]
        if end <= ended_by_ms and record.timestamp >= back_ms:
            count += 1
    return count


def pending_charges(ctx: RunContext) -> float:
    return sum(metric_total(t, "stream_dp_pending_charges") for t in ctx.scrape_all())


def failed_closed(ctx: RunContext) -> float:
    """Charge attempts that failed closed so far (a counter: compare two readings of one fault)."""
    return sum(metric_total(t, "stream_dp_budget_failures_total", kind="unavailable") for t in ctx.scrape_all())


def took_over(ctx: RunContext, survivors: list[WorkerProcess], offsets: dict[str, int], partitions: int,
              timeout_s: float = 90.0) -> bool:
    """Whether a rebalance happened: a survivor logged a new assignment past its offset, and the running
    workers' latest assignments cover every input partition."""
    from tests.reliability.topics import wait_until

    def done() -> bool:
        moved = any(ctx_log_from(w, offsets.get(w.name, 0)).count("assigned [") for w in survivors if w.alive)
        covered: set[int] = set()
        for worker in ctx.workers:
            if worker.alive:
                covered |= assigned_partitions(worker, ctx.input_topic) or set()
        return moved and covered == set(range(partitions))

    return wait_until(done, timeout_s, 0.5)


def ctx_log_from(worker: WorkerProcess, offset: int) -> str:
    if not worker.log_path.exists():
        return ""
    with open(worker.log_path, "rb") as log:
        log.seek(offset)
        return log.read().decode(errors="replace")
