"""Peers on the same events: a faust-streaming worker, a Kafka Streams application and PipelineDP's local engine.

    .venv/bin/python tests/perf/bench_peers.py [--events 200000] [--repeat 3] [--faust-events 30000]

* faust: ``faust_peer.py`` (a tumbling windowed table of per-(unit, group)
  bounded counts) reads the topic from the start in a fresh process; its rate
  counts from its first progress line to ``--faust-events`` events (faust
  runs at a few thousand events/s, so it reads a prefix of the topic).
* Kafka Streams 4.1 (``kstreams/``, Java, built here with ``mvn -q package``
  from Maven Central on first use): one stream thread, default settings, a
  tumbling one-minute count per record key (the unit) in its RocksDB window
  store, in a fresh JVM reading the whole topic from the start. Its rate counts
  from its first progress line (the first record counted, so the JVM's start and
  the group's first assignment are left out) to the last event. It decodes no
  JSON: less work per event than the worker, in Kafka Streams' favour.
* PipelineDP (``pipeline-dp``, local backend, in a fresh process): the same
  events, already in memory, decoded from the same JSON bytes; per one-minute
  window one ``DPEngine.aggregate`` with the worker's bounds (3 groups per
  unit, 2 events per group, values clipped to [0, 100]), COUNT and SUM with
  Laplace noise, epsilon 0.1, the same 1,000 public groups. The rate is events
  over the aggregation time (decoding excluded, in PipelineDP's favour; the
  rate with decoding is printed too).

Needs the bench extra: ``.venv/bin/pip install -e '.[dev,bench]'``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
import perfkit  # noqa: E402

HERE = Path(__file__).resolve().parent


# -- faust ------------------------------------------------------------------------------


def _progress_rate(command: list[str], *, events: int, log_path: Path, name: str, timeout_s: float) -> dict[str, Any]:
    """Runs a peer that prints ``progress <unix time> <events>`` lines and ``done``; its rate counts from its
    first progress line to ``events`` events. The process is stopped afterwards."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=open(log_path, "wb"), text=True)
    reports: list[tuple[float, int]] = []
    finished = threading.Event()

    def read_progress() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            parts = line.split()
            if line.startswith("done"):
                break
            if len(parts) == 3 and parts[0] == "progress":
                reports.append((float(parts[1]), int(parts[2])))
        finished.set()

    threading.Thread(target=read_progress, daemon=True).start()
    try:
        finished.wait(timeout_s)
        if len(reports) < 2 or reports[-1][1] < events:
            raise RuntimeError(f"{name} peer stopped after {reports[-1:]} of {events} events; log {log_path}:\n"
                               + log_path.read_text(errors="replace")[-2000:])
        (t0, n0), (t1, n1) = reports[0], reports[-1]
        return {"rate": (n1 - n0) / (t1 - t0), "events": n1}
    finally:
        process.terminate()
        try:
            process.wait(40)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def faust_once(services: perfkit.Services, topic: str, *, events: int, partitions: int, timeout_s: float = 600) -> dict[str, Any]:
    app_id = perfkit.unique_name("faust")
    datadir = Path(tempfile.mkdtemp(prefix="bench-faust-"))
    try:
        return _progress_rate(
            [sys.executable, str(HERE / "faust_peer.py"), "--bootstrap", services.bootstrap, "--topic", topic,
             "--app-id", app_id, "--partitions", str(partitions), "--stop-after", str(events),
             "--report-every", str(max(1_000, events // 20)), "--datadir", str(datadir / "data")],
            events=events, log_path=datadir / "faust.log", name="faust", timeout_s=timeout_s)
    finally:
        perfkit.delete_topics(services.bootstrap, app_id)
        perfkit.delete_groups(services.bootstrap, [app_id])
        shutil.rmtree(datadir, ignore_errors=True)


# -- Kafka Streams ----------------------------------------------------------------------

KSTREAMS_DIR = HERE / "kstreams"
KSTREAMS_JAR = KSTREAMS_DIR / "target" / "kstreams-peer.jar"


def build_kstreams() -> Path:
    """``mvn -q package`` in tests/perf/kstreams (Kafka Streams from Maven Central) unless the jar is newer
    than every source file; returns the runnable jar."""
    sources = [KSTREAMS_DIR / "pom.xml", *(KSTREAMS_DIR / "src").rglob("*")]
    if KSTREAMS_JAR.exists() and KSTREAMS_JAR.stat().st_mtime >= max(p.stat().st_mtime for p in sources):
        return KSTREAMS_JAR
    if shutil.which("mvn") is None or shutil.which("java") is None:
        raise RuntimeError("the Kafka Streams peer needs Maven and a JDK 17+ (`apt-get install maven openjdk-17-jdk`)")
    completed = subprocess.run(["mvn", "-q", "-B", "package"], cwd=KSTREAMS_DIR, capture_output=True, text=True,
                               timeout=900)
    if completed.returncode != 0 or not KSTREAMS_JAR.exists():
        raise RuntimeError(f"building the Kafka Streams peer failed (exit {completed.returncode}):\n"
                           f"{completed.stdout[-2000:]}{completed.stderr[-2000:]}")
    return KSTREAMS_JAR


def kstreams_once(services: perfkit.Services, topic: str, *, events: int, timeout_s: float = 900) -> dict[str, Any]:
    """``KStreamsPeer`` (one stream thread, default settings, tumbling one-minute count per key) in a fresh JVM
    over the whole topic."""
    jar = build_kstreams()
    app_id = perfkit.unique_name("kstreams")
    datadir = Path(tempfile.mkdtemp(prefix="bench-kstreams-"))
    try:
        return _progress_rate(
            ["java", "-jar", str(jar), "--bootstrap", services.bootstrap, "--topic", topic, "--app-id", app_id,
             "--stop-after", str(events), "--report-every", str(max(1_000, events // 20)),
             "--state-dir", str(datadir / "state")],
            events=events, log_path=datadir / "kstreams.log", name="Kafka Streams", timeout_s=timeout_s)
    finally:
        perfkit.delete_topics(services.bootstrap, app_id)
        perfkit.delete_groups(services.bootstrap, [app_id])
        shutil.rmtree(datadir, ignore_errors=True)


# -- PipelineDP -------------------------------------------------------------------------


def pipelinedp_child(args: argparse.Namespace) -> dict[str, Any]:
    """Runs in its own process: decode the events' JSON, then aggregate each window with PipelineDP."""
    import pipeline_dp

    events = perfkit.synthetic_events(args.events, units=args.units, groups=args.groups, windows=args.windows,
                                      partitions=args.partitions, seed=args.seed, first_window_ms=args.first_window_ms)
    payloads = events.payloads()
    started = time.perf_counter()
    rows = []
    for payload in payloads:
        event = orjson.loads(payload)
        rows.append((event["user_id"], event["ts"], event["page"], event["value"]))
    decode_s = time.perf_counter() - started
    del payloads

    public = perfkit.group_names(args.groups)
    params = pipeline_dp.AggregateParams(
        noise_kind=pipeline_dp.NoiseKind.LAPLACE,
        metrics=[pipeline_dp.Metrics.COUNT, pipeline_dp.Metrics.SUM],
        max_partitions_contributed=3,
        max_contributions_per_partition=2,
        min_value=0.0,
        max_value=100.0,
    )
    extractors = pipeline_dp.DataExtractors(
        privacy_id_extractor=lambda row: row[0], partition_extractor=lambda row: row[2], value_extractor=lambda row: row[3]
    )
    started = time.perf_counter()
    by_window: dict[int, list[tuple]] = {}
    for row in rows:
        by_window.setdefault(row[1] // perfkit.WINDOW_MS, []).append(row)
    released = 0
    for window_rows in by_window.values():
        accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=0.1, total_delta=0.0)
        engine = pipeline_dp.DPEngine(accountant, pipeline_dp.LocalBackend())
        result = engine.aggregate(window_rows, params, extractors, public_partitions=public)
        accountant.compute_budgets()
        released += len(list(result))
    aggregate_s = time.perf_counter() - started
    return {"rate": len(rows) / aggregate_s, "rate_with_decode": len(rows) / (aggregate_s + decode_s),
            "released": released, "windows": len(by_window)}


def pipelinedp_once(events: perfkit.SyntheticEvents, args: argparse.Namespace, timeout_s: float = 900) -> dict[str, Any]:
    completed = subprocess.run(
        [sys.executable, __file__, "--pipelinedp-child", "--events", str(len(events)), "--units", str(args.units),
         "--groups", str(args.groups), "--windows", str(events.windows), "--partitions", str(args.partitions),
         "--seed", str(args.seed), "--first-window-ms", str(events.first_window_ms)],
        capture_output=True, text=True, timeout=timeout_s,
    )
    lines = [line for line in completed.stdout.splitlines() if line.startswith("{")]
    if completed.returncode != 0 or not lines:
        raise RuntimeError(f"PipelineDP run failed (exit {completed.returncode}): {completed.stderr[-2000:]}")
    result = json.loads(lines[-1])
    expected = events.windows * args.groups
    if result["released"] != expected:
        raise RuntimeError(f"PipelineDP released {result['released']} (window, group) values, expected {expected}")
    return result


def measure(services: perfkit.Services, topic: str, events: perfkit.SyntheticEvents, args: argparse.Namespace) -> dict[str, Any]:
    faust_runs, kstreams_runs, pdp_runs, pdp_decode_runs = [], [], [], []
    faust_events = min(args.faust_events, len(events))
    with_kstreams = not getattr(args, "no_kstreams", False)
    if with_kstreams:
        build_kstreams()  # before the first round: a first build downloads Kafka Streams from Maven Central
    for round_ in range(args.repeat):
        if with_kstreams:
            kstreams = kstreams_once(services, topic, events=len(events))
            kstreams_runs.append(kstreams["rate"])
            print(f"  Kafka Streams round {round_ + 1}: {kstreams['rate']:>10,.0f} events/s ({len(events):,} events)",
                  flush=True)
        if faust_events:
            faust = faust_once(services, topic, events=faust_events, partitions=args.partitions)
            faust_runs.append(faust["rate"])
            print(f"  faust         round {round_ + 1}: {faust['rate']:>10,.0f} events/s ({faust_events:,} events)", flush=True)
        if not args.no_pipelinedp:
            pdp = pipelinedp_once(events, args)
            pdp_runs.append(pdp["rate"])
            pdp_decode_runs.append(pdp["rate_with_decode"])
            print(f"  PipelineDP    round {round_ + 1}: {pdp['rate']:>10,.0f} events/s "
                  f"({pdp['rate_with_decode']:,.0f} with JSON decoding)", flush=True)
    return {
        "faust": perfkit.summarize(faust_runs) | {"events": faust_events},
        "kstreams": perfkit.summarize(kstreams_runs) | {"events": len(events) if with_kstreams else 0},
        "pipelinedp": perfkit.summarize(pdp_runs),
        "pipelinedp_with_decode": perfkit.summarize(pdp_decode_runs),
    }


def add_event_args(parser: argparse.ArgumentParser, events_default: int) -> None:
    parser.add_argument("--events", type=int, default=events_default)
    parser.add_argument("--units", type=int, default=100_000)
    parser.add_argument("--groups", type=int, default=1_000)
    parser.add_argument("--windows", type=int, default=10, help="one-minute windows the events span")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_event_args(parser, 200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--faust-events", type=int, default=30_000, help="events the faust peer reads per run (0: skip)")
    parser.add_argument("--no-pipelinedp", action="store_true")
    parser.add_argument("--no-kstreams", action="store_true", help="leave out the Kafka Streams peer (needs mvn and a JDK)")
    parser.add_argument("--pipelinedp-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--first-window-ms", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.pipelinedp_child:
        print(json.dumps(pipelinedp_child(args)))
        return

    services = perfkit.Services.from_env()
    services.check()
    topic = perfkit.unique_name("peers-in")
    events = perfkit.synthetic_events(args.events, units=args.units, groups=args.groups, windows=args.windows,
                                      partitions=args.partitions, seed=args.seed)
    try:
        perfkit.create_topic(services.bootstrap, topic, args.partitions)
        perfkit.produce(services.bootstrap, topic, events)
        result = measure(services, topic, events, args)
        for name, summary in result.items():
            print(f"{name:<24} {summary['median']:>10,.0f} events/s (spread {summary['spread'] * 100:.1f}%)")
    finally:
        perfkit.delete_topics(services.bootstrap, topic)


if __name__ == "__main__":
    main()
