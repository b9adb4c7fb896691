"""Background rounds: one at a time, and a failure is raised where the caller next looks."""

from __future__ import annotations

import asyncio

import pytest

from stream_dp.worker.ingest.background import BackgroundRounds


def test_one_round_at_a_time_and_settle_waits_for_it():
    async def scenario():
        started, release = [], asyncio.Event()

        async def work():
            started.append(len(started))
            await release.wait()

        rounds = BackgroundRounds(work)
        assert rounds.start() and not rounds.start()  # the second waits for the first to end
        await asyncio.sleep(0)
        assert started == [0] and rounds.running
        release.set()
        await rounds.settle()
        assert not rounds.running
        assert rounds.start()
        await rounds.settle(raise_failure=True)
        return started

    assert asyncio.run(scenario()) == [0, 1]


def test_a_failed_round_fails_the_next_start_or_a_settle_that_asks():
    async def scenario():
        async def fail():
            raise RuntimeError("redis exploded")

        rounds = BackgroundRounds(fail)
        rounds.start()
        await rounds.settle()  # kept for the next start
        with pytest.raises(RuntimeError, match="exploded"):
            rounds.start()
        assert rounds.start()  # raised once; a new round starts
        with pytest.raises(RuntimeError, match="exploded"):
            await rounds.settle(raise_failure=True)
        await rounds.settle(raise_failure=True)  # nothing left

    asyncio.run(scenario())
