"""``EventProducer``: an application's events to a query's input topic, checked, keyed and placed as the
worker expects, and randomized at the source for a local-DP query."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from stream_dp.config import QueryConfig, Settings
from stream_dp.producer.events import EventChecker
from stream_dp.producer.local_reports import LocalReports, local_dp_secret, reports_for
from stream_dp.producer.topic import KeyedSender

SEND_TIMEOUT_S = 30.0


class EventProducer:
    """Publishes events of one query: ``send`` checks every event first and sends nothing if one is wrong.

    Each event is a dict with the fields the query reads; it goes out as JSON keyed by its privacy unit's id
    (UTF-8), placed by the query's ``partitioner``, never on an explicit partition, as the worker checks. For
    a query with ``local_dp``, each event's true value never leaves: at most one randomized report per unit
    and window is sent in its place (``stream_dp.producer.local_reports``), drawn from ``local_dp_secret``
    (16+ bytes kept by the producer; default: ``STREAM_DP_LOCAL_DP_SECRET``). ``topic`` defaults to the
    query's ``input_topic``; ``settings`` (default: the environment's) give the broker and its credentials.

    >>> import time
    >>> from stream_dp.config import Settings, load_config
    >>> from stream_dp.producer import EventProducer
    >>> query = load_config("deploy/queries.example.yaml").query("pageviews_by_page")
    >>> producer = EventProducer(query, Settings())
    >>> producer.ensure_topics()  # the input topic, with LogAppendTime, if it is missing
    >>> now = time.time()
    >>> producer.send([{"user_id": "u1", "ts": now, "page": "/pricing", "value": 12.5},
    ...                {"user_id": 42, "ts": now, "page": "/docs", "value": 3}])
    2
    >>> producer.send([{"user_id": "u2", "ts": now, "page": "/", "value": 1.0},
    ...                {"ts": now, "page": "/docs", "value": 3}])  # nothing is sent
    Traceback (most recent call last):
        ...
    stream_dp.producer.events.EventError: event 1 would be rejected by query 'pageviews_by_page' (missing_field: field 'user_id' is missing); query 'pageviews_by_page' reads the fields 'user_id', 'ts', 'page', 'value': give the event each of them
    >>> producer.send([{"user_id": "u3", "ts": now, "page": "/", "value": "12"}])
    Traceback (most recent call last):
        ...
    stream_dp.producer.events.EventError: event 0 would be rejected by query 'pageviews_by_page' (wrong_type: field 'value' must be a number, got a string); send the privacy unit 'user_id' and group fields as strings or integers, the values as numbers, and 'ts' as the query's timestamp_format (auto) says
    >>> producer.close()
    """

    def __init__(self, query: QueryConfig, settings: Settings | None = None, *, topic: str | None = None,
                 local_dp_secret: bytes | None = None, clock_ms: Any = None) -> None:
        self.query = query
        self.topic = topic or query.input_topic
        settings = settings if settings is not None else Settings()
        self._bootstrap = settings.kafka_bootstrap_servers
        self._checker = EventChecker(query, clock_ms=clock_ms)
        self._local: LocalReports | None = None
        if query.local_dp is not None:
            secret = local_dp_secret if local_dp_secret is not None else _secret_from_environment()
            self._local = reports_for(query, secret)
            if clock_ms is not None:
                self._local.clock_ms = clock_ms
        self._sender = KeyedSender(settings, self.topic, query.partitioner)

    def ensure_topics(self) -> None:
        """Create the input topic if it is missing, as the worker would (``LogAppendTime``: the broker's clock
        closes the windows; min(3, brokers) replicas, one fewer in sync, unless the settings say otherwise); raise
        ``ValueError`` naming the fix if an existing one would be refused."""
        from stream_dp.worker.kafka.input_clock import timestamp_type_problem

        _created, configs = self._sender.ensure_topic()
        problem = timestamp_type_problem(self.topic, configs, [self.query], bootstrap=self._bootstrap)
        if problem is not None and problem.fatal:
            raise ValueError(problem.text)

    def check(self, events: Iterable[Any]) -> list[tuple[bytes, bytes, int]]:
        """(key, JSON value, event time in ms) of every event, or ``EventError`` for the first wrong one."""
        return self._checker.encode_all(events)

    def send(self, events: Iterable[Any]) -> int:
        """Check every event, then send them (a local-DP query: their reports) and wait until the broker has
        them all; the number of records sent. An ``EventError`` means none was sent."""
        records: Iterable[tuple[bytes, bytes, int]] = self.check(events)
        if self._local is not None:
            records = self._local.apply(iter(records), summary=False)
        futures = [self._sender.send(key, value, event_ms) for key, value, event_ms in records]
        self._sender.flush(SEND_TIMEOUT_S)
        for future in futures:
            future.get(timeout=SEND_TIMEOUT_S)  # raises the broker's error, if any
        return len(futures)

    def close(self) -> None:
        self._sender.close()

    def __enter__(self) -> EventProducer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _secret_from_environment() -> bytes:
    try:
        return local_dp_secret(None)
    except ValueError as exc:
        raise ValueError(f"{exc} (for EventProducer: pass local_dp_secret=the key file's bytes)") from None
