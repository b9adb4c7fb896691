"""Faults on the worker's own topics: the broker gone between ledger claim and publish, the output topic
deleted while running, poison records on the partials topic.

Like every fault, each calls ``ctx.injected`` only once it has really
happened; ``verify`` adds what the run must show beyond the common checks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from tests.reliability import effects
from tests.reliability.checks import CheckReport
from tests.reliability.harness import RunContext
from tests.reliability.redis_proxy import is_ledger_claim
from tests.reliability.topics import _kafka, create_topic, delete_topics, read_topic, wait_until
from tests.reliability.workers import metric_total


def _hold_claims(ctx: RunContext, timeout_s: float) -> bool:
    """Hold every worker at its next release-ledger claim; True once one is held there."""
    for proxy in ctx.proxies:
        proxy.hold(is_ledger_claim)
    return wait_until(lambda: any(p.holding for p in ctx.proxies), timeout_s, 0.05)


def _release_claims(ctx: RunContext) -> None:
    for proxy in ctx.proxies:
        proxy.release_holds()


@dataclass
class BrokerStopAtClaim:
    """The broker stopped while a worker is at its release-ledger claim: the claim then goes through
    (noise stored) and the publish meets no broker, for some seconds."""

    crash: bool = False
    name: str = "broker stopped between ledger claim and publish"
    kind: str = "broker stop between ledger claim and publish"

    def inject(self, ctx: RunContext) -> None:
        if ctx.kafka is None:
            raise RuntimeError("a broker fault needs the run on a private broker (FaultRun(kafka=...))")
        time.sleep(ctx.uniform(2.0, ctx.stream.duration_s / 2))
        held = _hold_claims(ctx, 60)
        try:
            if held:
                ctx.kafka.stop(crash=self.crash)
                ctx.injected("broker stopped while a worker held a ledger claim")
        finally:
            _release_claims(ctx)
        if not held:
            ctx.note("no worker reached a ledger claim within 60s; the broker was left running")
            return
        seconds = ctx.uniform(4.0, 8.0)
        ctx.note(f"claims released into a stopped broker for {seconds:.1f}s")
        time.sleep(seconds)
        ended_ms = effects.wall_ms() - ctx.stream.lateness_ms
        ctx.kafka.start()
        ctx.note("broker back")
        from tests.reliability.faults import expect_held_through

        expect_held_through(ctx, self.kind, "the broker", ended_ms, effects.wall_ms())


@dataclass
class OutputTopicDeleted:
    """An output topic deleted while windows are being released; the worker must recover once it exists
    again (the private broker auto-creates topics on use, as Kafka does by default; if it has not within
    a few seconds the fault creates it, as an operator would)."""

    name: str = "output topic deleted while running"
    kind: str = "output topic deleted"

    def inject(self, ctx: RunContext) -> None:
        time.sleep(ctx.uniform(3.0, ctx.stream.duration_s - 4.0))
        query = sorted(ctx.output_topics)[int(ctx.rng.integers(0, len(ctx.output_topics)))]
        topic = ctx.output_topics[query]
        # No release may land between reading the topic and deleting it, or the evidence would lose it.
        _hold_claims(ctx, 10)
        try:
            time.sleep(1.5)  # a publish already past its claim finishes
            ctx.removed_outputs[query] = read_topic(ctx.bootstrap, topic)
            delete_topics(ctx.bootstrap, [topic])
            gone = wait_until(lambda: topic not in _topics(ctx.bootstrap), 10, 0.2)
        finally:
            _release_claims(ctx)
        if not gone:
            ctx.note(f"{topic} could not be deleted")
            return
        ctx.injected(f"deleted {topic} ({len(ctx.removed_outputs[query])} records saved as evidence)")
        if not wait_until(lambda: topic in _topics(ctx.bootstrap), ctx.uniform(3.0, 6.0), 0.3):
            try:
                create_topic(ctx.bootstrap, topic, 1)
                ctx.note(f"recreated {topic}")
            except Exception as exc:  # created by the worker's producer meanwhile
                ctx.note(f"recreating {topic}: {type(exc).__name__}")
        else:
            ctx.note(f"{topic} was created again on use")
        ctx.expect(self.kind, f"windows released to {topic} once it existed again",
                   wait_until(lambda: bool(read_topic(ctx.bootstrap, topic)), 120, 2.0))


def _topics(bootstrap: str) -> set[str]:
    kafka = _kafka()
    consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        return set(consumer.topics())
    finally:
        consumer.close()


@dataclass
class PoisonPartials:
    """Three records on the partials topic no worker wrote: garbage bytes, a partial of an unknown wire
    version and one of an unknown query. Each must be counted and skipped, every window still released."""

    name: str = "poison records on the partials topic"
    kind: str = "poison records on the partials topic"

    def inject(self, ctx: RunContext) -> None:
        from stream_dp.wire.frame import BINARY_VERSION
        from stream_dp.worker.partials.wire import PartialAggregate, encode_partial, partial_key
        import numpy as np

        time.sleep(ctx.uniform(2.0, ctx.stream.duration_s - 4.0))
        start = (int(time.time() * 1000) // ctx.stream.window_ms) * ctx.stream.window_ms
        stranger = encode_partial(PartialAggregate(
            query="no_such_query", window_start_ms=start, window_end_ms=start + ctx.stream.window_ms, partition=0,
            input_partitions=ctx.stream.partitions, groups=[("home",)], count=np.array([3]), sum=np.array([3.0]),
            distinct_units=np.array([1]), units_charged=1, units_excluded=0, closed_at_ms=start))
        if stranger[4] != BINARY_VERSION:
            raise RuntimeError("cannot forge a partial of another wire version: the encoding changed")
        # The version byte follows the 4 magic bytes (stream_dp.wire.frame).
        future = stranger[:4] + bytes([99]) + stranger[5:].replace(b"no_such_query", sorted(ctx.output_topics)[0].encode())
        producer = _kafka().KafkaProducer(bootstrap_servers=ctx.bootstrap, acks="all")
        try:
            sent = []
            for partition in range(2):  # every home partition of the partials topic
                for value in (b"\x00\xffnot a partial{", future, stranger):
                    sent.append(producer.send(ctx.partials_topic, key=partial_key("poison", start), value=value,
                                              partition=partition))
            producer.flush()
            for future_record in sent:
                metadata = future_record.get(timeout=30)
                ctx.planted_partials.add((metadata.partition, metadata.offset))
        finally:
            producer.close(timeout=5)
        ctx.injected(f"planted {len(sent)} poison records on {ctx.partials_topic}")

    def verify(self, ctx: RunContext, pages: list[str], report: CheckReport) -> None:
        corrupt = sum(metric_total(t, "stream_dp_internal_errors_total", kind="corrupt_internal_record") for t in pages)
        version = sum(metric_total(t, "stream_dp_internal_errors_total", kind="unknown_wire_version") for t in pages)
        unknown = sum(metric_total(t, "stream_dp_internal_errors_total", kind="unknown_query") for t in pages)
        planted = len(ctx.planted_partials)
        ctx.expect(self.kind, "each poison record counted under its kind and skipped",
                   min(corrupt, version, unknown) >= planted // 3 > 0,
                   f"({planted} planted; counted {corrupt:.0f} corrupt, {version:.0f} of an unknown wire version, "
                   f"{unknown:.0f} of an unknown query)")
