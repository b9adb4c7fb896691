"""Every stream-dp benchmark in one run, on one topic and one machine: a table and a JSON file.

    .venv/bin/python tests/perf/run_all.py                      # 200k events, ~5 minutes
    .venv/bin/python tests/perf/run_all.py --full --json out.json   # 1M events, 10M pairs (the RESULTS.md run)

Needs the local services (``bash deploy/services.sh start all`` and
``eval "$(bash deploy/services.sh env)"``) and the bench extra
(``.venv/bin/pip install -e '.[dev,bench]'``).

One topic (4 partitions; ``--events`` ~70-byte JSON events of ``--units``
units over ``--groups`` groups, spread over ``--windows`` one-minute windows)
is produced once and read by:

1. each raw Python Kafka client, JSON decoding only (``bench_consume.py``);
2. stream-dp workers end to end (``bench_worker.py``): one worker on this
   topic; and 1 vs 2 workers on live topics of the same events (scaling);
3. a faust-streaming worker and PipelineDP's local engine (``bench_peers.py``);

then, on topics of their own, release latency for 1k, 10k and 100k groups per
window (``bench_release.py``) and memory per open (unit, group) pair and per
budgeted unit (``bench_memory.py``). Every throughput is the median of
``--repeat`` runs, with the spread ((max - min) / median); the repetitions of
each round run one after the other, so drifting load hits all of them alike.
The 1-minute load average is sampled every 5 s and reported. Everything the
run creates (topics, consumer groups, Redis keys, processes) is removed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
import threading
import time
import traceback
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_consume  # noqa: E402
import bench_memory  # noqa: E402
import bench_peers  # noqa: E402
import bench_release  # noqa: E402
import bench_worker  # noqa: E402
import perfkit  # noqa: E402

PARTS = ("raw", "worker", "peers", "release", "memory")
GOALS = {
    "worker_vs_raw": 0.7,
    "worker_vs_faust": 20.0,
    "worker_vs_pipelinedp": 3.0,
    "release_100k_s": 1.0,
}


class LoadSampler:
    """The 1-minute load average every ``interval_s`` seconds, in a thread."""

    def __init__(self, interval_s: float = 5.0) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._interval_s = interval_s
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(os.getloadavg()[0])
            self._stop.wait(self._interval_s)

    def stop(self) -> dict[str, float]:
        self._stop.set()
        self._thread.join(10)
        return {"min": min(self.samples), "mean": sum(self.samples) / len(self.samples), "max": max(self.samples)}


def source_state() -> dict[str, Any]:
    """The commit measured and whether the work tree differed from it (read-only git calls)."""
    import subprocess

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=Path(__file__).resolve().parent, capture_output=True, text=True,
                                  timeout=30).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    changed = [line[3:] for line in git("status", "--porcelain", "--", "stream_dp").splitlines()]
    return {"commit": git("rev-parse", "--short", "HEAD"), "stream_dp_changed_files": changed}


def versions() -> dict[str, str]:
    out = {"python": sys.version.split()[0]}
    for package in ("aiokafka", "kafka-python", "confluent-kafka", "faust-streaming", "pipeline-dp", "opendp", "numpy", "redis"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = "missing"
    return out


def goal(value: float, target: float, *, at_most: bool = False) -> str:
    if value != value:
        return "n/a"
    met = value <= target if at_most else value >= target
    if met:
        return "met"
    short = (value / target - 1) if at_most else (1 - value / target)
    return f"MISSED ({'over' if at_most else 'short'} by {short * 100:.0f}%)"


def derive(result: dict[str, Any]) -> dict[str, Any]:
    """Ratios between medians measured in this run, and the goals they meet or miss."""
    ratios: dict[str, Any] = {}
    raw = result.get("raw")
    worker = result.get("worker", {}).get("1")
    peers = result.get("peers")
    if raw and worker:
        fastest = raw["clients"][raw["fastest"]]["median"]
        ratios["worker_vs_raw"] = worker["rate"]["median"] / fastest
        ratios["worker_vs_raw_fastest_client"] = raw["fastest"]
    if "live_2" in result.get("worker", {}):
        ratios["two_vs_one_worker"] = result["worker"]["live_2"]["rate"]["median"] / result["worker"]["live_1"]["rate"]["median"]
    if peers and worker:
        if peers["faust"]["runs"]:
            ratios["worker_vs_faust"] = worker["rate"]["median"] / peers["faust"]["median"]
        if peers["pipelinedp"]["runs"]:
            ratios["worker_vs_pipelinedp"] = worker["rate"]["median"] / peers["pipelinedp"]["median"]
            ratios["worker_vs_pipelinedp_with_decode"] = worker["rate"]["median"] / peers["pipelinedp_with_decode"]["median"]
    release = result.get("release", {})
    if "100000" in release:
        ratios["release_100k_s"] = release["100000"]["latency_s"]["median"]
    goals = {}
    for key, target in GOALS.items():
        if key in ratios:
            goals[key] = goal(ratios[key], target, at_most=key.endswith("_s"))
    return {"ratios": ratios, "goals": goals}


def print_report(result: dict[str, Any], out=sys.stdout) -> None:
    meta, derived = result["meta"], result["derived"]
    ratios, goals = derived["ratios"], derived["goals"]
    w = lambda line="": print(line, file=out)  # noqa: E731
    w(f"stream-dp benchmarks, {meta['date']} — {meta['cores']} cores, 1-min load average {meta['load_before'][0]:.2f} "
      f"before the run, {meta['load']['min']:.2f}–{meta['load']['max']:.2f} (mean {meta['load']['mean']:.2f}) during it "
      "(the run's own processes included)")
    changed = meta["source"]["stream_dp_changed_files"]
    w(f"commit {meta['source']['commit']}" + (f", stream_dp files changed in the work tree: {', '.join(changed)}" if changed else ""))
    w(f"{meta['events']:,} events (~{meta['event_bytes']:.0f} bytes), {meta['units']:,} units, {meta['groups']:,} groups, "
      f"{meta['windows']} one-minute windows, {meta['partitions']} partitions; medians of {meta['repeat']} runs, "
      "spread = (max - min) / median")
    w()
    w(f"{'throughput':<40} {'events/s':>11} {'spread':>7} {'ratio':>26} {'goal':>10}")
    raw = result.get("raw")
    if raw:
        best = raw["clients"][raw["fastest"]]["median"]
        for client, s in sorted(raw["clients"].items(), key=lambda kv: -kv[1]["median"]):
            label = f"raw consume, {client}"
            w(f"{label:<40} {s['median']:>11,.0f} {s['spread'] * 100:>6.1f}% {s['median'] / best:>18.2f} x raw")
    for kind, r in result.get("worker", {}).items():
        s = r["rate"]
        if kind == "1" and "worker_vs_raw" in ratios:
            tail = f"{ratios['worker_vs_raw']:>18.2f} x raw  >= 0.7x {goals['worker_vs_raw']}"
        elif kind == "live_2" and "two_vs_one_worker" in ratios:
            tail = f"{ratios['two_vs_one_worker']:>11.2f} x 1 worker, live"
        else:
            tail = ""
        label = f"stream-dp, {r['label']}"
        w(f"{label:<40} {s['median']:>11,.0f} {s['spread'] * 100:>6.1f}% {tail}")
    peers = result.get("peers")
    if peers:
        if peers["faust"]["runs"]:
            s = peers["faust"]
            label = "faust-streaming ({:,} events)".format(s["events"])
            w(f"{label:<40} {s['median']:>11,.0f} {s['spread'] * 100:>6.1f}% "
              f"{ratios['worker_vs_faust']:>10.1f} x slower than stream-dp  >= 20x {goals['worker_vs_faust']}")
        if peers["pipelinedp"]["runs"]:
            s = peers["pipelinedp"]
            w(f"{'PipelineDP local, in memory':<40} {s['median']:>11,.0f} {s['spread'] * 100:>6.1f}% "
              f"{ratios['worker_vs_pipelinedp']:>10.1f} x slower than stream-dp  >= 3x {goals['worker_vs_pipelinedp']}")
            s = peers["pipelinedp_with_decode"]
            w(f"{'PipelineDP incl. JSON decoding':<40} {s['median']:>11,.0f} {s['spread'] * 100:>6.1f}% "
              f"{ratios['worker_vs_pipelinedp_with_decode']:>10.1f} x slower than stream-dp")
    worker1 = result.get("worker", {}).get("1")
    if worker1:
        w(f"  1 worker: drain after the last event {worker1['drain_s']['median']:.1f} s (includes the 10 s idle timeout), "
          f"{worker1['units_excluded']:.0f} units excluded, {worker1['late']:.0f} late, peak RSS {worker1['peak_rss_mb']:.0f} MB")
    release = result.get("release")
    if release:
        w()
        w(f"{'release latency':<40} {'seconds':>11} {'spread':>7} {'worker-side s':>14} {'goal':>10}")
        for g, r in release.items():
            s = r["latency_s"]
            mark = f"  <= 1 s {goals['release_100k_s']}" if g == "100000" and "release_100k_s" in goals else ""
            label = "{:,} groups ({:,} events)".format(int(g), r["events_per_window"])
            w(f"{label:<40} {s['median']:>11.3f} {s['spread'] * 100:>6.1f}% "
              f"{r['worker_latency_s']['median']:>14.3f}{mark}")
    memory = result.get("memory")
    if memory:
        e = memory["engine"]
        w()
        w("memory")
        trimmed = e.get("trimmed_bytes_per_pair")
        w(f"  engine, {e['pairs']:,} open (unit, group) pairs: RSS {e['rss_bytes_per_pair']:.1f} bytes/pair; "
          f"after malloc_trim {'n/a' if trimmed is None else f'{trimmed:.1f}'}; peak {e['peak_bytes_per_pair']:.1f}; "
          f"numpy state {e['state_bytes_per_pair']:.1f}")
        if "redis" in memory:
            r = memory["redis"]
            w(f"  Redis, {r['units']:,} units charged once: {r['used_memory_per_unit']:.1f} bytes/unit (used_memory), "
              f"{r['state_bytes_per_unit']:.1f} (state hashes)")
        if "redis_after_worker" in memory:
            r = memory["redis_after_worker"]
            w(f"  Redis after a 1-worker run ({r['units']:,} units, {meta['windows']} windows charged): "
              f"{r['state_bytes_per_unit']:.1f} bytes/unit in state hashes, {r['charge_record_bytes_per_unit']:.1f} in charge records")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true", help="the RESULTS.md sizes: 1M events, 50k faust events, 10M pairs")
    parser.add_argument("--events", type=int, help="events on the shared topic (default 200000; --full 1000000)")
    parser.add_argument("--units", type=int, default=100_000)
    parser.add_argument("--groups", type=int, default=1_000)
    parser.add_argument("--windows", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--faust-events", type=int, help="events the faust peer reads per run (default 10000; --full 50000)")
    parser.add_argument("--pairs", type=int, help="open pairs of the engine memory run (default 1000000; --full 10000000)")
    parser.add_argument("--release-groups", default="1000,10000,100000")
    parser.add_argument("--skip", default="", help=f"comma-separated parts to leave out: {', '.join(PARTS)}")
    parser.add_argument("--profile", action="store_true", help="also sample a worker run and the largest release with py-spy")
    parser.add_argument("--json", type=Path, help="write every number to this file")
    args = parser.parse_args()
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if skip - set(PARTS):
        parser.error(f"unknown part(s) {sorted(skip - set(PARTS))}; choose from {', '.join(PARTS)}")
    events_n = args.events or (1_000_000 if args.full else 200_000)
    faust_n = args.faust_events if args.faust_events is not None else (50_000 if args.full else 10_000)
    pairs = args.pairs or (10_000_000 if args.full else 1_000_000)

    services = perfkit.Services.from_env()
    services.check()
    workdir = Path(tempfile.mkdtemp(prefix="bench-all-"))
    load_before = os.getloadavg()
    source = source_state()
    load = LoadSampler()
    started = time.monotonic()
    topic = perfkit.unique_name("all-in")
    events = perfkit.synthetic_events(events_n, units=args.units, groups=args.groups, windows=args.windows,
                                      partitions=args.partitions, seed=1)
    result: dict[str, Any] = {"errors": {}}

    def part(key: str, run: Any) -> None:
        """Run one part; a failure is reported and recorded, and the other parts still run."""
        try:
            result[key] = run()
        except Exception as exc:  # noqa: BLE001 - a benchmark part failing must not lose the others
            traceback.print_exc()
            result["errors"][key] = f"{type(exc).__name__}: {exc}"

    try:
        perfkit.create_topic(services.bootstrap, topic, args.partitions)
        produce_s = perfkit.produce(services.bootstrap, topic, events)
        print(f"produced {events_n:,} events to {topic} in {produce_s:.1f} s; logs in {workdir}", flush=True)
        if "raw" not in skip:
            part("raw", lambda: bench_consume.measure(services, topic, events_n, args.repeat, list(bench_consume.CLIENTS)))
        if "worker" not in skip:
            part("worker", lambda: bench_worker.measure(services, topic, events, groups=args.groups, repeat=args.repeat,
                                                        workdir=workdir))
        if "peers" not in skip:
            peer_args = argparse.Namespace(units=args.units, groups=args.groups, partitions=args.partitions, seed=1,
                                           repeat=args.repeat, faust_events=faust_n, no_pipelinedp=False)
            part("peers", lambda: bench_peers.measure(services, topic, events, peer_args))
        if args.profile and "worker" not in skip:
            part("worker_profile", lambda: bench_worker.profile(services, topic, events, groups=args.groups, workdir=workdir))
    finally:
        perfkit.delete_topics(services.bootstrap, topic)
    if "release" not in skip:
        part("release", lambda: bench_release.measure(
            services, [int(g) for g in args.release_groups.split(",")], repeat=args.repeat, events_per_window=20_000,
            workdir=workdir, profile=args.profile,
        ))
    if "memory" not in skip:
        part("memory", lambda: {"engine": bench_memory.engine_memory(pairs),
                                "redis": bench_memory.redis_memory(services.redis_url, args.units)})
        if "memory" in result and "1" in result.get("worker", {}):
            w1 = result["worker"]["1"]
            active = len(set(events.unit.tolist()))
            result["memory"]["redis_after_worker"] = {
                "units": active,
                "state_bytes_per_unit": w1["redis_state_bytes"] / active,
                "charge_record_bytes_per_unit": w1["redis_charge_record_bytes"] / active,
            }
    result["meta"] = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cores": os.cpu_count(),
        "load": load.stop(),
        "load_before": load_before,
        "source": source,
        "seconds": time.monotonic() - started,
        "events": events_n, "units": args.units, "groups": args.groups, "windows": args.windows,
        "partitions": args.partitions, "repeat": args.repeat, "faust_events": faust_n, "pairs": pairs,
        "event_bytes": sum(map(len, events.payloads(0, 10_000))) / min(10_000, events_n),
        "produce_events_per_s": events_n / produce_s,
        "versions": versions(),
    }
    result["derived"] = derive(result)
    print()
    print_report(result)
    if "worker_profile" in result:
        bench_worker.print_profile(result["worker_profile"])
    for r in result.get("release", {}).values():
        if "profile" in r:
            bench_release.print_profile(r["profile"], f"py-spy, release of {r['groups']:,} groups")
    for key, error in result["errors"].items():
        print(f"part {key!r} FAILED: {error}")
    print(f"\nfinished in {result['meta']['seconds'] / 60:.1f} min")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=float))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
