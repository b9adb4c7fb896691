"""Fixtures of every reliability test."""

from __future__ import annotations

import gc
import warnings

import pytest

from tests.reliability.scenario import Scenario


@pytest.fixture(autouse=True)
def _collect_sockets_of_refused_connects():
    """kafka-python 3 leaks a socket on each refused connect, and the harness's clients meet brokers a fault
    stopped or cut off: collect those sockets here, after the test that refused them, instead of letting them
    surface as ResourceWarnings in whichever test this process runs next."""
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


@pytest.fixture
def scenario(tmp_path, kafka_bootstrap):
    """Makes ``Scenario``s (a one-query worker on the suite's broker and a private Redis behind the fault
    proxy) in this test's directory; closes them after it."""
    made: list[Scenario] = []

    def make(**kwargs) -> Scenario:
        made.append(Scenario(tmp_path, kafka_bootstrap, **kwargs))
        return made[-1]

    yield make
    for s in made:
        s.close()
