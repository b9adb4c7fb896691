"""Whose clock stamps each input topic's records, checked when the worker starts. Pure logic, no I/O.

Windows close by their partitions' record clocks (``stream_dp.windows.record_clock``): the broker's
``LogAppendTime`` stamps, and producers' ``CreateTime`` stamps only where a query trusts them
(``trust_producer_timestamps``). That rule holds record by record, since Kafka says per record batch
who stamped it. This is the early, clear part: a ``CreateTime`` input topic that no query trusts
would have no clock at all (its records close nothing, and its windows close only once it falls
silent), so the worker refuses it at start, naming the fix. A missing input topic is created as
users are told to create theirs: with ``message.timestamp.type=LogAppendTime``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from stream_dp.windows.record_clock import PRODUCER_QUORUM
from stream_dp.worker.kafka.topics import Problem, fix_command

TIMESTAMP_TYPE = "message.timestamp.type"
LOG_APPEND_TIME = "LogAppendTime"
CREATE_TIME = "CreateTime"
#: How the worker (and ``stream-dp produce``) creates an input topic that does not exist yet.
INPUT_TOPIC_CONFIGS = {TIMESTAMP_TYPE: LOG_APPEND_TIME}
DOCS = "docs/privacy/clock.md"


def input_topics(queries: Iterable[Any]) -> dict[str, list[Any]]:
    """Each input topic and the queries (``QueryConfig``) reading it; they agree on
    ``trust_producer_timestamps`` (``stream_dp.config.shared_topics``)."""
    out: dict[str, list[Any]] = {}
    for query in queries:
        out.setdefault(query.input_topic, []).append(query)
    return out


def clock_summary(query: Any) -> str:
    """What closes ``query``'s windows and what the worker checks at start (``check-config``, ``plan``)."""
    if query.trust_producer_timestamps:
        return (f"window clock: the producers' record timestamps of {query.input_topic} (trust_producer_timestamps: "
                f"true): a time counts once records of {PRODUCER_QUORUM} distinct keys are stamped at it or later, "
                f"none stamped 0 or less; the broker's stamps where it sets them ({DOCS})")
    return (f"window clock: the broker's record timestamps ({LOG_APPEND_TIME}) of {query.input_topic}; at start the "
            f"worker refuses the topic if its producers stamp it ({CREATE_TIME}), and creates it with "
            f"{TIMESTAMP_TYPE}={LOG_APPEND_TIME} if it does not exist")


def timestamp_type_problem(topic: str, configs: dict[str, str], queries: list[Any], *, bootstrap: str) -> Problem | None:
    """What is wrong with an existing input topic's ``message.timestamp.type`` for ``queries`` (which read it),
    with its fix; None when nothing is."""
    kind = configs.get(TIMESTAMP_TYPE)
    trusted = any(q.trust_producer_timestamps for q in queries)
    names = ", ".join(repr(q.name) for q in queries)
    if kind is None:
        return Problem(
            f"the broker did not report {TIMESTAMP_TYPE} of input topic {topic!r}, so the worker cannot tell who "
            f"stamps its records; records its producers stamped close no window of {names}"
            + ("" if trusted else " (grant the worker's Kafka user DescribeConfigs on the topic)")
        )
    if kind == CREATE_TIME and not trusted:
        return Problem(
            f"input topic {topic!r} has {TIMESTAMP_TYPE}={CREATE_TIME}: its producers stamp its records, so their "
            f"timestamps cannot close the windows of {names} (a record stamped 0 or an hour ahead would close them "
            f"early, and every later event would be late), and the topic would have no window clock; fix it with "
            f"{fix_command(bootstrap, topic, INPUT_TOPIC_CONFIGS)} (records already in it keep their producers' "
            f"stamps and close no window), or, only for a backfill whose producers stamp each record with its "
            f"event's time, set trust_producer_timestamps: true on {names} (see {DOCS})",
            fatal=True,
        )
    if kind not in (CREATE_TIME, LOG_APPEND_TIME):
        return Problem(f"input topic {topic!r} has {TIMESTAMP_TYPE}={kind!r}, which the worker does not know; "
                       f"fix it with {fix_command(bootstrap, topic, INPUT_TOPIC_CONFIGS)}", fatal=True)
    return None
