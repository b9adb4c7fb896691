"""Fixtures of every reliability test."""

from __future__ import annotations

import gc
import warnings

import pytest


@pytest.fixture(autouse=True)
def _collect_sockets_of_refused_connects():
    """kafka-python 3 leaks a socket on each refused connect, and the harness's clients meet brokers a fault
    stopped or cut off: collect those sockets here, after the test that refused them, instead of letting them
    surface as ResourceWarnings in whichever test this process runs next."""
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
