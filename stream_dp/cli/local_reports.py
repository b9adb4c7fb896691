"""``stream-dp produce --local-dp FIELD``: which query's randomizer the reports come from, checked against the
topic they go to (the reports themselves: ``stream_dp.producer.local_reports``)."""

from __future__ import annotations

import argparse
from typing import Any

from stream_dp.config import QueryConfig, load_config
from stream_dp.dp.local import report_tag
from stream_dp.producer.local_reports import LocalReports, local_dp_secret, randomizer_of, reports_for

__all__ = ["LocalReports", "chosen_query", "local_dp_secret", "local_reports"]


def chosen_query(args: argparse.Namespace, config: Any = None) -> QueryConfig:
    """The --query of --config (its first query without --query); a ``ValueError`` naming the queries if
    there is no such query. ``config``: the loaded --config, if it is at hand."""
    config = load_config(args.config) if config is None else config
    if not args.query:
        return config.queries[0]
    try:
        return config.query(args.query)
    except KeyError:
        raise ValueError(f"{args.config}: no query named {args.query!r}; --query takes one of: "
                         f"{', '.join(q.name for q in config.queries)}") from None


def _local_queries_on(topic: str | None, config: Any) -> list[QueryConfig]:
    return [q for q in config.queries if q.local_dp is not None and q.input_topic == topic]


def _check_topic_takes(topic: str | None, tag: str, name: str, config: Any) -> None:
    """Refuse reports for a topic that feeds a local_dp query of other settings: its worker would
    reject every one of them (randomizer_mismatch)."""
    for other in _local_queries_on(topic, config):
        domain, randomizer = randomizer_of(other)
        theirs = report_tag(randomizer, domain)
        if theirs != tag:
            raise ValueError(f"--topic {topic!r} feeds query {other.name!r}, whose local_dp takes reports tagged "
                             f"{theirs!r}, not query {name!r}'s {tag!r}: its worker would reject them all; "
                             f"use --query {other.name}, or --topic {{query {name!r}'s input_topic}}")


def local_reports(args: argparse.Namespace) -> LocalReports | None:
    """The --local-dp reports, or None.

    Without --local-dp, refuses a --query with local_dp and a --topic that is a local_dp query's input topic:
    either would send true values where randomized reports are expected.
    """
    if not args.config:
        if args.local_dp:
            raise ValueError("--local-dp needs --config and --query naming a query with local_dp on that field")
        return None
    config = load_config(args.config)
    # without --query no one query is chosen: the topic check below covers every query reading --topic
    query = chosen_query(args, config) if args.query else None
    if not args.local_dp:
        if query is not None and query.local_dp is not None:
            raise ValueError(f"query {query.name!r} has local_dp on {query.local_dp.field!r}: its producers must "
                             f"randomize that field, and without --local-dp every event's true value would be sent; "
                             f"add --local-dp {query.local_dp.field}")
        # --query may name another query, or be left out, while the topic feeds a local_dp one
        topic = getattr(args, "topic", None)
        for other in _local_queries_on(topic, config):
            raise ValueError(f"--topic {topic!r} is the input_topic of query {other.name!r}, which has local_dp "
                             f"on {other.local_dp.field!r}: without --local-dp every event's true value would "
                             f"be sent there; add --query {other.name} --local-dp {other.local_dp.field}")
        return None
    if query is None:
        raise ValueError("--local-dp needs --query naming a query with local_dp on that field")
    if query.local_dp is not None and query.local_dp.field != args.local_dp:
        raise ValueError(f"query {args.query!r} has its local_dp on field {query.local_dp.field!r}, not "
                         f"{args.local_dp!r}; use --local-dp {query.local_dp.field}")
    if query.local_dp is None:
        raise ValueError(f"query {args.query!r} has no local_dp on field {args.local_dp!r}; add "
                         f"local_dp: {{field: {args.local_dp}, mechanism: krr, epsilon: 1.0}} to it")
    domain, randomizer = randomizer_of(query)
    _check_topic_takes(getattr(args, "topic", None), report_tag(randomizer, domain), query.name, config)
    secret = local_dp_secret(getattr(args, "local_dp_secret_file", None))
    return reports_for(query, secret)
