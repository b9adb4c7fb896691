"""Event-to-release latency at a fixed offered rate, with the worker's memory and CPU over the soak.

    .venv/bin/python tests/perf/bench_latency.py [--rate 100000] [--minutes 10]

One worker (``stream-dp run``) reads a topic that a producer process fills at
``--rate`` events per second, each event stamped (record and event time) with
the moment it is produced, as a live stream would be: one-minute windows,
5 s allowed lateness, the same query, budget and data shape as the throughput
runs (``perfkit``: 100,000 units, 1,000 groups, murmur2 placement).
Production starts at once and goes on until the ``--minutes`` full windows after
the first minute boundary have ended and their allowed lateness has passed
(plus a second), so each measured window is closed by the records that follow
it, never by the idle timeout.

* **Event-to-release latency**, over every event of the measured windows: the
  moment its window's last record is read from the output topic minus its
  event time (p50, p99, max). With tumbling windows most of it is the wait
  for the window to end; **close-to-release** is the rest, per window: last
  output record minus (window end + allowed lateness), i.e. what the pipeline
  adds (reading, closing, budget charges, partials, noise, publishing).
* **Offered and achieved rate**: what the producer offered, per second of its
  run, and whether it kept up.
* **Memory** (the soak): the worker's RSS every 100 ms; reported as each
  measured window is released (printed as it happens, with the 1-minute load
  average), after the third window, after the last, their ratio, the largest
  deviation of a later window from the third (the goal: within 10%) and the
  maximum.
* **CPU-s per million events**: the worker's user + system CPU over the
  measured windows, per million events in them.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import perfkit  # noqa: E402
import watch  # noqa: E402
from bench_worker import wait_group_stable  # noqa: E402

LATENESS_MS = 5_000
TICK_S = 0.01


def produce_at_rate(bootstrap: str, topic: str, rate: float, stop_wall: float, units: int, groups: int,
                    partitions: int, log_path: str) -> None:
    """Producer process: ``rate`` events/s in 10 ms ticks until ``stop_wall`` (epoch s); writes
    [(tick epoch ms, events)] to ``log_path``."""
    from confluent_kafka import Producer

    from stream_dp.windows.partitioning import expected_partitions

    rng = np.random.default_rng(7)  # synthetic data only
    keys = [b"u%d" % u for u in range(units)]
    placed = expected_partitions(np.array(keys, dtype="S"), partitions, "murmur2").tolist()
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 1_000_000,
                         "queue.buffering.max.messages": 2_000_000, "log_level": 3})
    ticks: list[tuple[int, int]] = []
    started = time.time()
    sent = 0
    try:
        while True:
            now = time.time()
            if now >= stop_wall:
                break
            due = int((now - started) * rate) - sent
            if due > 0:
                ts = int(now * 1000)
                unit = rng.integers(0, units, due).tolist()
                group = rng.integers(0, groups, due).tolist()
                value = np.round(rng.gamma(2.0, 20.0, due), 2).tolist()
                for u, g, v in zip(unit, group, value):
                    payload = b'{"user_id":"u%d","ts":%d,"page":"/g%d","value":%.2f}' % (u, ts, g, v)
                    while True:
                        try:
                            producer.produce(topic, value=payload, key=keys[u], partition=placed[u], timestamp=ts)
                            break
                        except BufferError:
                            producer.poll(0.01)
                sent += due
                ticks.append((ts, due))
            producer.poll(0)
            time.sleep(max(0.0, TICK_S - (time.time() - now)))
    finally:
        producer.flush(60)
        Path(log_path).write_text(json.dumps(ticks))


def rss_at(poller: watch.Poller, wall: float) -> float:
    """The worker's RSS (bytes) at the last poll at or before epoch time ``wall``."""
    before = [rss for t, _, rss in poller.usage if t <= wall]
    return float(before[-1] if before else (poller.usage[0][2] if poller.usage else "nan"))


def follow_windows(reader: watch.OutputReader, poller: watch.Poller, measured: list[int],
                   producer: multiprocessing.process.BaseProcess, deadline: float) -> list[dict[str, float]]:
    """While the soak runs, print each measured window as it is released: the worker's RSS then
    and the 1-minute load average; returns those rows."""
    rows: list[dict[str, float]] = []
    while len(rows) < len(measured) and time.time() < deadline:
        start = measured[len(rows)]
        done = reader.completed_wall.get(start)
        if done is None:
            if not producer.is_alive() and producer.exitcode not in (0, None):
                break
            time.sleep(0.2)
            continue
        row = {"window_ms": start, "released_wall": done, "rss_mb": rss_at(poller, done) / 2**20,
               "load_1m": os.getloadavg()[0]}
        rows.append(row)
        print(f"    window {len(rows):>3} {time.strftime('%H:%M', time.gmtime(start / 1000))} released "
              f"{done - (start + perfkit.WINDOW_MS + LATENESS_MS) / 1000:5.2f} s after close; worker RSS "
              f"{row['rss_mb']:6.0f} MB; load {row['load_1m']:.2f}", flush=True)
    return rows


def soak_rss(usage: list[tuple[float, float, int]], per_window: list[dict[str, float]]) -> dict[str, Any]:
    """The soak's memory line: RSS (MB) at the start, after the third window's release, at the end (the last
    window's release), the maximum, end / after-third, and the largest deviation from after-third in any
    later window (the "flat" criterion: within +-10%)."""
    windows = [row["rss_mb"] for row in per_window]
    third = windows[2] if len(windows) >= 3 else float("nan")
    later = windows[3:]
    return {
        "start": usage[0][2] / 2**20,
        "after_third": third,
        "end": windows[-1] if windows else usage[-1][2] / 2**20,
        "max": max(r for _, _, r in usage) / 2**20,
        "ratio_end_to_third": windows[-1] / third if later else float("nan"),
        "max_deviation_from_third": max(abs(w / third - 1) for w in later) if later else float("nan"),
        "windows": windows,
    }


def weighted_percentiles(values: np.ndarray, weights: np.ndarray, qs: list[float]) -> list[float]:
    order = np.argsort(values)
    cumulative = np.cumsum(weights[order])
    return [float(values[order][np.searchsorted(cumulative, q * cumulative[-1])]) for q in qs]


def measure(services: perfkit.Services, *, rate: float, minutes: int, units: int = 100_000, groups: int = 1_000,
            partitions: int = 4, workdir: Path) -> dict[str, Any]:
    name = perfkit.unique_name("lat")
    topic = f"{name}-in"
    # read live, a few seconds behind: half an hour kept is ample, and bounds the disk an hour's soak takes
    perfkit.create_topic(services.bootstrap, topic, partitions, retention_ms=30 * 60_000)
    config = perfkit.write_config(workdir / f"{name}.yaml", perfkit.worker_config(
        name, topic, groups=groups, allowed_lateness=f"{LATENESS_MS}ms", idle_timeout="10s"))
    proc = poller = reader = producer = None
    try:
        proc = perfkit.WorkerProcess(config, services=services, group_id=f"{name}-g", internal_prefix=f"{name}.",
                                     metrics_port=perfkit.free_port(), log_path=workdir / f"{name}.log")
        poller = watch.Poller([proc.port], pid=proc.pid).start()
        reader = watch.OutputReader(services.bootstrap, f"{name}-out", expected_per_window=groups)
        wait_group_stable(services.bootstrap, f"{name}-g", 1, partitions)
        start_wall = time.time()
        first_window_ms = (int(start_wall * 1000) // perfkit.WINDOW_MS + 1) * perfkit.WINDOW_MS
        measured = [first_window_ms + k * perfkit.WINDOW_MS for k in range(minutes)]
        stop_wall = (measured[-1] + perfkit.WINDOW_MS + LATENESS_MS + 1_000) / 1000
        log_path = workdir / f"{name}-ticks.json"
        producer = multiprocessing.get_context("spawn").Process(
            target=produce_at_rate, args=(services.bootstrap, topic, rate, stop_wall, units, groups, partitions,
                                          str(log_path)))
        producer.start()
        print(f"  latency: offering {rate:,.0f} events/s for {stop_wall - start_wall:.0f} s; measuring the "
              f"{minutes} windows from {time.strftime('%H:%M:%S', time.gmtime(first_window_ms / 1000))} UTC", flush=True)
        per_window = follow_windows(reader, poller, measured, producer, deadline=stop_wall + 120)
        producer.join(max(0.0, stop_wall - time.time() + 120))
        if producer.exitcode != 0:
            raise RuntimeError(f"the producer failed (exit {producer.exitcode})")
        if not reader.wait_windows(measured, timeout_s=120):
            missing = [w for w in measured if w not in reader.completed_wall]
            raise RuntimeError(f"windows {missing} were not released; log:\n{proc.log_tail()}")
        ticks = np.array(json.loads(log_path.read_text()), dtype=np.int64).reshape(-1, 2)
        ts, counts = ticks[:, 0], ticks[:, 1]
        window_of = (ts // perfkit.WINDOW_MS) * perfkit.WINDOW_MS
        inside = (window_of >= measured[0]) & (window_of <= measured[-1])
        released = np.array([reader.completed_wall[int(w)] for w in window_of[inside]])
        latency = released - ts[inside] / 1000
        p50, p99, top = weighted_percentiles(latency, counts[inside].astype(float), [0.5, 0.99, 1.0])
        close_to_release = [reader.completed_wall[w] - (w + perfkit.WINDOW_MS + LATENESS_MS) / 1000 for w in measured]
        span = (measured[0] / 1000, (measured[-1] + perfkit.WINDOW_MS + LATENESS_MS) / 1000)
        usage = [(t, cpu, rss) for t, cpu, rss in poller.usage if span[0] <= t <= span[1]]
        events = int(counts[inside].sum())
        produced_s = (ts[-1] - ts[0]) / 1000
        late = watch.metric_sum(watch.scrape(proc.port), "stream_dp_events_total", outcome="late")
        watch.check_release_record(reader.samples[measured[0]])
        return {
            "offered_rate": rate,
            "achieved_rate": float(counts.sum() / produced_s) if produced_s > 0 else float("nan"),
            "windows": len(measured),
            "events": events,
            "late": late,
            "latency_s": {"p50": p50, "p99": p99, "max": top},
            "close_to_release_s": {"p50": float(np.median(close_to_release)), "max": float(max(close_to_release)),
                                   "windows": close_to_release},
            "rss_mb": soak_rss(usage, per_window),
            "per_window": per_window,
            "cpu_s_per_million": (usage[-1][1] - usage[0][1]) / events * 1e6,
        }
    finally:
        if producer is not None and producer.is_alive():
            producer.terminate()
        if reader is not None:
            reader.close()
        if poller is not None:
            poller.stop()
        if proc is not None:
            proc.stop()
        perfkit.delete_topics(services.bootstrap, f"{name}-")
        perfkit.delete_topics(services.bootstrap, f"{name}.")
        perfkit.delete_groups(services.bootstrap, [f"{name}-g", f"{name}-g-release", f"{name}-out-reader"])
        perfkit.cleanup_redis(services.redis_url, name, name)


def print_result(r: dict[str, Any]) -> None:
    lat, ctr, rss = r["latency_s"], r["close_to_release_s"], r["rss_mb"]
    print(f"latency at {r['offered_rate']:,.0f} events/s offered ({r['achieved_rate']:,.0f} produced), "
          f"{r['windows']} one-minute windows, {r['events']:,} events, {r['late']:.0f} late:")
    print(f"  event to release p50 {lat['p50']:.2f} s, p99 {lat['p99']:.2f} s, max {lat['max']:.2f} s; "
          f"close to release median {ctr['p50']:.2f} s, max {ctr['max']:.2f} s")
    flat = "within 10%" if rss["max_deviation_from_third"] <= 0.10 else "NOT within 10%"
    print(f"  {soak_line(rss)} ({flat}); {r['cpu_s_per_million']:.2f} CPU-s per million events")
    print("  RSS per window (MB): " + " ".join(f"{w:.0f}" for w in rss["windows"]))


def soak_line(rss: dict[str, Any]) -> str:
    """The soak's memory figures in one line (``soak_rss``)."""
    return (f"soak: worker RSS {rss['after_third']:.0f} MB after the third window, {rss['end']:.0f} MB after the last "
            f"({rss['ratio_end_to_third']:.2f} x), max {rss['max']:.0f} MB; later windows within "
            f"{rss['max_deviation_from_third'] * 100:.0f}% of the third")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=100_000, help="events per second offered")
    parser.add_argument("--minutes", type=int, default=10, help="one-minute windows measured")
    parser.add_argument("--json", type=Path, help="also write the result to this file")
    args = parser.parse_args()
    services = perfkit.Services.from_env()
    services.check()
    workdir = Path(tempfile.mkdtemp(prefix="bench-latency-"))
    print(f"worker log in {workdir}", flush=True)
    result = measure(services, rate=args.rate, minutes=args.minutes, workdir=workdir)
    print_result(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=float))


if __name__ == "__main__":
    main()
