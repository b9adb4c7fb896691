"""What ``run_all.py`` measured, as goals met or missed and as the table of RESULTS.md."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import subprocess
import sys
import threading
from importlib import metadata
from pathlib import Path
from typing import Any

GOALS = {
    # key: (target, "at_least" or "at_most")
    "worker_vs_raw": (0.8, "at_least"),
    "worker_vs_faust": (20.0, "at_least"),
    "worker_vs_kstreams": (3.0, "at_least"),
    "worker_vs_pipelinedp": (3.0, "at_least"),
    "release_100k_s": (1.0, "at_most"),
    "release_1m_s": (6.0, "at_most"),
    "engine_bytes_per_pair": (64.0, "at_most"),
    # the soak's RSS after the third window vs every later window's: within +-10%
    "soak_rss_deviation": (0.10, "at_most"),
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
        ordered = sorted(self.samples)
        return {"min": ordered[0], "median": ordered[len(ordered) // 2], "mean": sum(ordered) / len(ordered),
                "max": ordered[-1], "samples": len(ordered)}


def source_state() -> dict[str, Any]:
    """The commit measured and whether the work tree differed from it (read-only git calls)."""

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
    for package in ("aiokafka", "kafka-python", "confluent-kafka", "faust-streaming", "pipeline-dp", "opendp", "numpy",
                    "redis", "msgspec"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = "missing"
    return out


def meta(*, load: dict[str, float], load_before: tuple[float, float, float], source: dict[str, Any], seconds: float,
         sizes: list[int], repeat: int, args: argparse.Namespace, faust_events: int, pairs: int, events: Any) -> dict[str, Any]:
    return {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cores": os.cpu_count(), "load": load, "load_before": load_before, "source": source, "seconds": seconds,
        "sizes": sizes, "repeat": repeat, "units": args.units, "groups": args.groups, "windows": args.windows,
        "partitions": args.partitions, "faust_events": faust_events, "pairs": pairs,
        "event_bytes": sum(map(len, events.payloads(0, 10_000))) / min(10_000, len(events)),
        "versions": versions(),
    }


def half_of_one_worker(result: dict[str, Any], default: float = 100_000.0) -> float:
    """Half the median end-to-end rate of one worker on the largest topic measured."""
    sizes = sorted(result.get("throughput", {}), key=int)
    if not sizes:
        return default
    return 0.5 * result["throughput"][sizes[-1]]["worker"]["1"]["e2e_rate"]["median"]


def goal(value: float, target: float, kind: str) -> str:
    if value != value:
        return "n/a"
    met = value >= target if kind == "at_least" else value <= target
    if met:
        return "met"
    short = (1 - value / target) if kind == "at_least" else (value / target - 1)
    return f"MISSED ({'short' if kind == 'at_least' else 'over'} by {short * 100:.0f}%)"


def stage_line(stages: dict[str, float], latency_s: float) -> str:
    """The worker's release stages, largest first, and the rest of the latency that no stage measures (closing
    the window in the ingest stage, the trips through Kafka): where a missed release goal points."""
    ranked = sorted(stages.items(), key=lambda kv: -kv[1])
    rest = latency_s - sum(stages.values())
    return ("stages (median s): " + ", ".join(f"{name} {seconds:.2f}" for name, seconds in ranked)
            + f"; in no stage {rest:.2f}")


def derive(result: dict[str, Any]) -> dict[str, Any]:
    """Ratios between medians measured in this run, and the goals they meet or miss."""
    ratios: dict[str, Any] = {}
    sizes = sorted(result.get("throughput", {}), key=int)
    for size in sizes:
        t = result["throughput"][size]
        fastest = t["raw"][t["fastest"]]["median"]
        for kind, w in t["worker"].items():
            ratios[f"{kind}_vs_raw_{size}"] = w["e2e_rate"]["median"] / fastest
    if sizes:
        t = result["throughput"][sizes[-1]]
        ratios["worker_vs_raw"] = ratios[f"1_vs_raw_{sizes[-1]}"]
        ratios["worker_vs_raw_best_kind"] = max(ratios[f"{k}_vs_raw_{sizes[-1]}"] for k in t["worker"])
    peers = result.get("peers")
    if peers and sizes:
        worker = result["throughput"][sizes[-1]]["worker"]["1"]["e2e_rate"]["median"]
        if peers["faust"]["runs"]:
            ratios["worker_vs_faust"] = worker / peers["faust"]["median"]
        if peers.get("kstreams", {}).get("runs"):
            ratios["worker_vs_kstreams"] = worker / peers["kstreams"]["median"]
        if peers["pipelinedp"]["runs"]:
            ratios["worker_vs_pipelinedp"] = worker / peers["pipelinedp"]["median"]
            ratios["worker_vs_pipelinedp_with_decode"] = worker / peers["pipelinedp_with_decode"]["median"]
    if "100000" in result.get("release", {}):
        ratios["release_100k_s"] = result["release"]["100000"]["latency_s"]["median"]
    if "1000000" in result.get("release", {}):
        ratios["release_1m_s"] = result["release"]["1000000"]["latency_s"]["median"]
    if "memory" in result:
        ratios["engine_bytes_per_pair"] = result["memory"]["engine"]["rss_bytes_per_pair"]
    soak = result.get("latency", {}).get("rss_mb", {})
    deviation = soak.get("max_deviation_from_third")
    if deviation is not None and deviation == deviation:  # absent (no soak run) or NaN (too few windows): no line
        ratios["soak_rss_deviation"] = deviation
    goals = {key: goal(ratios[key], *GOALS[key]) for key in GOALS if key in ratios}
    return {"ratios": ratios, "goals": goals}


def _mmm(s: dict[str, Any], fmt: str = ",.0f") -> str:
    return f"{s['min']:{fmt}} / {s['median']:{fmt}} / {s['max']:{fmt}}"


def print_report(result: dict[str, Any], out=sys.stdout) -> None:
    m, derived = result["meta"], result["derived"]
    ratios, goals = derived["ratios"], derived["goals"]
    w = lambda line="": print(line, file=out)  # noqa: E731
    load = m["load"]
    w(f"stream-dp benchmarks, {m['date']} -- {m['cores']} cores, 1-minute load average {m['load_before'][0]:.2f} before "
      f"the run, {load['min']:.2f} / {load['median']:.2f} / {load['max']:.2f} (min / median / max of {load['samples']} "
      "samples every 5 s) during it, the run's own processes included")
    changed = m["source"]["stream_dp_changed_files"]
    w(f"commit {m['source']['commit']}" + (f", stream_dp files changed in the work tree: {', '.join(changed)}" if changed else ""))
    w(f"~{m['event_bytes']:.0f}-byte events, {m['units']:,} units, {m['groups']:,} groups, {m['windows']} one-minute "
      f"windows, {m['partitions']} partitions; {m['repeat']} rounds, each running every command once; min / median / max")
    for size in sorted(result.get("throughput", {}), key=int):
        t = result["throughput"][size]
        best = t["raw"][t["fastest"]]["median"]
        w()
        w(f"throughput, {int(size):,} events                  events/s (min / median / max)   median ratio")
        for client, s in sorted(t["raw"].items(), key=lambda kv: -kv[1]["median"]):
            w(f"  raw consume + JSON decode, {client:<13} {_mmm(s):>34} {s['median'] / best:>8.2f} x fastest raw")
        for kind, r in t["worker"].items():
            paired = t["paired_ratio"][kind]
            w(f"  stream-dp {r['label']:<34} {_mmm(r['e2e_rate']):>30} {r['e2e_rate']['median'] / best:>8.2f} x fastest raw "
              f"(per round {_mmm(paired, '.2f')})")
            w(f"      steady {_mmm(r['rate'])} events/s; {_mmm(r['cpu_s_per_million'], '.2f')} CPU-s per million events; "
              f"drain {r['drain_s']['median']:.2f} s; peak RSS {r['peak_rss_mb']:.0f} MB; {r['units_excluded']:.0f} "
              f"units excluded, {r['late']:.0f} late")
    if "worker_vs_raw" in goals:
        w(f"  goal: one worker >= {GOALS['worker_vs_raw'][0]} x the fastest raw client: {ratios['worker_vs_raw']:.2f} x, "
          f"{goals['worker_vs_raw']}")
    peers = result.get("peers")
    if peers:
        w()
        if peers["faust"]["runs"]:
            w(f"faust-streaming ({peers['faust']['events']:,} events) {_mmm(peers['faust'])} events/s; stream-dp "
              f"{ratios['worker_vs_faust']:.1f} x faster, >= 20 x {goals['worker_vs_faust']}")
        if peers.get("kstreams", {}).get("runs"):
            w(f"Kafka Streams 4.1, 1 stream thread ({peers['kstreams']['events']:,} events) {_mmm(peers['kstreams'])} "
              f"events/s; stream-dp {ratios['worker_vs_kstreams']:.2f} x its rate, >= 3 x {goals['worker_vs_kstreams']}")
        if peers["pipelinedp"]["runs"]:
            w(f"PipelineDP local, in memory {_mmm(peers['pipelinedp'])} events/s; stream-dp {ratios['worker_vs_pipelinedp']:.1f} x "
              f"faster, >= 3 x {goals['worker_vs_pipelinedp']} ({ratios['worker_vs_pipelinedp_with_decode']:.1f} x "
              "counting its JSON decoding)")
    release = result.get("release")
    if release:
        w()
        w("release latency (window closed -> last record on the output topic), seconds min / median / max; worker-side")
        for g, r in release.items():
            goal_key = {"100000": "release_100k_s", "1000000": "release_1m_s"}.get(g)
            mark = (f"   <= {GOALS[goal_key][0]:g} s {goals[goal_key]}" if goal_key in goals else "")
            w(f"  {int(g):>7,} groups: {_mmm(r['latency_s'], '.3f')}; {r['worker_latency_s']['median']:.3f}{mark}")
            if r.get("stages_s") and int(g) >= 100_000:
                w("      " + stage_line(r["stages_s"], r["latency_s"]["median"]))
    lat = result.get("latency")
    if lat:
        w()
        w(f"latency at a fixed rate: {lat['offered_rate']:,.0f} events/s offered, {lat['achieved_rate']:,.0f} produced, "
          f"{lat['windows']} one-minute windows ({lat['events']:,} events, {lat['late']:.0f} late)")
        w(f"  event to release p50 {lat['latency_s']['p50']:.2f} s, p99 {lat['latency_s']['p99']:.2f} s, max "
          f"{lat['latency_s']['max']:.2f} s; window close to release median {lat['close_to_release_s']['p50']:.2f} s, "
          f"max {lat['close_to_release_s']['max']:.2f} s")
        rss = lat["rss_mb"]
        if "after_third" in rss:
            from bench_latency import soak_line

            w(f"  {soak_line(rss)}; goal within 10%: {goals.get('soak_rss_deviation', 'n/a (under 4 windows)')}; "
              f"{lat['cpu_s_per_million']:.2f} CPU-s per million events")
            w("  RSS per window (MB): " + " ".join(f"{r:.0f}" for r in rss["windows"]))
        else:  # a result file written before the per-window figures
            w(f"  soak: worker RSS {rss['start']:.0f} MB at the first measured window, {rss['end']:.0f} MB after the "
              f"last, max {rss['max']:.0f} MB; {lat['cpu_s_per_million']:.2f} CPU-s per million events")
    budget = result.get("budget")
    if budget:
        w()
        w(f"budget store (Redis {budget['redis_version']}, {budget['units']:,} units, batches of {budget['batch']:,}): "
          f"fresh {budget['fresh']['rate']:,.0f} units/s ({budget['fresh']['server_us']:.2f} us server + "
          f"{budget['fresh']['client_us']:.2f} us client per unit), repeat {budget['repeat']['rate']:,.0f} units/s, "
          f"busy day {budget['day']['rate']:,.0f} units/s; naive HINCRBY {budget['naive']['rate']:,.0f} units/s")
    noise = result.get("noise")
    if noise:
        w()
        w("noise (OpenDP samplers), one release of count + sum:")
        for row in noise["releases"]:
            w(f"  {row['mechanism']:<9} {row['groups']:>7,} groups {row['mode']:<11} {row['seconds']:7.3f} s "
              f"({row['groups_per_s']:,.0f} groups/s, {row['x_numpy']:.0f} x numpy's insecure generator)")
    memory = result.get("memory")
    if memory:
        e = memory["engine"]
        w()
        w(f"memory: engine, {e['pairs']:,} open (unit, group) pairs: RSS {e['rss_bytes_per_pair']:.1f} bytes/pair "
          f"(<= 64 {goals.get('engine_bytes_per_pair', 'n/a')}); after malloc_trim "
          f"{'n/a' if e.get('trimmed_bytes_per_pair') is None else format(e['trimmed_bytes_per_pair'], '.1f')}; "
          f"peak {e['peak_bytes_per_pair']:.1f}; numpy state {e['state_bytes_per_pair']:.1f}")
        d = memory.get("engine_default_allocator")
        if d:
            w(f"  the same without the worker's C-heap setting (glibc's own mmap threshold): RSS "
              f"{d['rss_bytes_per_pair']:.1f} bytes/pair, peak {d['peak_bytes_per_pair']:.1f}")
        r = memory["redis"]
        w(f"  Redis, {r['units']:,} units charged once: {r['used_memory_per_unit']:.1f} bytes/unit (used_memory), "
          f"{r['state_bytes_per_unit']:.1f} (state hashes)")
        if memory.get("local_dp"):
            from bench_local_dp import describe

            for line in describe(memory["local_dp"]):
                w(f"  {line}")
