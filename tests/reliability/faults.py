"""The faults a run can inject, and the seeded catalogue of the full suite.

Every fault draws its timing (and its victim) from the run's seeded
generator, so a seed reproduces the same schedule; the exact step at which a
worker dies is pinned by the Redis fault proxy (``redis_proxy``) where it
matters: a budget charge, the release-ledger claim, marking a release
published.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace

from tests.reliability import effects
from tests.reliability.harness import RunContext, assigned_partitions
from tests.reliability.redis_proxy import Trigger, is_budget_charge, is_ledger_claim, is_mark_published
from tests.reliability.topics import wait_until

_STEPS = {
    "charge": (is_budget_charge, "budget charge"),
    "claim": (is_ledger_claim, "release-ledger claim"),
    "mark": (is_mark_published, "mark-published"),
}


@dataclass
class KillDuringIngest:
    """``kill -9`` of a worker at a random time while events stream in; restarted after a pause."""

    name: str = "kill -9 during ingestion"

    kind: str = "worker kill -9 while ingesting"

    def inject(self, ctx: RunContext) -> None:
        time.sleep(ctx.uniform(2.0, ctx.stream.duration_s - 4.0))
        kill_while_ingesting(ctx, self.kind, ctx.uniform(0.5, 3.0))


def kill_while_ingesting(ctx: RunContext, kind: str, pause_s: float) -> None:
    worker = ctx.pick_worker()
    if ctx.kill(worker, "while ingesting"):
        ctx.injected(f"kill -9 of {worker.name} while ingesting")
    time.sleep(pause_s)
    before = ctx.restart(worker)
    ctx.expect(kind, f"{worker.name} restarted and rejoined the group", ctx.rejoined(worker, before))


@dataclass
class KillAtStep:
    """``kill -9`` of the worker that reaches the n-th ``step`` (a Redis command), frozen there by the proxy.

    ``forward``: the command reached Redis (the step happened, its reply was lost);
    otherwise it never did.
    """

    step: str
    forward: bool
    name: str = ""

    def __post_init__(self) -> None:
        what = _STEPS[self.step][1]
        if not self.name:
            self.name = f"kill -9 {'after' if self.forward else 'before'} {what}"

    @property
    def kind(self) -> str:
        return step_kind(self.step, self.forward)

    def inject(self, ctx: RunContext) -> None:
        time.sleep(ctx.uniform(1.0, ctx.stream.duration_s / 2))
        freeze_and_kill(ctx, self.step, self.forward, occurrence=int(ctx.rng.integers(1, 4)))


def step_kind(step: str, forward: bool) -> str:
    return f"worker kill -9 {'after' if forward else 'before'} {_STEPS[step][1]}"


def freeze_and_kill(ctx: RunContext, step: str, forward: bool, occurrence: int, timeout_s: float = 60.0) -> None:
    matches, what = _STEPS[step]
    trigger = Trigger(matches, occurrence=occurrence, forward=forward)
    for proxy in ctx.proxies:
        proxy.arm(trigger)
    if not trigger.fired.wait(timeout_s):
        for proxy in ctx.proxies:
            proxy.arm(None)
        ctx.note(f"no worker reached {what} #{occurrence} within {timeout_s:.0f}s; nothing killed")
        return
    for proxy in ctx.proxies:
        proxy.arm(None)
    index = next(i for i, p in enumerate(ctx.proxies) if p.port == trigger.fired_by)
    worker = ctx.workers[index]
    key = trigger.command[3] if step != "mark" else trigger.command[1]
    if ctx.kill(worker, f"frozen {'after' if forward else 'before'} {what} #{occurrence} ({key.decode(errors='replace')})"):
        ctx.injected(f"kill -9 {'after' if forward else 'before'} {what}")
        ctx.facts["frozen_kills"] = ctx.facts.get("frozen_kills", 0.0) + 1
    ctx.proxies[index].drop_frozen()
    time.sleep(ctx.uniform(0.5, 3.0))
    before = ctx.restart(worker)
    ctx.expect(step_kind(step, forward), f"{worker.name}, killed at the {what}, restarted and rejoined the group",
               ctx.rejoined(worker, before))


@dataclass
class RedisOutage:
    """Redis stopped (``kill -9`` or a clean shutdown) for some seconds, then started on its data."""

    crash: bool = True
    name: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            self.name = f"redis {'kill -9' if self.crash else 'shutdown'} and restart"

    @property
    def kind(self) -> str:
        return f"redis {'kill -9' if self.crash else 'shutdown'}"

    def inject(self, ctx: RunContext) -> None:
        time.sleep(ctx.uniform(2.0, ctx.stream.duration_s - 6.0))
        outage(ctx, ctx.uniform(3.0, 8.0), crash=self.crash, kind=self.kind)


HELD_WAIT_S = 30.0


def outage(ctx: RunContext, seconds: float, *, crash: bool, kind: str, during=None) -> None:
    """Stop Redis for ``seconds``, and on until windows are held or a charge failed closed (at most
    ``HELD_WAIT_S`` more); ``during(ctx)`` runs while it is down.

    Expected: windows held (window partials waiting for their charge, or charges that failed closed) and
    nothing published while Redis was away (a release needs its ledger entry). Only a worker that owns
    partitions closes windows: an outage that fell inside a rebalance (a killed worker's session timing out,
    seen with *combined*, seed 450) would otherwise end before any window needed a charge."""
    if ctx.redis.running:
        ctx.injected(f"redis {'killed' if crash else 'shut down'}")
    ctx.redis.stop(crash=crash)
    stopped_ms = effects.wall_ms()
    ctx.note(f"redis {'killed' if crash else 'shut down'} for {seconds:.1f}s")
    ends = time.monotonic() + seconds
    seen = {"held": 0.0, "failures": 0.0}
    baseline = effects.failed_closed(ctx)  # the counter holds earlier faults' failures too
    back = threading.Event()

    def sample() -> None:  # all through the outage, whatever ``during`` does meanwhile
        while not back.wait(0.5):
            seen["held"] = max(seen["held"], effects.pending_charges(ctx))
            seen["failures"] = max(seen["failures"], effects.failed_closed(ctx) - baseline)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        if during is not None:
            during(ctx)
        time.sleep(max(0.0, ends - time.monotonic()))
        if not (seen["held"] or seen["failures"]):
            waited = time.monotonic()
            wait_until(lambda: seen["held"] > 0 or seen["failures"] > 0, HELD_WAIT_S, 0.5)
            ctx.note(f"redis kept down {time.monotonic() - waited:.1f}s more, until windows were held")
    finally:
        back.set()
        sampler.join(10)
    held, failures = seen["held"], seen["failures"]
    back_ms = effects.wall_ms()
    ctx.redis.start()
    ctx.facts["held"] = max(ctx.facts.get("held", 0.0), held)
    ctx.facts["failed_closed"] = max(ctx.facts.get("failed_closed", 0.0), failures)
    ctx.note(f"redis back; up to {held:.0f} window partials were held, {failures:.0f} charge attempts failed closed")
    ctx.expect(kind, "windows held or charges failed closed while Redis was away", held > 0 or failures > 0,
               f"({held:.0f} held, {failures:.0f} failed closed)")
    during_outage = effects.published_between(effects.output_records(ctx), stopped_ms + effects.GRACE_MS, back_ms)
    ctx.expect(kind, "nothing published while Redis was away", during_outage == 0,
               f"({during_outage} records published)")


@dataclass
class KillWhileHeld:
    """Redis down, windows held uncharged, and then a worker killed (restarted before Redis returns)
    or, with ``leave``, stopped gracefully (its partitions move to the other worker)."""

    leave: bool = False
    name: str = ""
    injections: int = 2

    def __post_init__(self) -> None:
        if not self.name:
            what = "worker removed (rebalance)" if self.leave else "kill -9 of a worker"
            self.name = f"redis down + {what} while windows are held"

    @property
    def kind(self) -> str:
        return f"redis kill -9 + worker {'removed' if self.leave else 'kill -9'} while windows are held"

    def inject(self, ctx: RunContext) -> None:
        time.sleep(ctx.uniform(2.0, ctx.stream.duration_s / 2))

        def kill_one(ctx: RunContext) -> None:
            held = 0.0
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not held:
                held = effects.pending_charges(ctx)
                time.sleep(0.3)
            ctx.expect(self.kind, "windows held when the worker went", held > 0, f"({held:.0f} held)")
            time.sleep(1.5)  # past the ingest stage's commit interval
            worker = ctx.pick_worker()
            survivors = [w for w in ctx.workers if w is not worker and w.alive]
            offsets = {w.name: w.log_size() for w in survivors}
            if self.leave:
                if ctx.leave(worker):
                    ctx.injected(f"{worker.name} removed while windows were held")
                ctx.expect(self.kind, "the other workers took its partitions over (a rebalance)",
                           effects.took_over(ctx, survivors, offsets, ctx.stream.partitions, timeout_s=30))
                return
            if ctx.kill(worker, "while windows were held"):
                ctx.injected(f"kill -9 of {worker.name} while windows were held")
            time.sleep(ctx.uniform(0.5, 2.0))
            before = ctx.restart(worker)
            ctx.expect(self.kind, f"{worker.name} restarted and rejoined the group", ctx.rejoined(worker, before, 30))

        outage(ctx, ctx.uniform(8.0, 11.0), crash=True, kind=self.kind, during=kill_one)


@dataclass
class BrokerOutage:
    """The Kafka broker stopped (SIGTERM, or ``kill -9``) for some seconds, then restarted."""

    crash: bool = False
    name: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            self.name = f"kafka broker {'kill -9' if self.crash else 'stop'} and restart"

    @property
    def kind(self) -> str:
        return f"broker {'kill -9' if self.crash else 'stop'}"

    def inject(self, ctx: RunContext) -> None:
        if ctx.kafka is None:
            raise RuntimeError("a broker fault needs the run on a private broker (FaultRun(kafka=...))")
        time.sleep(ctx.uniform(2.0, ctx.stream.duration_s - 6.0))
        if ctx.kafka.running:
            ctx.injected(f"broker {'killed' if self.crash else 'stopped'}")
        ctx.kafka.stop(crash=self.crash)
        seconds = ctx.uniform(4.0, 10.0)
        ctx.note(f"broker {'killed' if self.crash else 'stopped'} for {seconds:.1f}s")
        time.sleep(seconds)
        ended_ms = effects.wall_ms() - ctx.stream.lateness_ms
        ctx.kafka.start()
        ctx.note("broker back")
        expect_held_through(ctx, self.kind, "the broker", ended_ms, effects.wall_ms())


def expect_held_through(ctx: RunContext, kind: str, what: str, ended_by_ms: int, back_ms: int) -> None:
    """Expected of an outage the workers cannot publish through: windows that closed during it were held
    and published once it ended (the completion check says they all were; this, that some waited)."""
    def held() -> int:
        return effects.held_then_released(effects.output_records(ctx), ended_by_ms, back_ms)

    seen = wait_until(lambda: held() > 0, 120, 2.0)
    ctx.expect(kind, f"windows that closed while {what} was away held and published after it came back", seen)


@dataclass
class AddWorker:
    name: str = "worker added mid-window (rebalance)"
    kind: str = "worker added"

    def inject(self, ctx: RunContext) -> None:
        time.sleep(ctx.uniform(2.0, ctx.stream.duration_s - 6.0))
        worker = ctx.new_worker()
        ctx.injected(f"added {worker.name}")
        ctx.expect(self.kind, f"{worker.name} was assigned input partitions (a rebalance)", wait_until(
            lambda: bool(assigned_partitions(worker, ctx.input_topic)), 90, 0.5))


@dataclass
class RemoveWorker:
    """A worker leaves gracefully mid-window; ``rejoin``: it comes back a few seconds later."""

    rejoin: bool = False
    name: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            self.name = "worker removed mid-window" + (" and re-added" if self.rejoin else "") + " (rebalance)"

    @property
    def kind(self) -> str:
        return "worker removed" + (" and rejoined" if self.rejoin else "")

    def inject(self, ctx: RunContext) -> None:
        time.sleep(ctx.uniform(2.0, ctx.stream.duration_s - 6.0))
        worker = ctx.pick_worker()
        survivors = [w for w in ctx.workers if w is not worker and w.alive]
        offsets = {w.name: w.log_size() for w in survivors}
        if ctx.leave(worker):
            ctx.injected(f"{worker.name} removed")
        if self.rejoin:
            time.sleep(ctx.uniform(2.0, 5.0))
            before = ctx.restart(worker)
            ctx.expect(self.kind, f"{worker.name} rejoined the group", ctx.rejoined(worker, before))
        else:
            ctx.expect(self.kind, "the other workers took its partitions over (a rebalance)",
                       effects.took_over(ctx, survivors, offsets, ctx.stream.partitions))


@dataclass
class KillAll:
    name: str = "kill -9 of every worker at once"
    kind: str = "every worker kill -9"

    def inject(self, ctx: RunContext) -> None:
        time.sleep(ctx.uniform(2.0, ctx.stream.duration_s - 4.0))
        victims = [w for w in ctx.workers if w.alive]
        killed = [ctx.kill(worker, "(all workers)") for worker in victims]
        if killed and all(killed):
            ctx.injected(f"kill -9 of all {len(victims)} workers")
        time.sleep(ctx.uniform(1.0, 3.0))
        offsets = {worker.name: ctx.restart(worker) for worker in victims}
        ctx.expect(self.kind, "every worker restarted and rejoined the group",
                   all(ctx.rejoined(worker, offsets[worker.name]) for worker in victims))


@dataclass
class Together:
    """Several faults at once, each on its own thread."""

    parts: tuple
    name: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            self.name = " + ".join(p.name for p in self.parts)

    @property
    def injections(self) -> int:
        return sum(getattr(p, "injections", 1) for p in self.parts)

    def inject(self, ctx: RunContext) -> None:
        errors: list[BaseException] = []

        def run(part) -> None:
            try:
                part.inject(ctx)
            except BaseException as exc:  # re-raised below on the fault thread
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(p,), daemon=True) for p in self.parts]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]


@dataclass
class Sequence:
    """Several faults one after the other in one longer stream: each gets an equal share of the stream
    (its ``ctx.stream.duration_s`` is that share while it runs), so the last still meets a running stream."""

    parts: tuple
    name: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            self.name = " then ".join(p.name for p in self.parts)

    @property
    def injections(self) -> int:
        return sum(getattr(p, "injections", 1) for p in self.parts)

    def inject(self, ctx: RunContext) -> None:
        whole = ctx.stream
        share = replace(whole, duration_s=max(8.0, (whole.duration_s - 4.0) / len(self.parts)))
        for part in self.parts:
            ctx.stream = share
            try:
                part.inject(ctx)
            finally:
                ctx.stream = whole


@dataclass
class EveryStage:
    """A worker killed at every stage in turn, in one longer stream: while ingesting, before and after a
    budget charge, before and after the ledger claim, and before marking a release published."""

    name: str = "kill -9 at every stage in turn"
    injections: int = 6
    parts: tuple = (KillDuringIngest(), *(KillAtStep(step, forward) for step, forward in (
        ("charge", False), ("charge", True), ("claim", False), ("claim", True), ("mark", False))))

    def inject(self, ctx: RunContext) -> None:
        time.sleep(ctx.uniform(2.0, 3.0))
        kill_while_ingesting(ctx, KillDuringIngest.kind, ctx.uniform(0.5, 1.5))
        for step, forward in (("charge", False), ("charge", True), ("claim", False), ("claim", True), ("mark", False)):
            time.sleep(ctx.uniform(1.0, 2.0))
            freeze_and_kill(ctx, step, forward, occurrence=1)
