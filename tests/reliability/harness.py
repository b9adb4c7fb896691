"""One fault run: services, workers, the live stream, a fault injected at a seeded point, the checks.

A run owns a private Redis (behind one fault proxy per worker slot), fresh
topics and its worker processes; the Kafka broker is given (a private one
when the fault stops it). A supervisor thread plays the part of a process
manager: a worker that exits on its own is restarted, as Kubernetes or
systemd would, but the exit fails the run unless the fault said it would
stop the workers (``Fault.stops_workers``): a crash hidden by a restart is
still a crash.

Every fault kind states the effect it must have had (``RunContext.expect``):
windows held while Redis was away, charges failed closed, a rebalance, a
leader moved. A run whose fault left no such evidence, or declared none,
fails like a run that broke an invariant.
"""

from __future__ import annotations

import os
import re
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import orjson

from stream_dp.config import load_config
from tests.reliability.checks import (
    CheckReport,
    accepted_by_coarser_clock,
    Observed,
    check_accounting,
    check_metrics_text,
    check_outputs,
    check_partials,
    check_partials_before_release,
    check_release_records,
    late_by_query,
)
from tests.reliability.model import compute_truth
from tests.reliability.redis_proxy import FaultProxy
from tests.reliability.state_checks import (
    check_budgets,
    check_completeness,
    check_ledger,
    completeness_counts,
    read_redis_evidence,
)
from tests.reliability.services import PrivateKafka, PrivateKafkaCluster, PrivateRedis, PrivateRedisCluster
from tests.reliability.topics import create_topic, delete_topics, read_topic, wait_until
from tests.reliability.workers import WorkerProcess
from tests.reliability.workload import PAGES, LiveProducer, StreamSpec, encode_event, schedule, write_config

SECRET = "reliability-secret-0123456789abcdef"
_ASSIGNED = re.compile(r"stream_dp\.worker\.ingest\.stage: assigned \[(.*)\]")


class Fault(Protocol):
    """``inject`` calls ``ctx.injected`` once per fault it really caused; ``injections`` says how many a
    run needs (a fault whose step was never reached, or whose victim was already gone, fails the run).

    ``kind`` names what the fault does (``test_catalogue`` checks the CI runs cover every kind); ``inject``
    or an optional ``verify(ctx, pages, report)`` records, with ``ctx.expect``, whether the effect that kind
    must have had really happened. Composite faults (``Together``, ``Sequence``) have ``parts`` instead."""

    name: str
    kind: str

    def inject(self, ctx: RunContext) -> None: ...


def injections_needed(fault: Fault) -> int:
    return getattr(fault, "injections", 1)


def leaf_faults(fault) -> list:
    """The faults a composite one is made of, depth first (a plain fault: itself)."""
    parts = getattr(fault, "parts", None)
    return [leaf for part in parts for leaf in leaf_faults(part)] if parts is not None else [fault]


@dataclass(frozen=True)
class Effect:
    """What a fault of ``kind`` must have caused, and whether the run's evidence shows it did."""

    kind: str
    what: str
    happened: bool
    detail: str = ""


@dataclass
class RunContext:
    """What a fault may act on while the stream runs."""

    rng: np.random.Generator
    stream: StreamSpec
    redis: PrivateRedis | PrivateRedisCluster
    kafka: PrivateKafka | PrivateKafkaCluster | None
    producer: LiveProducer
    workers: list[WorkerProcess]
    proxies: list[FaultProxy]
    new_worker: Callable[[], WorkerProcess]
    supervised: set[str] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    facts: dict[str, float] = field(default_factory=dict)  # what a fault observed, for tests to assert on
    injections: list[str] = field(default_factory=list)  # the faults that really happened
    effects: list[Effect] = field(default_factory=list)  # each fault's expected effect, seen or not
    planted_partials: set[tuple[int, int]] = field(default_factory=set)  # partials-topic records a fault wrote
    bootstrap: str = ""
    input_topic: str = ""
    partials_topic: str = ""
    output_topics: dict[str, str] = field(default_factory=dict)
    removed_outputs: dict[str, list] = field(default_factory=dict)  # query -> records of a deleted output topic
    metric_pages: dict[tuple[str, int], str] = field(default_factory=dict)  # (worker, incarnation) -> last /metrics
    lock: threading.RLock = field(default_factory=threading.RLock)
    restart_exited: bool = True  # the supervisor restarts a worker that exits on its own (a fault may stop that)
    started_s: float = field(default_factory=time.monotonic)
    # (earliest, latest) wall-clock ms the queries can have first started at; latest None: no window was
    # released before the stream began (``checks``: a public query publishes from its start, data or not)
    started_between: tuple[int, int | None] | None = None

    def note(self, text: str) -> None:
        self.notes.append(f"t={time.monotonic() - self.started_s:.1f}s {text}")

    def injected(self, what: str) -> None:
        self.injections.append(what)
        self.note(f"injected: {what}")

    def expect(self, kind: str, what: str, happened: bool, detail: str = "") -> None:
        """Record whether the effect a fault of ``kind`` must have had (``what``) is in the evidence."""
        with self.lock:
            self.effects.append(Effect(kind, what, bool(happened), detail))
        self.note(f"expected effect of {kind!r}: {what}: {'seen' if happened else 'NOT SEEN'} {detail}".rstrip())

    def rejoined(self, worker: WorkerProcess, after: int, timeout_s: float = 90.0) -> bool:
        """Whether ``worker`` logged a group assignment past byte ``after`` of its log (it joined again)."""
        return wait_until(lambda: _ASSIGNED.search(_log_from(worker, after)) is not None, timeout_s, 0.3)

    def proxy_of(self, worker: WorkerProcess) -> FaultProxy:
        return self.proxies[self.workers.index(worker)]

    def pick_worker(self) -> WorkerProcess:
        alive = [w for w in self.workers if w.alive] or self.workers
        return alive[int(self.rng.integers(0, len(alive)))]

    def uniform(self, low: float, high: float) -> float:
        return float(self.rng.uniform(low, high))

    def kill(self, worker: WorkerProcess, why: str) -> bool:
        """``kill -9`` (the supervisor does not restart it: the fault does, with ``restart``);
        False if the worker was not running."""
        with self.lock:
            self.supervised.discard(worker.name)
            was_alive = worker.alive
            worker.kill()
        self.note(f"kill -9 {worker.name} {why}" if was_alive else f"{worker.name} was not running: nothing killed")
        return was_alive

    def restart(self, worker: WorkerProcess) -> int:
        """Start ``worker`` again; returns its log's size before, for ``rejoined``."""
        with self.lock:
            before = worker.log_size()
            worker.start()
            self.supervised.add(worker.name)
        self.note(f"restarted {worker.name}")
        return before

    def leave(self, worker: WorkerProcess) -> bool:
        """A graceful leave (SIGTERM): the worker commits and hands its partitions over; False if it
        was not running."""
        with self.lock:
            self.supervised.discard(worker.name)
            was_alive = worker.alive
        code = worker.stop()
        self.note(f"stopped {worker.name} with SIGTERM (exit {code})")
        return was_alive and code == 0

    def scrape_all(self) -> list[str]:
        return [text for w in self.workers if w.alive and (text := w.scrape()) is not None]


@dataclass
class RunResult:
    fault: str
    seed: int
    notes: list[str]
    facts: dict[str, float]
    report: CheckReport
    duration_s: float
    unexpected_exits: list[str]
    work_dir: Path
    error: str | None = None
    injections: list[str] = field(default_factory=list)
    injections_needed: int = 1

    @property
    def injected(self) -> bool:
        return len(self.injections) >= self.injections_needed

    expected_exits: bool = False  # the fault stops the workers on purpose (``Fault.stops_workers``)

    @property
    def passed(self) -> bool:
        exits_ok = self.expected_exits or not self.unexpected_exits
        return self.error is None and not self.report.violations and self.injected and exits_ok


class FaultRun:
    def __init__(self, fault: Fault, seed: int, work_dir: Path, *, bootstrap: str, kafka: PrivateKafka | PrivateKafkaCluster | None = None,
                 workers: int = 2, partials_partitions: int = 2, stream: StreamSpec | None = None,
                 completion_timeout_s: float = 150.0, redis_fsync: str = "always",
                 worker_env: dict[int, dict[str, str]] | None = None, redis_cluster: bool = False) -> None:
        """``worker_env``: extra environment of the worker slots by index (e.g. a faked clock);
        ``redis_cluster``: the workers use a Redis Cluster of the run's own (no fault proxies then)."""
        self.redis_cluster = redis_cluster
        self.fault = fault
        self.seed = seed
        self.work_dir = work_dir
        self.bootstrap = bootstrap
        self.kafka = kafka
        self.worker_count = workers
        self.partials_partitions = partials_partitions
        self.stream = stream or StreamSpec(seed=seed)
        self.completion_timeout_s = completion_timeout_s
        self.redis_fsync = redis_fsync
        self.worker_env = worker_env or {}
        self.name = f"rel-{seed}-{uuid.uuid4().hex[:6]}"

    # -- lifecycle ---------------------------------------------------------------------

    def run(self) -> RunResult:
        started = time.monotonic()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        redis_server = (PrivateRedisCluster(self.work_dir / "redis-cluster") if self.redis_cluster
                        else PrivateRedis(self.work_dir / "redis", fsync=self.redis_fsync))
        redis_server.start()
        topics = [f"{self.name}-in"]
        self.ctx: RunContext | None = None
        try:
            return self._run(redis_server, topics, started)
        except Exception:
            ctx = self.ctx
            return RunResult(self.fault.name, self.seed, ctx.notes if ctx else [], ctx.facts if ctx else {},
                             CheckReport(), time.monotonic() - started, [], self.work_dir, error=traceback.format_exc(),
                             injections=ctx.injections if ctx else [], injections_needed=injections_needed(self.fault))
        finally:
            ctx = self.ctx
            if ctx is not None:
                ctx.supervised.clear()
                for worker in ctx.workers:
                    worker.kill()
                for proxy in ctx.proxies:
                    proxy.close()
            redis_server.stop()
            delete_topics(self.bootstrap, topics)

    def _run(self, redis_server: PrivateRedis, topics: list[str], started: float) -> RunResult:
        spec = self.stream
        input_topic = topics[0]
        # On a cluster every topic is replicated (min.insync.replicas one less) and the worker's own
        # topics exist before it starts; on one broker the worker creates alerts and dead letters itself.
        rf = getattr(self.kafka, "replication", 1)
        replicated = {"min.insync.replicas": str(max(1, rf - 1))} if rf > 1 else {}
        # A live stream, as input topics are to be created: the broker stamps its records (the model reads
        # those stamps as the window clock).
        create_topic(self.bootstrap, input_topic, spec.partitions, replication=rf,
                     configs={"message.timestamp.type": "LogAppendTime", **replicated})
        config_path = self.work_dir / "queries.yaml"
        outputs = write_config(config_path, self.name.replace("-", "_"), input_topic, spec)
        prefix = f"{self.name}."
        topics += list(outputs.values()) + [f"{prefix}partials", f"{prefix}alerts", f"{prefix}dead-letter"]
        # The broker stamps partials and releases (LogAppendTime): one clock, whatever the workers' clocks say,
        # tells whether a partial reached the partials topic after its window was released.
        broker_time = {"message.timestamp.type": "LogAppendTime"}
        for topic in outputs.values():
            create_topic(self.bootstrap, topic, 1, configs={**broker_time, **replicated}, replication=rf)
        create_topic(self.bootstrap, f"{prefix}partials", self.partials_partitions, replication=rf, configs={
            **broker_time, **replicated, "cleanup.policy": "delete", "retention.ms": "604800000",
            "segment.ms": "3600000"})
        if rf > 1:
            for topic in (f"{prefix}alerts", f"{prefix}dead-letter"):
                create_topic(self.bootstrap, topic, 1, configs=replicated, replication=rf)
        # Workers reach a private broker through its partition proxy when it has one (``PrivateKafka``).
        worker_bootstrap = getattr(self.kafka, "worker_bootstrap", None) or self.bootstrap
        env = _worker_env(worker_bootstrap, f"{self.name}-g", prefix, self.partials_partitions)
        events = schedule(spec)
        producer = LiveProducer(self.bootstrap, input_topic, events, late_after_s=spec.duration_s)
        workers: list[WorkerProcess] = []
        proxies: list[FaultProxy] = []

        def new_worker() -> WorkerProcess:
            extra = self.worker_env.get(len(workers), {})
            if self.redis_cluster:
                url = redis_server.url()
            else:
                proxy = FaultProxy(redis_server.port)
                proxies.append(proxy)
                url = proxy.url()
            worker = WorkerProcess(f"worker{len(workers)}", config_path, dict(env, REDIS_URL=url, **extra),
                                   self.work_dir)
            workers.append(worker)
            worker.start()
            ctx.supervised.add(worker.name)
            return worker

        ctx = self.ctx = RunContext(np.random.default_rng(self.seed), spec, redis_server, self.kafka, producer, workers,
                                    proxies, new_worker, bootstrap=self.bootstrap, input_topic=input_topic,
                                    partials_topic=f"{prefix}partials",
                                    output_topics=dict(outputs))
        # Every input partition gets records from before the workers start (``LiveProducer.warm_up``).
        producer.warm_up(spec.partitions, spec.warm_overlap_s)
        launched_ms = int(time.time() * 1000)  # before any worker: no query can have started earlier
        for _ in range(self.worker_count):
            new_worker()
        if not wait_assigned(workers, input_topic, spec.partitions, timeout_s=60):
            raise RuntimeError(f"workers did not get the input partitions assigned; logs in {self.work_dir}")
        # Before any event is sent, each query publishes the empty windows since its start: its first window
        # is its start's, not its first data's. Once one of each is seen, every query has started.
        # Queries over selected groups publish no empty window: they are not waited for (nor judged so).
        selected = {q.name for q in load_config(config_path).queries if q.public_group_keys() is None}
        public_outputs = {q: t for q, t in outputs.items() if q not in selected}
        published = wait_until(lambda: all(read_topic(self.bootstrap, t) for t in public_outputs.values()), 60, 0.5)
        ctx.started_between = (launched_ms, int(time.time() * 1000) if published else None)
        if not published:
            ctx.note("no query published a window before the stream began (within 60 s)")
        stop_supervisor = threading.Event()
        unexpected: list[str] = []
        supervisor = threading.Thread(target=_supervise, args=(ctx, stop_supervisor, unexpected), daemon=True)
        supervisor.start()
        ctx.started_s = time.monotonic()
        producer.start()
        fault_error: list[str] = []

        def inject() -> None:
            try:
                self.fault.inject(ctx)
            except Exception:
                fault_error.append(traceback.format_exc())

        injector = threading.Thread(target=inject, name="fault", daemon=True)
        injector.start()
        injector.join(spec.duration_s + 240)
        producer.join(240)
        if fault_error:
            raise RuntimeError(f"fault {self.fault.name} failed to inject:\n{fault_error[0]}")
        if not producer.done.is_set():
            raise RuntimeError("the producer did not finish within 4 minutes")
        if producer.error or producer.failed:
            ctx.note(f"producer: {producer.failed} sends failed; {producer.error or 'no error'} (the truth is "
                     "read back from the topic, so this does not skew the checks)")
        late_values = {encode_event(e, producer.start_ms) for e in events if e.at_s > spec.duration_s}
        if not ctx.injections:
            ctx.note("the fault was never injected: the run fails whatever the checks say")
        expected = _expected_windows(events, producer.start_ms, spec)
        stopping = any(getattr(leaf, "stops_workers", False) for leaf in leaf_faults(self.fault))
        # A fault that stops the workers on purpose leaves windows unreleased: not waited for, not judged.
        complete = stopping or wait_until(
            lambda: not _unreleased(self.bootstrap, public_outputs, expected, ctx.removed_outputs),
            self.completion_timeout_s, 2.0)
        if not complete:
            missing = _unreleased(self.bootstrap, public_outputs, expected, ctx.removed_outputs)
            ctx.note(f"not every window was released within {self.completion_timeout_s:.0f}s: missing {missing} "
                     f"(stream windows {min(expected)}..{max(expected)})")
            for worker in workers:
                (self.work_dir / f"{worker.name}.metrics.txt").write_text(worker.scrape() or "(no answer)\n")
        time.sleep(2.0)  # let republished duplicates and dead letters of the last steps land
        stop_supervisor.set()
        supervisor.join(5)
        _sample_metrics(ctx)
        metrics_pages = list(ctx.metric_pages.values())
        ctx.supervised.clear()
        for worker in workers:
            code = worker.stop()
            if code not in (None, 0):
                unexpected.append(f"{worker.name} exited with {code} on SIGTERM")
        report = self._check(ctx, config_path, input_topic, outputs, prefix, late_values, metrics_pages)
        if stopping:
            report = safety_only(report)
        judge_effects(ctx, self.fault, metrics_pages, report)
        if not stopping:
            for exit_ in unexpected:
                report.fail("unexpected exit", f"{exit_} (see its log in {self.work_dir})")
        if not complete:
            report.fail("release stalled", f"windows of the stream were still unreleased {self.completion_timeout_s:.0f}s "
                                           "after it ended (metrics saved beside the logs)")
        for worker in workers:
            logged = worker.first_traceback()
            if logged is not None:
                report.fail("traceback", f"{worker.name} logged a traceback (see {worker.log_path}):\n{logged}")
        (self.work_dir / "report.txt").write_text("\n".join([*ctx.notes, *report.violations, repr(report.stats)]) + "\n")
        return RunResult(self.fault.name, self.seed, ctx.notes, ctx.facts, report, time.monotonic() - started,
                         unexpected, self.work_dir, injections=ctx.injections,
                         injections_needed=injections_needed(self.fault), expected_exits=stopping)

    def _check(self, ctx: RunContext, config_path: Path, input_topic: str, outputs: dict[str, str], prefix: str,
               late_values: set[bytes], metrics_pages: list[str]) -> CheckReport:
        config = load_config(config_path)
        observed = Observed(
            input_topic=input_topic,
            input_records=read_topic(self.bootstrap, input_topic),
            partials=read_topic(self.bootstrap, f"{prefix}partials"),
            outputs={q: ctx.removed_outputs.get(q, []) + read_topic(self.bootstrap, topic) for q, topic in outputs.items()},
            dead_letters=read_topic(self.bootstrap, f"{prefix}dead-letter"),
            public_groups={q.name: q.public_group_keys() or [] for q in config.queries},
            window_ms=self.stream.window_ms,
            planted_partials=set(ctx.planted_partials),
            started_between=ctx.started_between if ctx.started_between and ctx.started_between[1] else None,
            lateness_ms=self.stream.lateness_ms,
            selected={q.name for q in config.queries if q.public_group_keys() is None},
            without_sum={q.name for q in config.queries if q.aggregations.sum is None},
        )
        report = CheckReport()
        stated = stated_deltas(config, observed, report)
        truth = compute_truth(config, SECRET.encode(), observed.input_records, stated_delta=stated)
        if ctx.started_between is not None and ctx.started_between[1] is None:
            report.fail("first window", "no query published a window before the stream began: its first window "
                        "waited for data")
        sent_late = {(r.partition, r.offset) for r in observed.input_records if r.value in late_values}
        for query, late in truth.late.items():
            if not sent_late <= late:
                report.fail("model", f"{query}: events sent late on purpose are not late by the model's clock rule")
        # The model's clock is per partition and per record; the worker's is the lowest of its active
        # partitions' and moves per batch (README, "Windows"): it may accept events the model calls late, never
        # the reverse, as long as one closure that never goes back explains its verdicts (see
        # ``accepted_by_coarser_clock``). Those count as on time, and must then be in the released totals.
        accepted_late = accepted_by_coarser_clock(truth.late, late_by_query(observed), sent_late, truth.late_ends)
        if accepted_late:
            truth = compute_truth(config, SECRET.encode(), observed.input_records, on_time=accepted_late,
                                  stated_delta=stated)
            report.stats["accepted though late by the model's per-record clock"] = sum(map(len, accepted_late.values()))
        check_outputs(observed, truth, report)
        check_partials(observed, truth, self.stream.partitions, report)
        check_partials_before_release(observed, truth, report)
        check_accounting(observed, truth, report)
        check_completeness(completeness_counts(metrics_pages, list(truth.namespace)), report)
        unit_ids = {u for p in truth.partials.values() for u in p.units}
        check_release_records((r.value for rs in observed.outputs.values() for r in rs), unit_ids, report)
        check_metrics_text(metrics_pages, unit_ids, [SECRET], report)
        for worker in ctx.workers:
            if SECRET in worker.log_text():
                report.fail("secret in log", f"the contribution secret appears in {worker.log_path}")
        client = ctx.redis.client()
        try:
            evidence = read_redis_evidence(client, budget_limits(config), truth)
        finally:
            client.close()
        check_budgets(evidence, truth, report)
        check_ledger(evidence, observed.outputs, truth, report)
        return report


# What must hold even when the workers stopped part way (``Fault.stops_workers``): nothing released twice or
# with fresh noise, nothing off the grid or the noise band, nothing leaked.
SAFETY_KINDS = frozenset({"noise drawn twice", "released twice", "unexpected window", "noisy value off", "bad record",
                          "first window", "partial copies differ", "corrupt partial", "schema", "unit id in output",
                          "unit id label", "secret in metrics", "secret in log", "traceback"})


def safety_only(report: CheckReport) -> CheckReport:
    """The violations of ``SAFETY_KINDS`` only; the others are counted in the stats as not judged."""
    kept = CheckReport(stats=dict(report.stats))
    for violation in report.violations:
        kind = violation[1:violation.index("]")]
        if kind in SAFETY_KINDS:
            kept.fail(kind, violation[len(kind) + 3:])
        else:
            kept.count(f"not judged after the workers stopped: {kind}")
    return kept


def stated_deltas(config, observed: Observed, report: CheckReport) -> dict[str, float]:
    """Per query over selected groups, the delta its releases state they spent (one value, at most the query's
    configured delta and ``select.delta`` together: a release states what it spent, and may not spend more)."""
    out: dict[str, float] = {}
    for query in config.queries:
        if query.public_group_keys() is not None:
            continue
        bound = (query.delta if query.mechanism == "gaussian" else 0.0) + query.groups.select.delta
        stated = {orjson.loads(r.value)["privacy"]["delta"] for r in observed.outputs.get(query.name, [])}
        if len(stated) > 1 or any(d > bound * (1 + 1e-12) for d in stated):
            report.fail("stated delta", f"{query.name}: releases state delta {sorted(stated)}, more than one value "
                                        f"or over the configured {bound:g}")
        if len(stated) == 1:
            out[query.name] = stated.pop()
    return out


def budget_limits(config) -> dict[str, int]:
    """namespace -> the limits its budget states hold: per budget, epsilon (or rho), and delta if limited."""
    return {name: sum(1 + (b.delta is not None) for b in ns.budgets) for name, ns in config.namespaces.items()}


def judge_effects(ctx: RunContext, fault: Fault, pages: list[str], report: CheckReport) -> None:
    """Each leaf fault's ``verify``, then: every kind injected declared its effect, and every effect happened."""
    leaves = leaf_faults(fault)
    for leaf in leaves:
        if hasattr(leaf, "verify"):
            leaf.verify(ctx, pages, report)
    declared = {effect.kind for effect in ctx.effects}
    for leaf in leaves:
        if leaf.kind not in declared:
            report.fail("no expected effect", f"{leaf.kind}: the fault recorded no expected effect")
    for effect in ctx.effects:
        if not effect.happened:
            report.fail("expected effect missing", f"{effect.kind}: {effect.what} did not happen {effect.detail}".rstrip())


def _log_from(worker: WorkerProcess, offset: int) -> str:
    if not worker.log_path.exists():
        return ""
    with open(worker.log_path, "rb") as log:
        log.seek(offset)
        return log.read().decode(errors="replace")


def _worker_env(bootstrap: str, group: str, prefix: str, partials_partitions: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "STREAM_DP_", "REDIS_"))}
    env.update(KAFKA_BOOTSTRAP_SERVERS=bootstrap, STREAM_DP_GROUP_ID=group, STREAM_DP_INTERNAL_TOPIC_PREFIX=prefix,
               STREAM_DP_CONTRIBUTION_SECRET=SECRET, STREAM_DP_PARTIALS_PARTITIONS=str(partials_partitions),
               STREAM_DP_OUTPUT_PARTITIONS="1", STREAM_DP_REDIS_TIMEOUT_S="2")
    return env


def assigned_partitions(worker: WorkerProcess, topic: str) -> set[int] | None:
    """Input partitions of ``topic`` in the worker's latest assignment log line (None before any)."""
    latest = None
    for match in _ASSIGNED.finditer(worker.log_text().split("=== start")[-1]):
        latest = match.group(1)
    if latest is None:
        return None
    return {int(p) for p in re.findall(re.escape(topic) + r"\[(\d+)\]", latest)}


def wait_assigned(workers: list[WorkerProcess], topic: str, partitions: int, timeout_s: float) -> bool:
    """Until the running workers hold every input partition between them and each has joined the group.

    Two workers can cover three partitions while a third is still importing: on a loaded machine a fault
    could then stop that one before it handles signals (seen: a SIGTERM "leave" ending it with -15, so the
    fault was never injected)."""
    def covered() -> bool:
        seen: set[int] = set()
        for worker in workers:
            if worker.alive:
                joined = assigned_partitions(worker, topic)
                if joined is None:
                    return False
                seen |= joined
        return seen == set(range(partitions))

    return wait_until(covered, timeout_s, 0.3)


def _sample_metrics(ctx: RunContext) -> None:
    """Keep each worker incarnation's latest ``/metrics``: counters restart with the process, so the
    checks add up the last page of every incarnation."""
    for worker in list(ctx.workers):
        starts = worker.starts
        if worker.alive and (text := worker.scrape(timeout_s=1.0)) is not None:
            ctx.metric_pages[(worker.name, starts)] = text


def _supervise(ctx: RunContext, stop: threading.Event, unexpected: list[str]) -> None:
    while not stop.wait(0.5):
        _sample_metrics(ctx)
        with ctx.lock:
            for worker in list(ctx.workers):
                if worker.name not in ctx.supervised:
                    continue
                code = worker.reap()
                if code is None:
                    continue
                unexpected.append(f"{worker.name} exited on its own with code {code}")
                if not ctx.restart_exited:
                    ctx.supervised.discard(worker.name)
                    ctx.note(f"{worker.name} exited on its own with code {code}; left stopped")
                    continue
                ctx.note(f"{worker.name} exited on its own with code {code}; restarting it (the run fails)")
                time.sleep(1.0)
                worker.start()


def _expected_windows(events: list[Any], start_ms: int, spec: StreamSpec) -> set[int]:
    return {
        (start_ms + e.ts_offset_ms) // spec.window_ms * spec.window_ms
        for e in events if e.at_s <= spec.duration_s
    }


def _unreleased(bootstrap: str, outputs: dict[str, str], windows: set[int],
                removed: dict[str, list]) -> dict[str, list[int]]:
    """Per query, the windows of ``windows`` not yet released for every page (``removed``: records of
    output topics a fault deleted)."""
    missing: dict[str, list[int]] = {}
    for query, topic in outputs.items():
        seen = set()
        for record in removed.get(query, []) + read_topic(bootstrap, topic):
            value = orjson.loads(record.value)
            if "group" in value:  # a top-k record has none: the window's counts tell
                seen.add((value["window"]["start_ms"], value["group"]["page"]))
        absent = sorted(w for w in windows if not all((w, p) in seen for p in PAGES))
        if absent:
            missing[query] = absent
    return missing
