"""Helpers shared by the budget tests."""

from __future__ import annotations

from collections.abc import Callable

from stream_dp.budget import BudgetPolicy, HorizonLimit, MemoryBudgetStore, NamespacePolicy, RedisBudgetStore

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


class Clock:
    """A store clock the test moves by hand (milliseconds)."""

    def __init__(self, start_ms: int) -> None:
        self.now_ms = start_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        self.now_ms += ms


def standard_policy() -> BudgetPolicy:
    """epsilon <= 1 per hour (4 buckets) and <= 4 per day (24 buckets), alerts at 0.8 and 1.0."""
    return BudgetPolicy(
        [
            NamespacePolicy(
                "users",
                "epsilon",
                [HorizonLimit(HOUR_MS, 1.0, buckets=4), HorizonLimit(DAY_MS, 4.0, buckets=24)],
                alert_at=(0.8, 1.0),
            ),
            NamespacePolicy("devices", "rho", [HorizonLimit(HOUR_MS, 0.5, buckets=4)], alert_at=(0.5,)),
        ]
    )


StoreFactory = Callable[..., MemoryBudgetStore | RedisBudgetStore]


def concurrent_worker(url: str, prefix: str, worker: int, rounds: int, now_ms: int) -> list[tuple[list[str], int]]:
    """Run in a child process: charge overlapping random batches; return (charged units, cost in micro-units)."""
    import numpy as np

    from stream_dp.budget import RedisBudgetStore
    from stream_dp.budget.policy import to_units_up

    store = RedisBudgetStore.from_url(url, standard_policy(), key_prefix=prefix, clock_ms=lambda: now_ms)
    rng = np.random.default_rng(worker)  # synthetic test data only
    pool = [f"unit-{k}" for k in range(300)]
    done: list[tuple[list[str], int]] = []
    try:
        for r in range(rounds):
            units = [pool[k] for k in rng.choice(len(pool), size=150, replace=False)]
            cost = float(rng.choice([0.05, 0.1, 0.15]))
            outcome = store.charge("users", f"w{worker}/r{r}", units, cost, now_ms)
            done.append(([u for u, x in zip(units, outcome.excluded, strict=True) if not x], to_units_up(cost)))
    finally:
        store.close()
    return done
