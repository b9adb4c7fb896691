"""The release stage's steps for one window of G public groups, in process, each timed on its own.

    .venv/bin/python tests/perf/bench_release_stages.py [--groups 100000,1000000] [--repeat 3] [--profile out.prof]

Builds the query ``run`` builds for the release benchmark (``perfkit.worker_config``: count, sum and mean of
G public groups, Laplace) and, per round, four partitions' partials of a window with ``2 G`` events (as
``bench_release.py`` produces: each partition holds about 40% of the groups), then times, as the worker
runs them one after the other:

* ``partials``: each partial encoded to its chunk records and decoded again (the partials topic's trip,
  less Kafka's);
* ``combine``: the four partials added up into the window (``combine.totals.merge_partials``) by the
  public positions they name; ``combine by key`` is the same without them, as partials of earlier versions
  are added up (a dict lookup per group);
* ``draw``: selection and noise, the ledger entry encoded and read back (``release.draw``);
* ``ledger``: the entry claimed in Redis (``RedisReleaseLedger.claim``, a key of this run's own);
* ``publish``: every record rendered and sent to a fresh output topic and acknowledged, through the
  worker's output producer (``kafka.output_producer``: librdkafka, lz4, batches of the worker's size).
  ``--producers aiokafka`` (the default) adds the same publish through an aiokafka producer set up as the
  worker's output producer was before (lz4, idempotent, acks=all), in the same rounds.

Prints seconds per step (min / median / max over ``--repeat`` rounds) and each producer's publish time
over the worker's. ``--profile FILE`` runs one more round under cProfile and prints its top functions.
Needs the local Kafka and Redis (``eval "$(bash deploy/services.sh env)"``). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import dataclasses
import io
import pstats
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import perfkit  # noqa: E402
from stream_dp.config import parse_config  # noqa: E402
from stream_dp.dp.vectorised_noise import noise_source  # noqa: E402
from stream_dp.metrics.worker import WorkerMetrics  # noqa: E402
from stream_dp.worker.assemble.runtimes import build_runtimes  # noqa: E402
from stream_dp.worker.combine.combiner import CombinedWindow  # noqa: E402
from stream_dp.worker.combine.totals import merge_partials  # noqa: E402
from stream_dp.worker.kafka.output_producer import OutputProducer  # noqa: E402
from stream_dp.worker.partials.wire import PartialAggregate, partial_records  # noqa: E402
from stream_dp.worker.release.intake import PartialsReader  # noqa: E402
from stream_dp.worker.release.draw import draw_payload  # noqa: E402
from stream_dp.worker.release.publish import publish_release  # noqa: E402

PARTITIONS = 4
SECRET = b"bench-secret-0123456789abcdef"
BATCH_BYTES = 1_000_000 - 16_384  # the release stage's default output batch size
WORKER_STEPS = ("partials", "combine", "draw", "ledger", "publish")


def _runtime(name: str, groups: int) -> Any:
    config = parse_config(perfkit.worker_config(name, f"{name}-in", groups=groups))
    (runtime,) = build_runtimes(config, secret=SECRET, clock_ms=lambda: 0)
    return runtime


def _partials(runtime: Any, groups: int, window_ms: int, seed: int) -> list[PartialAggregate]:
    rng = np.random.default_rng(seed)  # synthetic data only; noise never comes from numpy
    events = 2 * groups
    group = rng.integers(0, groups, events)
    partition = rng.integers(0, PARTITIONS, events)
    names = runtime.combiner.public_groups
    out = []
    for p in range(PARTITIONS):
        present, counts = np.unique(group[partition == p], return_counts=True)
        out.append(PartialAggregate(
            query=runtime.name, window_start_ms=window_ms, window_end_ms=window_ms + perfkit.WINDOW_MS, partition=p,
            input_partitions=PARTITIONS, groups=[names[i] for i in present.tolist()], count=counts.astype(np.int64),
            sum=counts * 40.0, distinct_units=counts.astype(np.int64), units_charged=int(counts.sum()),
            units_excluded=0, closed_at_ms=window_ms + perfkit.WINDOW_MS, placement_partitions=PARTITIONS,
            settings=runtime.combiner.settings, public_positions=present.astype(np.int64),
        ))
    return out


def _combine(runtime: Any, partials: list[PartialAggregate]) -> CombinedWindow:
    combiner = runtime.combiner
    groups, count, sums, distinct, _, _, _ = merge_partials(
        partials, public_groups=combiner.public_groups, public_index=combiner._public_index, has_sum=True,
        quantile_bins=None, feature_width=None, blocks=False)
    first = partials[0]
    return CombinedWindow(query=runtime.name, window_start_ms=first.window_start_ms, window_end_ms=first.window_end_ms,
                          home=0, groups=groups, count=count, sum=sums, distinct_units=distinct, partitions_missing=[],
                          units_charged=sum(p.units_charged for p in partials), units_excluded=0,
                          closed_at_ms=first.closed_at_ms)


async def _round(runtime: Any, groups: int, window_ms: int, ledger: Any, noise: Any, metrics: WorkerMetrics,
                 producer: Any, aio_producer: Any, topic: str, seed: int) -> dict[str, float]:
    times: dict[str, float] = {}
    partials = _partials(runtime, groups, window_ms, seed)
    started = time.perf_counter()
    reader, decoded = PartialsReader(), []
    for partial in partials:
        for offset, chunk in enumerate(partial_records(partial, 1_000_000)):
            message = reader.read(partial.partition, offset, chunk)
            if message is not None:
                decoded.append(message)
    times["partials"] = time.perf_counter() - started
    started = time.perf_counter()
    window = _combine(runtime, decoded)
    times["combine"] = time.perf_counter() - started
    started = time.perf_counter()
    by_key = _combine(runtime, [dataclasses.replace(p, public_positions=None) for p in decoded])
    times["combine by key"] = time.perf_counter() - started
    assert by_key.count.tolist() == window.count.tolist()
    started = time.perf_counter()
    drawn = await draw_payload(runtime, window, noise, metrics, int(time.time() * 1000))
    times["draw"] = time.perf_counter() - started
    started = time.perf_counter()
    await asyncio.to_thread(ledger.claim, runtime.name, window_ms, drawn.payload)
    times["ledger"] = time.perf_counter() - started
    started, cpu = time.perf_counter(), time.process_time()
    published, rendering_s = await publish_release(producer, topic, drawn.release, max_batch_bytes=BATCH_BYTES,
                                                   on_too_large=lambda size: None)
    times["publish"] = time.perf_counter() - started
    times["publish CPU-s"] = time.process_time() - cpu
    times["(of which render)"] = rendering_s
    assert published == groups, (published, groups)
    if aio_producer is not None:
        started, cpu = time.perf_counter(), time.process_time()
        published, _ = await publish_release(aio_producer, topic, drawn.release, max_batch_bytes=BATCH_BYTES,
                                             on_too_large=lambda size: None)
        times["publish aiokafka"] = time.perf_counter() - started
        times["publish aiokafka CPU-s"] = time.process_time() - cpu
        assert published == groups, (published, groups)
    return times


async def _measure(services: perfkit.Services, groups: int, repeat: int, producers: list[str],
                   profile: Path | None) -> dict[str, Any]:
    import redis
    from aiokafka import AIOKafkaProducer
    from concurrent.futures import ThreadPoolExecutor
    from prometheus_client import CollectorRegistry

    from stream_dp.worker.store.ledger import RedisReleaseLedger

    name = perfkit.unique_name(f"rs{groups}")
    topic = f"{name}-out"
    runtime = _runtime(name, groups)
    client = redis.Redis.from_url(services.redis_url)
    ledger = RedisReleaseLedger(client)  # keys name the query: cleanup_redis finds them
    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="noise")
    noise, metrics = noise_source("exact", executor=pool), WorkerMetrics(CollectorRegistry())
    perfkit.create_topic(services.bootstrap, topic, PARTITIONS)
    producer = OutputProducer({"bootstrap.servers": services.bootstrap}, client_id=name, batch_bytes=BATCH_BYTES,
                              max_record_bytes=BATCH_BYTES, topic_wait_s=40.0)
    aio_producer = None
    if "aiokafka" in producers:  # the output producer before librdkafka's
        aio_producer = AIOKafkaProducer(bootstrap_servers=services.bootstrap, acks="all", enable_idempotence=True,
                                        linger_ms=5, compression_type="lz4", max_batch_size=BATCH_BYTES,
                                        max_request_size=BATCH_BYTES + 65_536)
        await aio_producer.start()
    await producer.start()
    rounds: list[dict[str, float]] = []
    try:
        window_ms = 0
        for k in range(repeat + (1 if profile else 0)):
            window_ms = (k + 1) * perfkit.WINDOW_MS
            profiler = cProfile.Profile() if profile and k == repeat else None
            if profiler:
                profiler.enable()
            times = await _round(runtime, groups, window_ms, ledger, noise, metrics, producer, aio_producer, topic, k)
            if profiler:
                profiler.disable()
                profiler.dump_stats(profile)
                text = io.StringIO()
                pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
                print(text.getvalue())
                break
            rounds.append(times)
            print(f"  {groups:>9,} groups, round {k + 1}: " + ", ".join(f"{s} {t:.3f} s" for s, t in times.items()),
                  flush=True)
    finally:
        await producer.stop()
        if aio_producer is not None:
            await aio_producer.stop()
        pool.shutdown()
        perfkit.delete_topics(services.bootstrap, name)
        perfkit.cleanup_redis(services.redis_url, name, name)
    steps = list(rounds[0]) if rounds else []
    return {step: perfkit.summarize([r[step] for r in rounds]) for step in steps} | {
        "worker_steps": perfkit.summarize([sum(t for s, t in r.items() if s in WORKER_STEPS) for r in rounds])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", default="100000,1000000", help="comma-separated groups per window")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--producers", default="aiokafka",
                        help="other clients to publish through, in the same rounds (aiokafka; '' none)")
    parser.add_argument("--profile", type=Path, help="one more round under cProfile, written to this file")
    args = parser.parse_args()
    services = perfkit.Services.from_env()
    services.check()
    producers = [p for p in args.producers.split(",") if p]
    for groups in (int(g) for g in args.groups.split(",")):
        result = asyncio.run(_measure(services, groups, args.repeat, producers, args.profile))
        print(f"{groups:,} groups, seconds min / median / max over {args.repeat} rounds")
        for step, s in result.items():
            print(f"  {step:<18} {s['min']:7.3f} / {s['median']:7.3f} / {s['max']:7.3f}")
        if "publish aiokafka" in result:
            ratios = [r / a for r, a in zip(result["publish"]["runs"], result["publish aiokafka"]["runs"])]
            print("  publish through the output producer (librdkafka) / aiokafka, per round: "
                  + " ".join(f"{x:.2f}" for x in ratios))


if __name__ == "__main__":
    main()
