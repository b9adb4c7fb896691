"""Backends of the continual-charging tests: journal, budget store and period register, in memory or in Redis."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from stream_dp.budget import (
    BudgetPolicy,
    HorizonLimit,
    MemoryBudgetStore,
    NamespacePolicy,
    RedisBudgetStore,
    StoreOptions,
)
from stream_dp.budget.redis_nodes import ReplicaWait
from stream_dp.budget.redis_url import client_from_url
from stream_dp.worker.store.ledger import MemoryReleaseLedger, RedisReleaseLedger
from stream_dp.worker.store.period_register import MemoryPeriodRegister, RedisPeriodRegister

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
URL_FIXTURES = {"redis": "redis_url", "redis-cluster": "redis_cluster_url"}


class Clock:
    """The store clock, moved by hand (ms)."""

    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def hour_clock() -> Clock:
    # A recent, hour-aligned time: periods of the tests fall on whole hours.
    return Clock(int(time.time() * 1000) // HOUR_MS * HOUR_MS)


def day_policy(limit: float = 10.0) -> BudgetPolicy:
    return BudgetPolicy([NamespacePolicy("users", "epsilon", (HorizonLimit(DAY_MS, limit, buckets=24),))])


@dataclass
class Backend:
    journal: Any
    budget: Any
    periods: Any


class Backends:
    """Makes fresh backends (own key prefix each) of one kind on one clock; deletes their keys at the end."""

    def __init__(self, kind: str, request: pytest.FixtureRequest, unique_name: str, clock: Clock) -> None:
        self.kind, self.clock, self.name = kind, clock, unique_name
        self.client: Any = None
        self.wait: ReplicaWait | None = None
        if kind != "memory":
            self.client = client_from_url(request.getfixturevalue(URL_FIXTURES[kind]), timeout_s=5.0)
            self.wait = ReplicaWait(1, 2000) if kind == "redis-cluster" else None
        self._made = 0

    def make(self, policy: BudgetPolicy | None = None, options: StoreOptions | None = None,
             **register_kwargs: Any) -> Backend:
        policy, options = policy or day_policy(), options or StoreOptions()
        self._made += 1
        if self.client is None:
            return Backend(MemoryReleaseLedger(), MemoryBudgetStore(policy, options, clock_ms=self.clock),
                           MemoryPeriodRegister(options, clock_ms=self.clock))
        prefix = f"{self.name}:{self._made}"
        return Backend(
            RedisReleaseLedger(self.client, prefix=f"{prefix}:ledger", wait=self.wait),
            RedisBudgetStore(self.client, policy, options, key_prefix=f"{prefix}:", clock_ms=self.clock,
                             wait=self.wait),
            self.register(prefix, options, **register_kwargs),
        )

    def register(self, prefix: str, options: StoreOptions, **kwargs: Any) -> Any:
        if self.client is None:
            return MemoryPeriodRegister(options, clock_ms=self.clock)
        return RedisPeriodRegister(self.client, options=options, prefix=f"{prefix}:periods", wait=self.wait, **kwargs)

    def close(self) -> None:
        if self.client is not None:
            for key in self.client.scan_iter(match=f"{self.name}:*", count=1000):
                self.client.delete(key)
            self.client.close()


def backends_fixture(kinds: list[str]) -> Callable[..., Iterator[Backends]]:
    @pytest.fixture(params=kinds)
    def backends(request: pytest.FixtureRequest, unique_name: str) -> Iterator[Backends]:
        made = Backends(str(request.param), request, unique_name, hour_clock())
        yield made
        made.close()

    return backends
