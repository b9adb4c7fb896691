"""Local-DP reports randomized at the source: what a producer sends in place of each event, and its secret.

Each report is a fixed function of the producer's secret key and of what it reports -- the query, the field,
the randomizer's settings, the unit, the window and the true value (``stream_dp.dp.keyed_bits``) -- so a
re-run on the same input with the same key (a retry after a crash, a replay) sends the very same reports, and
no reader of the topic can average a unit's reports of one value across runs.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import orjson

from stream_dp.dp.keyed_bits import MIN_SECRET_BYTES, KeyedBits
from stream_dp.dp.local import REPORT_TAG_FIELD, LocalRandomizer, report_tag
from stream_dp.windows.specs import WindowSpec

if TYPE_CHECKING:
    from stream_dp.config import QueryConfig

SECRET_ENV = "STREAM_DP_LOCAL_DP_SECRET"
_CREATE = "(umask 077; head -c 32 /dev/urandom > local-dp.key)"


def local_dp_secret(path: Path | None, environ: Mapping[str, str] = os.environ) -> bytes:
    """The producer's key, from ``--local-dp-secret-file`` (the file's bytes) or ``STREAM_DP_LOCAL_DP_SECRET``.

    Refused when absent: drawing fresh randomness instead would send independent reports on every re-run.
    """
    from_env = environ.get(SECRET_ENV)
    if path is not None and from_env is not None:
        # Which one wins would decide whether a re-run republishes the same reports: take neither.
        raise ValueError(f"both --local-dp-secret-file and {SECRET_ENV} are set; give the producer's secret one "
                         "way only, the same on every run")
    if path is not None:
        try:
            secret = Path(path).read_bytes()
        except OSError as exc:
            raise ValueError(f"cannot read --local-dp-secret-file {path}: {exc.strerror or exc}; create the "
                             f"producer's secret once with `{_CREATE}` and keep it") from None
        where = f"the secret in {path}"
    elif from_env is not None:
        secret, where = from_env.encode(), SECRET_ENV
    else:
        raise ValueError(
            "--local-dp needs a secret key, kept by this producer and never sent: each report is drawn from it and "
            "from the unit, window and value, so that a re-run sends the same reports and replays cannot be "
            f"averaged. Create one once with `{_CREATE}` and pass --local-dp-secret-file local-dp.key on every "
            f"run (or set {SECRET_ENV} to {MIN_SECRET_BYTES} or more random characters)")
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"{where} is {len(secret)} bytes; it needs at least {MIN_SECRET_BYTES}: create 32 random "
                         f"bytes with `{_CREATE}` and pass --local-dp-secret-file local-dp.key")
    return secret


class LocalReports:
    """What ``--local-dp`` sends instead of each event: a new event of four fields, built in this process.

    The event sent holds the privacy unit id and the event time as given, under ``field`` the randomized
    report (``stream_dp.dp.local``) of the true value and under ``REPORT_TAG_FIELD`` the randomizer's tag
    (``report_tag``), which the worker requires; nothing else of the input is copied, so a copy of the
    true value in another field (``ua``, ``ctx.browser``, ...) never leaves. At most one report is sent per
    unit per window, the first: the worker keeps one report per unit per window and charges epsilon once, and
    several independent reports of one true value on the topic would let a reader average the noise away.
    Across runs the same holds because the report's coins are keyed (see the module docstring).
    """

    def __init__(  # type: ignore[no-untyped-def]
        self, field: str, domain: list, randomizer, *, secret: bytes, query: str, unit_field: str,
        timestamp_field: str, window: WindowSpec, clock_ms=None,
    ) -> None:
        self.field, self.domain, self.randomizer = field, domain, randomizer
        self.unit_field, self.timestamp_field = unit_field, timestamp_field
        self.window = window
        self.index = {value: i for i, value in enumerate(domain)}
        self.tag = report_tag(randomizer, domain)
        self._secret = secret
        # Changed settings or domain give reports of their own, independent of the old ones (whose epsilons then
        # add up), rather than reports correlated with them in ways no composition theorem covers.
        self._context = (query.encode(), field.encode(), randomizer.mechanism.encode(),
                         float(randomizer.epsilon).hex().encode(), hashlib.sha256(orjson.dumps(domain)).digest())
        self.clock_ms = clock_ms if clock_ms is not None else (lambda: int(time.time() * 1000))
        self.dropped = 0  # no value in the domain
        self.unusable = 0  # no JSON object, unit id or event time
        self.repeated = 0  # the unit had reported in that window already
        self.late = 0  # the window had been forgotten
        self._units_by_window: dict[int, set[str]] = {}
        self._newest_ms: int | None = None
        # Windows ending at or before this are forgotten, and events in them not sent (see _forget_old_windows).
        self._closed_through_ms: int | None = None

    def report_bits(self, unit: str, window_start_ms: int, true_index: int) -> KeyedBits:
        """The words one report is drawn from: the same for the same unit, window and value, whatever the run."""
        return KeyedBits(self._secret, *self._context, unit.encode(), str(window_start_ms).encode(),
                         orjson.dumps(self.domain[true_index]))

    def apply(self, events, *, summary: bool = True):  # type: ignore[no-untyped-def]
        """The reports of ``events`` ((key, value, event time ms) each); ``summary``: print, at the end, what was
        not sent and why (the counts stay in ``unusable``, ``dropped``, ``repeated`` and ``late`` either way)."""
        # The sources give each event's time parsed from the query's timestamp field (None: unparsable); the
        # key is made again from the unit id sent.
        for _key, value, event_ms in events:
            try:
                event = orjson.loads(value)
                unit, ts = event[self.unit_field], event[self.timestamp_field]
            except (orjson.JSONDecodeError, KeyError, TypeError):
                self.unusable += 1
                continue
            # Only ids the worker accepts (a string or an integer): a nested object could hold the true value.
            if event_ms is None or isinstance(unit, bool) or not isinstance(unit, (str, int)):
                self.unusable += 1
                continue
            try:
                true_index = self.index[event[self.field]]
            except (KeyError, TypeError):
                self.dropped += 1  # a value outside the domain (or none) is never sent, true or not
                continue
            start = int(self.window.start_of(event_ms))  # the worker's own window assignment
            if self._closed_through_ms is not None and start + self.window.size_ms <= self._closed_through_ms:
                self.late += 1  # its window's reports were forgotten: a second one might go out
                continue
            # str(): the record key the unit is sent under, so 7 and "7" share one report
            reported = self._units_by_window.setdefault(start, set())
            if str(unit) in reported:
                self.repeated += 1
                continue
            reported.add(str(unit))
            bits = self.report_bits(str(unit), start, true_index)
            (report,) = self.randomizer.randomize(np.array([true_index]), bits).tolist()
            if self.randomizer.mechanism == "oue":  # the values whose bits came out 1
                report = [value for value, bit in zip(self.domain, report) if bit]
            else:
                report = self.domain[report]
            sent = {self.unit_field: unit, self.timestamp_field: ts, self.field: report, REPORT_TAG_FIELD: self.tag}
            self._forget_old_windows(event_ms)
            yield str(unit).encode(), orjson.dumps(sent), event_ms
        if summary:
            self._summary()

    def _forget_old_windows(self, sent_ms: int) -> None:
        """Bound memory to the windows still open at the worker, plus one.

        The worker closes a window once its record clock -- the newest record time of each partition, never
        ahead of the wall clock -- is ``allowed_lateness`` past the window's end, and rejects its later events
        as late. Here the newest event sent, capped by the wall clock, stands for that clock, and a window is
        forgotten one window size later still (slack for partitions behind the newest). Events of a forgotten
        window are not sent at all rather than sent again, so no unit ever has two reports in one window on the
        topic, whatever the worker's clock; what that drops, the worker would almost always reject as late.
        """
        self._newest_ms = sent_ms if self._newest_ms is None else max(self._newest_ms, sent_ms)
        clock = min(self._newest_ms, self.clock_ms())
        through = clock - self.window.allowed_lateness_ms - self.window.size_ms
        if self._closed_through_ms is not None and through <= self._closed_through_ms:
            return  # never moves back (the wall clock may), so a forgotten window stays forgotten
        self._closed_through_ms = through
        size = self.window.size_ms
        for start in [s for s in self._units_by_window if s + size <= through]:
            del self._units_by_window[start]

    def _summary(self) -> None:
        if self.unusable:
            print(f"{self.unusable} events without a string or integer {self.unit_field!r} or a parsable "
                  f"{self.timestamp_field!r} were not sent", file=sys.stderr)
        if self.dropped:
            print(f"{self.dropped} events with no {self.field!r} in the local_dp domain were not sent", file=sys.stderr)
        if self.repeated:
            print(f"{self.repeated} events were not sent: their unit had already reported in their window "
                  "(one report per unit per window)", file=sys.stderr)
        if self.late:
            print(f"{self.late} events were not sent: their window had closed (more than allowed_lateness + one "
                  "window behind the newest event sent)", file=sys.stderr)


def randomizer_of(query: QueryConfig) -> tuple[list[str | int], LocalRandomizer]:
    """A local_dp query's domain (``groups.public``, in order) and the randomizer its reports come from."""
    domain = [key[0] for key in query.public_group_keys() or ()]
    return domain, LocalRandomizer.build(query.local_dp.mechanism, query.local_dp.epsilon, len(domain))


def reports_for(query: QueryConfig, secret: bytes) -> LocalReports:
    """The reports of a query with ``local_dp``, drawn from the producer's ``secret``."""
    if query.local_dp is None:
        raise ValueError(f"query {query.name!r} has no local_dp: its events are sent as they are")
    domain, randomizer = randomizer_of(query)
    return LocalReports(query.local_dp.field, domain, randomizer, secret=secret, query=query.name,
                        unit_field=query.privacy_unit.field, timestamp_field=query.timestamp_field,
                        window=WindowSpec.of(query.window))
