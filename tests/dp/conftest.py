"""Fixtures of the DP core tests."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from stream_dp.dp import OpenDPNoise


@pytest.fixture
def noise() -> OpenDPNoise:
    """The production noise source, sequential."""
    return OpenDPNoise()


@pytest.fixture
def threaded_noise() -> Iterator[OpenDPNoise]:
    """The production noise source with small chunks spread over two threads."""
    with ThreadPoolExecutor(max_workers=2) as executor:
        yield OpenDPNoise(executor=executor, chunk_size=1000)
