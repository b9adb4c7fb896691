"""Hypothesis strategies for hostile input messages, each with the reasons it may be rejected for.

``garbage(now_ms, base_ms)`` yields ``(message, reasons)``: a message that
is invalid by construction and the set of reject reasons that describe it
(``None``: any reason but ``late``). ``edge_cases(base_ms)`` yields messages
that look odd but are valid events and must be accepted. ``collect`` draws a
fixed, reproducible list from a strategy outside a test (for the large
worker runs).
"""

from __future__ import annotations

import json
import warnings
import orjson
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

UNIT, TS, PAGE, VALUE = "user_id", "ts", "page", "value"
MAX_MESSAGE_BYTES = 65_536  # the query default

Fuzzed = tuple[bytes, frozenset[str] | None]


def _dumps(value: object) -> bytes:
    """JSON bytes; integers beyond 64 bits (which orjson refuses) through the standard library."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


def _event(unit: object, ts: object, page: object = "home", value: object = 1.0) -> dict:
    return {UNIT: unit, TS: ts, PAGE: page, VALUE: value}


def _raw(unit: str, ts: str, page: str = '"home"', value: str = "1.0") -> bytes:
    """An event written as JSON text, so that tokens orjson would never write (NaN, 1e999) can appear."""
    return f'{{"{UNIT}": {unit}, "{TS}": {ts}, "{PAGE}": {page}, "{VALUE}": {value}}}'.encode()


def _reasons(*names: str) -> frozenset[str]:
    return frozenset(names)


def garbage(now_ms: int, base_ms: int, *, oversize: bool = True) -> st.SearchStrategy[Fuzzed]:
    ts = st.integers(base_ms, base_ms + 5_000)
    unit = st.text(alphabet="abcdef0123456789", min_size=1, max_size=12).map(lambda s: f"fz-{s}")
    int64 = st.integers(-(2**63), 2**63 - 1)
    wrong_value = st.one_of(st.lists(int64, max_size=3), st.dictionaries(st.text(max_size=3), int64, max_size=2),
                            st.booleans())
    field = st.sampled_from([UNIT, TS, PAGE, VALUE])

    def with_field(f: str, value: object, t: int, u: str) -> bytes:
        event = _event(u, t)
        event[f] = value
        return _dumps(event)

    strategies: list[st.SearchStrategy[Fuzzed]] = [
        # random bytes, and random bytes inside an event-looking prefix
        st.binary(max_size=300).map(lambda b: (b, None)),
        st.binary(max_size=60).map(lambda b: (b'{"user_id": "' + b, None)),
        # truncated events
        st.builds(lambda u, t, cut: (_dumps(_event(u, t))[:cut], None), unit, ts, st.integers(0, 40)),
        # deep nesting: as the whole message, and inside a field
        st.integers(64, 5_000).map(lambda d: (b"[" * d + b"]" * d, _reasons("invalid_json", "wrong_type"))),
        st.builds(lambda d, t: (f'{{"{UNIT}": {"[" * d}{"]" * d}, "{TS}": {t}, "{PAGE}": "home", "{VALUE}": 1}}'.encode(),
                                _reasons("invalid_json", "wrong_type")), st.integers(64, 3_000), ts),
        # wrong JSON types in a required field, and null
        st.builds(lambda f, v, t, u: (with_field(f, v, t, u), _reasons("wrong_type", "bad_timestamp")),
                  field, wrong_value, ts, unit),
        st.builds(lambda f, t, u: (with_field(f, None, t, u), _reasons("null_field")), field, ts, unit),
        st.builds(lambda v, t: (_dumps(_event(v, t)), _reasons("wrong_type")),
                  st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: x != int(x)), ts),
        st.builds(lambda v, t, u: (_dumps(_event(u, t, value=v)), _reasons("wrong_type")),
                  st.text(max_size=10), ts, unit),
        st.builds(lambda v, t, u: (_dumps(_event(u, t, page=v)), _reasons("wrong_type")),
                  st.floats(allow_nan=False, allow_infinity=False).filter(lambda x: x != int(x)), ts, unit),
        # not an object at all
        st.one_of(st.integers(), st.text(max_size=20), st.lists(st.integers(), max_size=5), st.booleans(),
                  st.none()).map(lambda v: (json.dumps(v).encode(), _reasons("wrong_type", "invalid_json"))),
        # NaN and infinities, as JSON tokens and as overflowing numbers
        st.builds(lambda tok, t, u: (_raw(f'"{u}"', str(t), value=tok), _reasons("invalid_json", "non_finite")),
                  st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1e999", "nan"]), ts, unit),
        st.builds(lambda tok, u: (_raw(f'"{u}"', tok), _reasons("invalid_json", "non_finite", "bad_timestamp")),
                  st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400"]), unit),
        st.builds(lambda v, t, u: (_dumps(_event(u, t, value=v)), _reasons("value_out_of_range")),
                  st.floats(min_value=1.5e15, max_value=1e300) | st.floats(min_value=-1e300, max_value=-1.5e15), ts, unit),
        # missing fields (one or all)
        st.builds(lambda f, t, u: (_dumps({k: v for k, v in _event(u, t).items() if k != f}),
                                   _reasons("missing_field")), field, ts, unit),
        st.just((b"{}", _reasons("missing_field"))),
        # unit ids that are not allowed: empty, NUL, too long, lone surrogates, invalid UTF-8
        st.builds(lambda t: (_dumps(_event("", t)), _reasons("empty_unit")), ts),
        st.builds(lambda s, t: (_dumps(_event(f"a\x00{s}", t)), _reasons("bad_unit")), st.text(max_size=5), ts),
        st.builds(lambda n, t: (_dumps(_event("u" * n, t)), _reasons("bad_unit")), st.integers(257, 2_000), ts),
        st.builds(lambda s, t: (_raw(f'"{s}"', str(t)), _reasons("invalid_json")),
                  st.sampled_from(["\\ud800", "\\udfff", "x\\ud83d", "\\udc00\\ud800"]), ts),
        st.builds(lambda b, t: (b'{"user_id": "u' + b + b'", "ts": ' + str(t).encode() + b', "page": "home", "value": 1}',
                                _reasons("invalid_utf8", "invalid_json")),
                  st.sampled_from([b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80"]), ts),
        # extreme and malformed timestamps
        st.builds(lambda t, u: (_dumps(_event(u, t)), _reasons("bad_timestamp")),
                  st.integers(max_value=-1) | st.integers(min_value=253_402_300_800_000, max_value=2**63 - 1), unit),
        st.builds(lambda t, u: (_raw(f'"{u}"', str(t)), _reasons("bad_timestamp", "wrong_type")),
                  st.integers(min_value=2**63, max_value=2**70), unit),
        st.builds(lambda d, u: (_dumps(_event(u, now_ms + d)), _reasons("future_timestamp")),
                  st.integers(3_600_000, 10**10), unit),
        st.builds(lambda s, u: (_dumps(_event(u, s)), _reasons("bad_timestamp")),
                  st.sampled_from(["", "yesterday", "2024-01-01", "2024-01-01T00:00:00", "2024-13-45T00:00:00Z",
                                   "10000-01-01T00:00:00Z", "2024-01-01T00:00:00+25:00", "\u0662\u0660\u0662\u0664"]), unit),
    ]
    if oversize:
        strategies.append(oversized(base_ms))
    return st.one_of(strategies)


def oversized(base_ms: int) -> st.SearchStrategy[Fuzzed]:
    """Otherwise valid events just over the query's ``max_message_bytes``."""
    return st.builds(
        lambda n, t: (_dumps({**_event("fz-big", t), "pad": "x" * n}), _reasons("oversize")),
        st.integers(MAX_MESSAGE_BYTES, MAX_MESSAGE_BYTES + 4_000), st.integers(base_ms, base_ms + 5_000),
    )


def edge_cases(base_ms: int) -> st.SearchStrategy[bytes]:
    """Odd but valid events: each must be accepted."""
    ts = st.integers(base_ms, base_ms + 5_000)
    odd_unit = st.one_of(
        st.sampled_from(["\U0001f600", "\u202eevil", "e\u0301", "a\u200db", "\ufeffbom",
                         "\U0010ffff", "spaces in id", "quote\"d", "back\\slash", "tab\there"]),
        st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=256),
        st.integers(-(2**63), 2**63 - 1),
    )
    return st.one_of(
        st.builds(lambda u, t: _dumps(_event(u, t)), odd_unit, ts),
        # duplicate keys (the last one wins), escaped key names, extra fields
        st.builds(lambda u, t: _raw(f'"x", "{UNIT}": "{u}"', str(t)), st.sampled_from(["dup-a", "dup-b"]), ts),
        st.builds(lambda t: f'{{"user\\u005fid": "escaped", "ts": {t}, "page": "home", "value": 2}}'.encode(), ts),
        st.builds(lambda t, extra: _dumps({**_event("extra", t), **extra}), ts,
                  st.dictionaries(st.text(min_size=1, max_size=5).filter(lambda k: k not in (UNIT, TS, PAGE, VALUE)),
                                  st.integers() | st.text(max_size=5) | st.none(), max_size=4)),
        # other time formats, and values at and beyond the clip range (clipped, not rejected)
        st.builds(lambda t: _dumps(_event("iso", _iso(t))), ts),
        st.builds(lambda t: _dumps(_event("secs", t / 1000)), ts),
        st.builds(lambda v, t: _dumps(_event("clip", t, value=v)), st.floats(-1e15, 1e15), ts),
        st.builds(lambda t: _dumps(_event("zero", t, value=-0.0)), ts),
    )


def _iso(ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")


def collect(strategy: st.SearchStrategy, n: int, *, seed: int = 0, chunk: int = 100) -> list:
    """``n`` examples of ``strategy``, the same for the same seed (Hypothesis drawing outside a test)."""
    out: list = []

    @hypothesis_seed(seed)
    @settings(max_examples=max(1, -(-n // chunk)), database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(st.lists(strategy, min_size=chunk, max_size=chunk))
    def draw(items: list) -> None:
        out.extend(items)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        draw()
    return out[:n]
