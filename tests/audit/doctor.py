"""Doctored builds for the audit's negative controls: each one breaks the guarantee by a known amount.

An audit that has only ever seen sound releases has not shown it can see an unsound one. Each
doctoring below is a monkeypatch of the release path, applied in a test process (``doctored``, a
context manager) or in a worker process started by ``python -m tests.audit.doctored_worker``, which
reads ``STREAM_DP_AUDIT_DOCTOR``. Nothing in ``stream_dp`` reads that variable: production cannot be
doctored from its environment, only by running this test module's entry point.

* ``sensitivity_x2``: every total of a window (counts, sums, distinct units, histograms, feature
  sums) is doubled before noise, and every sample-and-aggregate value counts in its unit's block and
  the next: one unit moves what the noise protects by twice the sensitivity it was calibrated for.
  (A doubling is a bijection of what the worker sees, so the local-DP queries, which add no noise
  of their own, lose nothing more by it.)
* ``noise_half``: every noise draw at half its scale (every noise source the worker builds, and the
  staircase at half its stair width); producers randomizing local-DP reports at twice their
  epsilon, which the audit's producer does when asked (``local_epsilon``).
* ``presence_leak``: a release adds one record ``{"kind": "presence"}`` (with the query's privacy
  statement, as every record) for every group in which some unit was counted: the records published
  say, without noise, which groups had data.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import orjson
import pytest

ENV = "STREAM_DP_AUDIT_DOCTOR"
DOCTORINGS = ("sensitivity_x2", "noise_half", "presence_leak")
PRESENCE_KIND = "presence"


def from_environment() -> str | None:
    """The doctoring named by ``STREAM_DP_AUDIT_DOCTOR``, or None when it is unset or empty."""
    return checked(os.environ.get(ENV) or None)


def checked(doctoring: str | None) -> str | None:
    if doctoring is not None and doctoring not in DOCTORINGS:
        raise ValueError(f"{ENV}={doctoring!r} is no doctoring; use one of {', '.join(DOCTORINGS)} or leave it unset")
    return doctoring


def local_epsilon(epsilon: float, doctoring: str | None) -> float:
    """The epsilon a producer randomizes a local-DP report at: twice the query's when the noise is halved."""
    return 2 * epsilon if doctoring == "noise_half" else epsilon


@contextmanager
def doctored(doctoring: str | None) -> Iterator[None]:
    """The release path doctored for the duration (nothing changes for None)."""
    with pytest.MonkeyPatch.context() as patch:
        install(checked(doctoring), patch)
        yield


def install(doctoring: str | None, patch: pytest.MonkeyPatch) -> None:
    """Apply ``doctoring``'s monkeypatches with ``patch`` (a worker process never undoes them)."""
    from stream_dp.dp.staircase import CalibratedStaircase
    from stream_dp.worker import app
    from stream_dp.worker.release import draw as release_draw

    if doctoring == "noise_half":
        patch.setattr(app, "noise_source", _halved_source(app.noise_source))
        patch.setattr(CalibratedStaircase, "apply", _half_width_staircase(CalibratedStaircase.apply))
    elif doctoring in ("sensitivity_x2", "presence_leak"):
        patch.setattr(release_draw, "build_release", _doctored_build(release_draw.build_release, doctoring))


class _HalfScale:
    """A noise source drawing every law at half the scale it is asked for."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def integers(self, values: Any, *, kind: str, scale: float) -> Any:
        return self._inner.integers(values, kind=kind, scale=scale / 2)

    def floats(self, values: Any, *, kind: str, scale: float, k: int) -> Any:
        return self._inner.floats(values, kind=kind, scale=scale / 2, k=k)

    def top_k(self, scores: Any, *, k: int, scale: float) -> Any:
        return self._inner.top_k(scores, k=k, scale=scale / 2)

    def words(self, n: int) -> Any:
        return self._inner.words(n)


def _halved_source(original: Any) -> Any:
    @functools.wraps(original)
    def noise_source(*args: Any, **kwargs: Any) -> Any:
        return _HalfScale(original(*args, **kwargs))

    return noise_source


def _half_width_staircase(original: Any) -> Any:
    from stream_dp.dp.staircase import StaircaseLaw

    @functools.lru_cache(maxsize=16)
    def half(law: Any) -> Any:
        return StaircaseLaw.best(law.epsilon, max(1, law.steps // 2), law.grid_k)

    def apply(self: Any, values: Any, noise: Any, *, changed: int | None = None) -> Any:
        return original(dataclasses.replace(self, law=half(self.law)), values, noise, changed=changed)

    return apply


def _doctored_build(original: Any, doctoring: str) -> Any:
    @functools.wraps(original)
    def build_release(query: Any, window: Any, noise: Any, released_at_ms: int, previous_state: Any = None) -> Any:
        if doctoring == "sensitivity_x2":
            return original(query, doubled(query, window), noise, released_at_ms, previous_state)
        entry = original(query, window, noise, released_at_ms, previous_state)
        return dataclasses.replace(entry, extras=(*entry.extras, *presence_records(query, window)))

    return build_release


def doubled(query: Any, window: Any) -> Any:
    """``window`` with every total twice what its units contributed (see the module docstring)."""
    from stream_dp.dp.histogram import SparseHistogram
    from stream_dp.windows.partial import BlockValues

    changes: dict[str, Any] = {"count": window.count * 2, "distinct_units": window.distinct_units * 2}
    if window.sum is not None:
        changes["sum"] = window.sum * 2
    if window.features is not None:
        changes["features"] = window.features * 2
    if window.histogram is not None:
        h = window.histogram
        changes["histogram"] = SparseHistogram(h.n_groups, h.bins, h.group, h.bin, h.count * 2)
    if window.blocks is not None and len(window.blocks):
        b, blocks = window.blocks, query.plan.sample_aggregate.blocks
        changes["blocks"] = BlockValues(np.concatenate([b.group, b.group]),
                                        np.concatenate([b.block, (b.block + 1) % blocks]).astype(np.int32),
                                        np.concatenate([b.value, b.value]))
    return dataclasses.replace(window, **changes)


def presence_records(query: Any, window: Any) -> list[tuple[bytes, bytes]]:
    """One record per group of ``window`` in which some unit was counted."""
    names = list(query.config.group_by)
    out = []
    for i in np.flatnonzero(np.asarray(window.count) > 0).tolist():
        group = list(window.groups[i])
        out.append((orjson.dumps(group), orjson.dumps({
            "query": query.name, "kind": PRESENCE_KIND,
            "window": {"start_ms": window.window_start_ms, "end_ms": window.window_end_ms},
            "group": dict(zip(names, group)), "privacy": query.privacy,
        })))
    return out
