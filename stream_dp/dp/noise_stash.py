"""Discrete Laplace noise drawn ahead of the release that adds it.

A window of a million public groups draws two million exact discrete Laplace
samples: about two seconds between the window's close and its first record.
None of those draws depends on the data -- a public-groups query draws, for
every window, vectors whose lengths and scales come from its configuration --
so the release stage draws the next window's vectors while that window is
still open (``VectorisedExactNoise.predraw``, after each release), and the
release only adds them.

Why this changes nothing of the privacy guarantee:

* each stashed vector is drawn by the same exact sampler
  (:func:`stream_dp.dp.exact_sampling.discrete_laplace`), from the same kernel
  CSPRNG, with the same scale and length as the release would draw it itself,
  independently of everything else;
* it is handed out once: ``take`` removes it, so no two releases (nor two
  vectors of one release) share a draw;
* a release that finds no vector of its scale and length draws its own, as
  before; vectors never taken are dropped, and noise added to nothing reveals
  nothing.

So every release adds noise of exactly the law it would have drawn. Vectors
are kept per owner (a query name): another query never takes them, so whether
a release finds its noise drawn depends on its own configuration and on the
wall clock (whether the draw after the previous release has finished), never
on another query's data. Only public-groups queries have their draws stashed
(``release.draw``): a query that selects groups draws vectors whose length is
the number of candidate groups, which the data decides.
"""

from __future__ import annotations

import threading
from typing import Any

#: (scale numerator t, scale denominator s, length n) of one discrete Laplace vector of scale t / s.
DrawKey = tuple[int, int, int]


class NoiseStash:
    """Per owner, the vectors drawn for its next release; thread-safe (builds and draws run in threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready: dict[str, dict[DrawKey, list[Any]]] = {}
        self._drawing: set[str] = set()

    def take(self, owner: str, key: DrawKey) -> Any | None:
        """A vector drawn for ``owner`` with ``key``, removed from the stash; None if there is none."""
        with self._lock:
            vectors = self._ready.get(owner, {}).get(key)
            return vectors.pop() if vectors else None

    def start_drawing(self, owner: str) -> bool:
        """Whether a draw for ``owner`` may start (False while one is under way: at most one at a time)."""
        with self._lock:
            if owner in self._drawing:
                return False
            self._drawing.add(owner)
            return True

    def fill(self, owner: str, drawn: list[tuple[DrawKey, Any]]) -> None:
        """``owner``'s stash becomes ``drawn`` (what it held before is dropped: one release's worth at most)."""
        ready: dict[DrawKey, list[Any]] = {}
        for key, vector in drawn:
            ready.setdefault(key, []).append(vector)
        with self._lock:
            self._ready[owner] = ready
            self._drawing.discard(owner)

    def abandon(self, owner: str) -> None:
        """A draw for ``owner`` ended without vectors (it failed)."""
        with self._lock:
            self._drawing.discard(owner)

    def held(self, owner: str) -> int:
        """How many vectors wait for ``owner``."""
        with self._lock:
            return sum(map(len, self._ready.get(owner, {}).values()))
