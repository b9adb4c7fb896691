"""Benchmark: expected partitions of a batch of unit ids, vectorised against per-key references.

Prints nanoseconds per key, at batches of 20k ids shaped like ``u123456``
like ``acct-10000042`` (10 to 20 bytes, mixed in one batch) and like
36-character UUIDs, for

* ``murmur2`` (vectorised) against kafka-python's pure-Python murmur2 called per key;
* ``crc32`` (vectorised, table-driven) against ``zlib.crc32`` called per key
  (C, so the fastest per-key alternative, not a pure-Python one);
* ``expected_partitions`` end to end, per partitioner;

and each reference's time as a multiple of the vectorised one (``x faster``).

    .venv/bin/python tests/perf/bench_partitioning.py            # a few seconds
    .venv/bin/python tests/perf/bench_partitioning.py --batch 100000 --repeat 9
"""

from __future__ import annotations

import argparse
import time
import uuid
import warnings
import zlib
from collections.abc import Callable

import numpy as np

from stream_dp.windows.partitioning import crc32, expected_partitions, murmur2

with warnings.catch_warnings():
    # kafka-python 3.x warns about importlib.resources' legacy API at import time
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.partitioner.default import murmur2 as kafka_python_murmur2


def best_of(repeat: int, run: Callable[[], object]) -> float:
    """Fastest of ``repeat`` runs, in seconds (the machine is shared)."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)


def synthetic_ids(shape: str, count: int, seed: int) -> list[bytes]:
    rng = np.random.default_rng(seed)  # synthetic data only
    if shape == "u123456":
        return [b"u%d" % u for u in rng.integers(100_000, 1_000_000, count).tolist()]
    if shape == "acct-":  # 10 to 20 bytes, mixed lengths in one batch
        return [b"acct-%d" % (10 ** int(d) + u) for d, u in zip(rng.integers(4, 15, count), rng.integers(0, 9_999, count))]
    return [str(uuid.UUID(bytes=rng.bytes(16), version=4)).encode("ascii") for _ in range(count)]


def per_key(function: Callable[[bytes], int], ids: list[bytes]) -> Callable[[], object]:
    return lambda: np.fromiter(map(function, ids), dtype=np.uint32, count=len(ids))


def bench_shape(shape: str, batch: int, partitions: int, repeat: int, seed: int) -> None:
    ids = synthetic_ids(shape, batch, seed)
    keys = np.array(ids, dtype="S")
    assert murmur2(keys).tolist() == [kafka_python_murmur2(k) for k in ids]
    assert crc32(keys).tolist() == [zlib.crc32(k) for k in ids]
    rows = [
        ("murmur2", lambda: murmur2(keys), "kafka-python murmur2", per_key(kafka_python_murmur2, ids)),
        ("crc32", lambda: crc32(keys), "zlib.crc32 per key", per_key(zlib.crc32, ids)),
        ("partitions murmur2", lambda: expected_partitions(keys, partitions, "murmur2"), None, None),
        ("partitions crc32", lambda: expected_partitions(keys, partitions, "crc32"), None, None),
    ]
    print(f"\n{batch} ids like {ids[0].decode()!r} ({keys.dtype}), {partitions} partitions, best of {repeat}")
    print(f"{'vectorised':<20} {'ns/key':>8}   {'per-key reference':<22} {'ns/key':>8} {'x faster':>9}")
    for name, vectorised, reference_name, reference in rows:
        ns = best_of(repeat, vectorised) / batch * 1e9
        if reference is None:
            print(f"{name:<20} {ns:>8.1f}")
            continue
        reference_ns = best_of(max(1, repeat // 2), reference) / batch * 1e9
        print(f"{name:<20} {ns:>8.1f}   {reference_name:<22} {reference_ns:>8.1f} {reference_ns / ns:>9.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=20_000, help="ids per batch")
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=7, help="runs per measurement; the fastest is shown")
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    for shape in ("u123456", "acct-", "uuid"):
        bench_shape(shape, args.batch, args.partitions, args.repeat, args.seed)


if __name__ == "__main__":
    main()
