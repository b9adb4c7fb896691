"""Garbage-collector settings for the worker process.

Every poll allocates and frees tens of thousands of short-lived container objects
(record batches' records, decoded events, lists), and CPython's collector runs
its youngest generation every 700 allocations and its full collection over every
object the process holds -- the imported modules, the clients and the query
objects built at start-up included. Measured on the worker, that made reading
records several times slower than the same code in a small process. The worker
therefore freezes what start-up built (``gc.freeze``: full collections skip it)
and collects the youngest generation every ``gen0`` allocations instead.
Reference counting still frees nearly everything at once; only reference cycles
wait a little longer.
"""

from __future__ import annotations

import gc

GEN0_THRESHOLD = 50_000
GEN1_THRESHOLD = 20
GEN2_THRESHOLD = 100


def tune_garbage_collector(gen0: int = GEN0_THRESHOLD, gen1: int = GEN1_THRESHOLD, gen2: int = GEN2_THRESHOLD) -> None:
    """Freeze the objects alive now and set the collection thresholds (call once, after start-up)."""
    if gen0 < 1 or gen1 < 1 or gen2 < 1:
        raise ValueError(f"garbage-collector thresholds must be positive, got {gen0}, {gen1}, {gen2}")
    gc.collect()
    gc.freeze()
    gc.set_threshold(gen0, gen1, gen2)
