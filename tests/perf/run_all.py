"""Every stream-dp benchmark in one run, on one machine: a table and a JSON file.

    .venv/bin/python tests/perf/run_all.py                                  # 200k events, ~10 minutes
    .venv/bin/python tests/perf/run_all.py --full --json out.json           # the RESULTS.md run, ~95 minutes

Needs the local services (``bash deploy/services.sh start all`` and
``eval "$(bash deploy/services.sh env)"``) and the bench extra
(``.venv/bin/pip install -e '.[dev,bench]'``).

1. **Throughput**, per size (``--sizes``; ``--full``: 200,000 and 1,000,000 events):
   one topic (4 partitions, ~70-byte JSON events of ``--units`` units over
   ``--groups`` groups in ``--windows`` one-minute windows, murmur2 placement,
   records stamped with their event times) is produced once, then read in
   ``--repeat`` rounds; each round runs every compared command once, one after
   the other, in a fresh process: each raw Python Kafka client (consume + JSON
   decode, ``bench_consume.py``), one stream-dp worker and ``stream-dp run
   --processes 2`` end to end (``bench_worker.py``). Drifting load thus hits
   every command alike, and each round gives a paired worker/raw ratio. Every
   figure is given as min / median / max over the rounds.
2. **Peers** on the largest topic: faust-streaming, Kafka Streams 4.1 (``kstreams/``, built with
   ``mvn -q package`` on first use) and PipelineDP (``bench_peers.py``).
3. **Release latency** for 1k, 10k, 100k and 1M groups per window (``bench_release.py``).
4. **Budget store** (``bench_budget.py``) and **noise** (``bench_noise.py``).
5. **Memory** per open (unit, group) pair and per budgeted unit (``bench_memory.py``), and per
   local-DP report of either mechanism in one window (``bench_local_dp.py``).
6. **Latency at a fixed offered rate** (``bench_latency.py``): half the median
   end-to-end rate of one worker on the largest topic (``--latency-rate``
   overrides), for ``--latency-minutes`` one-minute windows (``--full``: 60, the
   one-hour soak), with the worker's RSS per window (after the third, after the
   last, their ratio, the largest deviation from the third, the maximum) and CPU.

The 1-minute load average is sampled every 5 s and reported. Everything the
run creates (topics, consumer groups, Redis keys, processes) is removed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_budget  # noqa: E402
import bench_consume  # noqa: E402
import bench_latency  # noqa: E402
import bench_local_dp  # noqa: E402
import bench_memory  # noqa: E402
import bench_noise  # noqa: E402
import bench_peers  # noqa: E402
import bench_release  # noqa: E402
import bench_worker  # noqa: E402
import perfkit  # noqa: E402
import results_table  # noqa: E402

PARTS = ("throughput", "peers", "release", "budget", "noise", "memory", "latency")
WORKER_KINDS = ("1", "p2")


def throughput(services: perfkit.Services, events: perfkit.SyntheticEvents, *, repeat: int, groups: int,
               workdir: Path, clients: list[str]) -> dict[str, Any]:
    """``repeat`` rounds over one topic of ``events``; each round runs every command once."""
    topic = perfkit.unique_name("all-in")
    runs: dict[str, list[dict[str, Any]]] = {**{f"raw {c}": [] for c in clients}, **{k: [] for k in WORKER_KINDS}}
    try:
        perfkit.create_topic(services.bootstrap, topic, int(events.partition.max()) + 1)
        seconds = perfkit.produce(services.bootstrap, topic, events)
        print(f"produced {len(events):,} events to {topic} in {seconds:.1f} s", flush=True)
        for round_ in range(repeat):
            for client in clients:
                result = bench_consume.run_client(client, services, topic, len(events))
                runs[f"raw {client}"].append(result)
                print(f"  raw {client:<13} round {round_ + 1}: {result['rate']:>10,.0f} events/s", flush=True)
            for kind in WORKER_KINDS:
                runs[kind].append(bench_worker.run_kind(services, topic, events, kind, groups=groups, workdir=workdir,
                                                        round_=round_))
    finally:
        perfkit.delete_topics(services.bootstrap, topic)
    raw = {c: perfkit.summarize([r["rate"] for r in runs[f"raw {c}"]]) for c in clients}
    fastest = max(raw, key=lambda c: raw[c]["median"])
    worker = bench_worker.summarize_runs({k: runs[k] for k in WORKER_KINDS})
    paired = {k: perfkit.summarize([w["e2e_rate"] / r["rate"] for w, r in zip(runs[k], runs[f"raw {fastest}"])])
              for k in WORKER_KINDS}
    return {"events": len(events), "raw": raw, "fastest": fastest, "worker": worker, "paired_ratio": paired,
            "raw_runs": {c: runs[f"raw {c}"] for c in clients}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true", help="the RESULTS.md run (see above)")
    parser.add_argument("--sizes", help="comma-separated event counts (default 200000; --full 200000,1000000)")
    parser.add_argument("--units", type=int, default=100_000)
    parser.add_argument("--groups", type=int, default=1_000)
    parser.add_argument("--windows", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--repeat", type=int, help="rounds of the compared commands (default 3; --full 5)")
    parser.add_argument("--clients", default=",".join(bench_consume.CLIENTS))
    parser.add_argument("--faust-events", type=int, help="events the faust peer reads per run (default 10000; --full 50000)")
    parser.add_argument("--no-kstreams", action="store_true", help="leave the Kafka Streams peer out (needs mvn, a JDK)")
    parser.add_argument("--pairs", type=int, help="open pairs of the engine memory run (default 1000000; --full 10000000)")
    parser.add_argument("--release-groups", default="1000,10000,100000,1000000")
    parser.add_argument("--latency-rate", type=float, help="events/s offered (default: half of one worker's median)")
    parser.add_argument("--latency-minutes", type=int, help="windows measured (default 2; --full 60)")
    parser.add_argument("--skip", default="", help=f"comma-separated parts to leave out: {', '.join(PARTS)}")
    parser.add_argument("--profile", action="store_true", help="also sample a worker run and the largest release with py-spy")
    parser.add_argument("--json", type=Path, help="write every number to this file")
    args = parser.parse_args()
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if skip - set(PARTS):
        parser.error(f"unknown part(s) {sorted(skip - set(PARTS))}; choose from {', '.join(PARTS)}")
    sizes = [int(s) for s in (args.sizes or ("200000,1000000" if args.full else "200000")).split(",")]
    repeat = args.repeat or (5 if args.full else 3)
    faust_n = args.faust_events if args.faust_events is not None else (50_000 if args.full else 10_000)
    pairs = args.pairs or (10_000_000 if args.full else 1_000_000)
    minutes = args.latency_minutes or (60 if args.full else 2)
    clients = [c.strip() for c in args.clients.split(",") if c.strip()]

    services = perfkit.Services.from_env()
    services.check()
    workdir = Path(tempfile.mkdtemp(prefix="bench-all-"))
    load_before = os.getloadavg()
    source = results_table.source_state()
    load = results_table.LoadSampler()
    started = time.monotonic()
    result: dict[str, Any] = {"errors": {}, "throughput": {}}
    print(f"logs in {workdir}; 1-minute load average {load_before[0]:.2f}", flush=True)

    def part(key: str, run: Any, into: dict[str, Any] | None = None) -> None:
        """Run one part; a failure is reported and recorded, and the other parts still run."""
        try:
            (result if into is None else into)[key] = run()
        except Exception as exc:  # noqa: BLE001 - a benchmark part failing must not lose the others
            traceback.print_exc()
            result["errors"][key] = f"{type(exc).__name__}: {exc}"

    largest = None
    for n in sizes:
        events = perfkit.synthetic_events(n, units=args.units, groups=args.groups, windows=args.windows,
                                          partitions=args.partitions, seed=1,
                                          closers_after_ms=bench_worker.CLOSERS_AFTER_MS)
        largest = events
        if "throughput" not in skip:
            part(str(n), lambda: throughput(services, events, repeat=repeat, groups=args.groups, workdir=workdir,
                                            clients=clients), into=result["throughput"])
    assert largest is not None
    if "peers" not in skip:
        topic = perfkit.unique_name("peers-in")
        peer_events = perfkit.synthetic_events(max(sizes), units=args.units, groups=args.groups, windows=args.windows,
                                               partitions=args.partitions, seed=1)  # the same events, no closers
        try:
            perfkit.create_topic(services.bootstrap, topic, args.partitions)
            perfkit.produce(services.bootstrap, topic, peer_events)
            peer_args = argparse.Namespace(units=args.units, groups=args.groups, partitions=args.partitions, seed=1,
                                           repeat=3, faust_events=faust_n, no_pipelinedp=False,
                                           no_kstreams=args.no_kstreams)
            part("peers", lambda: bench_peers.measure(services, topic, peer_events, peer_args))
        finally:
            perfkit.delete_topics(services.bootstrap, topic)
    if args.profile and "throughput" not in skip:
        topic = perfkit.unique_name("profile-in")
        try:
            perfkit.create_topic(services.bootstrap, topic, args.partitions)
            perfkit.produce(services.bootstrap, topic, largest)
            part("worker_profile", lambda: bench_worker.profile(services, topic, largest, groups=args.groups,
                                                                workdir=workdir))
        finally:
            perfkit.delete_topics(services.bootstrap, topic)
    if "release" not in skip:
        part("release", lambda: bench_release.measure(
            services, [int(g) for g in args.release_groups.split(",")], repeat=3, events_per_window=20_000,
            workdir=workdir, profile=args.profile,
        ))
    if "budget" not in skip:
        part("budget", lambda: bench_budget.measure(services.redis_url, units_n=args.units, hours=4))
    if "noise" not in skip:
        part("noise", lambda: bench_noise.measure([1_000, 10_000, 100_000], ["laplace", "gaussian"]))
    if "memory" not in skip:
        part("memory", lambda: {"engine": bench_memory.engine_memory(pairs),
                                "engine_default_allocator": bench_memory.engine_memory(pairs, default_allocator=True),
                                "redis": bench_memory.redis_memory(services.redis_url, args.units),
                                "local_dp": bench_local_dp.measure()})
    if "latency" not in skip:
        rate = args.latency_rate or results_table.half_of_one_worker(result)
        part("latency", lambda: bench_latency.measure(services, rate=rate, minutes=minutes, units=args.units,
                                                      groups=args.groups, partitions=args.partitions, workdir=workdir))
    result["meta"] = results_table.meta(
        load=load.stop(), load_before=load_before, source=source, seconds=time.monotonic() - started, sizes=sizes,
        repeat=repeat, args=args, faust_events=faust_n, pairs=pairs, events=largest,
    )
    result["derived"] = results_table.derive(result)
    print()
    results_table.print_report(result)
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
