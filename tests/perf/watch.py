"""Watching a benchmark run: worker metrics, output topics and py-spy profiles.

Polls and readers run in threads of the benchmark process; they only read.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path


# -- metrics ----------------------------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")


def scrape(port: int, timeout_s: float = 2.0) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s) as response:
        return response.read().decode()


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match or match.group(1) != name:
            continue
        found = match.group(2) or ""
        if all(f'{k}="{v}"' in found for k, v in labels.items()):
            total += float(match.group(3))
    return total


@dataclass
class Poller:
    """Scrapes each worker's ``stream_dp_events_total`` every ``interval_s`` in a thread.

    ``samples`` holds (monotonic time at the middle of the scrape, count per
    worker) at every change. Each sample is an exact snapshot, so a rate taken
    between two samples has no bias from the scrape interval. Scraping costs a
    worker about 1% of its CPU at 10 scrapes per second.
    """

    ports: Sequence[int]
    interval_s: float = 0.1
    samples: list[tuple[float, tuple[float, ...]]] = field(default_factory=list)
    #: with ``pid``: (epoch seconds, CPU seconds of that process and its children, RSS bytes) at every poll
    pid: int | None = None
    usage: list[tuple[float, float, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Poller:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        last: tuple[float, ...] = ()
        while not self._stop.is_set():
            counts = []
            before = time.monotonic()
            for port in self.ports:
                try:
                    counts.append(metric_sum(scrape(port, timeout_s=1.0), "stream_dp_events_total"))
                except OSError:
                    counts.append(0.0)  # not serving yet
            now = (before + time.monotonic()) / 2
            if self.pid is not None:
                tree = process_tree(self.pid)
                self.usage.append((time.time(), cpu_seconds(tree), rss_bytes(tree)))
            if tuple(counts) != last:
                last = tuple(counts)
                self.samples.append((now, last))
            self._stop.wait(self.interval_s)

    def cpu_at(self, wall: float) -> float:
        """CPU seconds used by ``pid`` at epoch time ``wall`` (the last poll at or before it)."""
        before = [cpu for t, cpu, _ in self.usage if t <= wall]
        return before[-1] if before else (self.usage[0][1] if self.usage else float("nan"))

    def total(self) -> float:
        return sum(self.samples[-1][1]) if self.samples else 0.0

    def wait_for(self, count: float, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.total() >= count:
                return True
            time.sleep(0.02)
        return False

    def wait_consumed(self, count: float, timeout_s: float, quiet_s: float = 2.0) -> float | None:
        """Wait until the workers have counted at least ``count`` events and then nothing
        for ``quiet_s``; returns when the count last changed (None on timeout).

        With several workers the count can pass ``count``: after a rebalance the new
        owner of a partition re-reads the events of its still-open windows."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.total() >= count and time.monotonic() - self.samples[-1][0] >= quiet_s:
                return self.samples[-1][0]
            time.sleep(0.05)
        return None

    def rate(self, since: float | None = None) -> float:
        """Events per second from the first sample (at or after ``since``) in which every
        worker has counted events to the last sample before the final count (no
        start-up, no tail)."""
        running = [i for i, (t, counts) in enumerate(self.samples)
                   if all(c > 0 for c in counts) and (since is None or t >= since)]
        if not running:
            return float("nan")
        first = running[0]
        last = len(self.samples) - 2 if len(self.samples) - 2 > first else len(self.samples) - 1
        if last <= first:
            return float("nan")
        (t0, c0), (t1, c1) = self.samples[first], self.samples[last]
        return (sum(c1) - sum(c0)) / (t1 - t0)


# -- processes --------------------------------------------------------------------------

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (``stream-dp run --processes N`` runs its workers as children)."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as handle:
                    todo.extend(int(c) for c in handle.read().split())
        except OSError:
            continue
    return out


def cpu_seconds(pids: Iterable[int]) -> float:
    """User + system CPU seconds used so far by the live processes ``pids`` (from /proc)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / _CLOCK_TICKS


def rss_bytes(pids: Iterable[int]) -> int:
    """Resident set size of the live processes ``pids``, summed."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as handle:
                for line in handle:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


_ASSIGNED = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO stream_dp\.worker\.ingest\.stage: assigned \['")


def first_assignment_wall(log_text: str) -> float | None:
    """Wall-clock time (epoch s) of the first non-empty input assignment a worker logged (``--log-level INFO``).

    A worker's ingest loop polls from the moment its partitions are assigned: this is where a
    worker's end-to-end clock starts, as a raw consumer's starts once it is assigned."""
    for line in log_text.splitlines():
        match = _ASSIGNED.match(line)
        if match:
            return dt.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    return None


# -- output topics ----------------------------------------------------------------------

_WINDOW_START = re.compile(rb'"start_ms":\s*(\d+)')


class OutputReader:
    """Reads a query's output topic in a thread: records per window, and when each
    window's count first reached ``expected_per_window`` (monotonic seconds; ``completed_wall``:
    epoch seconds)."""

    def __init__(self, bootstrap: str, topic: str, expected_per_window: int) -> None:
        from confluent_kafka import Consumer

        self.topic = topic
        self.expected = expected_per_window
        self.counts: dict[int, int] = {}
        self.completed_at: dict[int, float] = {}
        self.completed_wall: dict[int, float] = {}
        self.samples: dict[int, bytes] = {}
        self.records = 0
        self._consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": f"{topic}-reader", "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "fetch.wait.max.ms": 10, "topic.metadata.refresh.interval.ms": 1000,
        })
        self._consumer.subscribe([topic])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for message in self._consumer.consume(num_messages=10_000, timeout=0.05):
                if message.error() is not None:
                    continue
                now = time.monotonic()
                value = message.value()
                match = _WINDOW_START.search(value)
                if match is None:
                    continue
                start = int(match.group(1))
                count = self.counts.get(start, 0) + 1
                self.counts[start] = count
                self.records += 1
                self.samples.setdefault(start, value)
                if count >= self.expected and start not in self.completed_at:
                    self.completed_at[start] = now
                    self.completed_wall[start] = time.time()

    def wait_windows(self, starts: Iterable[int], timeout_s: float) -> bool:
        starts = list(starts)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(s in self.completed_at for s in starts):
                return True
            time.sleep(0.01)
        return False

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()


def check_release_record(value: bytes) -> None:
    """A release record states what it spent; raise if a field the README promises is missing."""
    import orjson

    record = orjson.loads(value)
    privacy = record.get("privacy") or {}
    missing = [k for k in ("epsilon", "delta", "mechanism", "count_scale", "sum_scale") if k not in privacy]
    if missing or "count" not in record or "window" not in record:
        raise AssertionError(f"release record lacks {missing or ['count/window']}: {value[:300]!r}")


# -- profiles ---------------------------------------------------------------------------


PROFILE_RATE_HZ = 250


def start_profiler(pid: int, out: Path, rate_hz: int = PROFILE_RATE_HZ) -> subprocess.Popen:
    """py-spy sampling ``pid`` into collapsed stacks at ``out``; stop it with ``stop_profiler``."""
    py_spy = Path(sys.executable).with_name("py-spy")
    return subprocess.Popen(
        [str(py_spy), "record", "--pid", str(pid), "--format", "raw", "--rate", str(rate_hz), "--nonblocking",
         "--output", str(out), "--duration", "600"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def stop_profiler(profiler: subprocess.Popen) -> None:
    if profiler.poll() is None:
        profiler.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        try:
            profiler.wait(30)
        except subprocess.TimeoutExpired:
            profiler.kill()
            profiler.wait(5)


_FRAME_LINE = re.compile(r":\d+\)$")


def profile_summary(collapsed: Path, top: int = 15) -> dict[str, list[tuple[str, float]]]:
    """Shares of busy samples by function: ``self`` (innermost frame) and ``inclusive``
    (anywhere on the stack; stream_dp functions below the event loop only)."""
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [_FRAME_LINE.sub(")", f) for f in stack.split(";")]
        frames = [f for f in frames if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += count
        own[frames[-1]] = own.get(frames[-1], 0) + count
        for frame in set(frames):
            if "stream_dp/" in frame and "stream_dp/cli/" not in frame and not frame.startswith(("run ", "run_worker ")):
                inclusive[frame] = inclusive.get(frame, 0) + count
    if not total:
        return {"self": [], "inclusive": [], "samples": 0}  # type: ignore[dict-item]
    ranked = lambda d: [(name, n / total) for name, n in sorted(d.items(), key=lambda kv: -kv[1])[:top]]  # noqa: E731
    return {"self": ranked(own), "inclusive": ranked(inclusive), "samples": total}  # type: ignore[dict-item]


# Where a worker's busy samples go: the first category whose marker appears
# anywhere on a sample's stack takes it (order matters: specific before general).
INGEST_CATEGORIES: tuple[tuple[str, str], ...] = (
    ("release stage", "ReleaseStage."),
    ("budget charge (Redis client, charge thread)", "RedisBudgetStore.charge"),
    ("charge journal (Redis client, charge thread)", "remember_units"),
    ("window close (bounding, partials)", "WindowEngine._advance"),
    ("event decoding (msgspec, checks)", "EventDecoder.decode"),
    ("window ingest (hashes, rows)", "WindowEngine._ingest"),
    ("window engine, rest", "WindowEngine."),
    ("records to columns (record batches)", "parse_partition"),
    ("columns to a batch (raw_batch)", "raw_batch"),
    ("aiokafka getmany (record objects)", "getmany"),
    ("aiokafka, rest (fetch, protocol)", "aiokafka/"),
    ("ingest stage, rest (metrics, progress, commit)", "IngestStage."),
    ("ingest stage, rest (metrics, progress, commit)", "ProgressOut."),
    ("/metrics endpoint (scrapes)", "prometheus_client"),
    ("event loop, select", "select"),
)
RELEASE_CATEGORIES: tuple[tuple[str, str], ...] = (
    ("noise (OpenDP samplers)", "measurement_invoke"),
    ("release ledger (pack, Redis)", "ReleaseLedger."),
    ("render release records", "ReleaseEntry.render"),
    ("render release records", "build_entry"),
    ("publish to output topic", "publish_release"),
    ("decode partials", "decode_partial_payload"),
    ("decode partials", "PartialsIntake."),
    ("encode partials", "encode_partial_payload"),
    ("combine partials", "combiner.py"),
    ("budget charge (Redis)", "RedisBudgetStore.charge"),
    ("window close (bounding, partials)", "WindowEngine._advance"),
    ("release stage, rest", "ReleaseStage."),
    ("ingest stage, rest", "IngestStage."),
    ("ingest stage, rest", "ProgressOut."),
    ("aiokafka (fetch, produce)", "aiokafka/"),
    ("/metrics endpoint (scrapes)", "prometheus_client"),
    ("event loop, select", "select"),
)


def profile_breakdown(
    collapsed: Path, categories: Sequence[tuple[str, str]], rate_hz: int = PROFILE_RATE_HZ
) -> list[tuple[str, float, float]]:
    """(category, share of busy samples, thread-seconds) per category, largest first; the rest is "other"."""
    totals: dict[str, int] = {}
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        label = next((name for name, marker in categories if marker in stack), "other")
        totals[label] = totals.get(label, 0) + count
    return [(name, n / total, n / rate_hz) for name, n in sorted(totals.items(), key=lambda kv: -kv[1])] if total else []
