"""The worker's Redis budget store: its own connection, and a word about Redis durability at start."""

from __future__ import annotations

import logging
from typing import Any

from stream_dp.budget import BudgetPolicy, RedisBudgetStore
from stream_dp.metrics.budget import BudgetMetrics

log = logging.getLogger("stream_dp.worker.app")  # where operators have always found the durability warnings


def open_budget_store(url: str, policy: BudgetPolicy, settings: Any, registry: Any, wait: Any,
                      **client_options: Any) -> RedisBudgetStore:
    """A ``RedisBudgetStore`` on a connection of its own to ``url`` (``client_options``: e.g. the server
    watch's), having logged the durability settings of the server that could lose acknowledged charges."""
    from stream_dp.budget.redis_url import client_from_url

    # The store retries itself (safe: charges are idempotent); redis-py's own retries are off.
    client = client_from_url(url, timeout_s=settings.redis_timeout_s, own_retries=False, decode_responses=False,
                             **client_options)
    budget = RedisBudgetStore(client, policy, settings.budget_store_options(), retries=settings.redis_retries,
                              metrics=BudgetMetrics(registry=registry), wait=wait)
    try:
        for warning in budget.durability_warnings():
            log.warning("Redis durability: %s", warning)
    except Exception as exc:  # the server may not be up yet; charges fail closed until it is
        log.warning("could not check Redis durability settings: %s", exc)
    return budget
