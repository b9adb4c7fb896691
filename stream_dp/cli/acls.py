"""``stream-dp acls --config FILE``: the Kafka ACLs and the Redis ACL rule of the worker, its producers and its
analysts, printed as ``kafka-acls.sh`` commands and a Redis ACL line (or JSON), or applied (``--apply``).

The topics and groups come from the query file and the worker's settings (``STREAM_DP_GROUP_ID``,
``STREAM_DP_INTERNAL_TOPIC_PREFIX``...), read from the environment as a worker reads them. ``--apply`` creates
the Kafka ACLs through the admin API as the principal the KAFKA_* settings name (a super user, or one allowed
to Alter the cluster); the Redis rule is for the operator to set (``redis-cli ACL SETUSER``, or the aclfile).
``--check`` lists, as such an admin, the ACLs on the plan's topics and groups beyond the plan
(``worker.access.audit``). A query topic with a second role (``config.topic_roles``), a group id of its own on
the default internal topic prefix, or a wildcard or malformed principal is refused before anything is printed.
"""

from __future__ import annotations

import argparse
import json
import sys

from stream_dp.config import ConfigError, load_config

DEFAULT_WORKER = "User:stream-dp"
DEFAULT_PRODUCER = "User:stream-dp-producer"
DEFAULT_ANALYST = "User:stream-dp-analyst"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "acls",
        help="print (or apply) the Kafka and Redis ACLs of the worker, producers and analysts",
        description="Print the Kafka ACLs (kafka-acls.sh commands, or JSON) of three principals -- the worker, the "
        "producers of the input topics and the analysts reading the output topics -- and the Redis ACL rule of the "
        "worker's user, from a query file and the worker's settings (environment). --apply creates the Kafka ACLs "
        "as the admin the KAFKA_* settings name.",
    )
    parser.add_argument("--config", required=True, metavar="FILE", help="query configuration YAML")
    parser.add_argument("--worker-principal", default=DEFAULT_WORKER, help=f"the worker's (default {DEFAULT_WORKER})")
    parser.add_argument("--producer-principal", action="append", default=[], metavar="[TOPIC=]PRINCIPAL",
                        help=f"the producers' (default {DEFAULT_PRODUCER}); TOPIC=User:NAME for one input topic's; "
                        "repeat for several")
    parser.add_argument("--analyst-principal", default=DEFAULT_ANALYST, help=f"the analysts' (default {DEFAULT_ANALYST})")
    parser.add_argument("--analyst-group-prefix", default=None, metavar="PREFIX",
                        help="the analysts' consumer groups start with it (default: analyst-)")
    parser.add_argument("--redis-user", default="stream-dp", help="the worker's Redis user (default stream-dp)")
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    parser.add_argument("--apply", action="store_true",
                        help="create the Kafka ACLs through the admin API, connecting with the KAFKA_* settings")
    parser.add_argument("--check", action="store_true",
                        help="list the ACLs on the worker's topics and groups beyond the plan, with the "
                        "kafka-acls.sh --remove commands that drop them (as an admin, like --apply); exit 1 when "
                        "one lets a principal other than the worker read or write input, partials, alerts or "
                        "dead-letter records")
    parser.add_argument("--custom-principal-types", action="store_true",
                        help="accept principal types other than User (brokers with a custom principal builder)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from stream_dp.config import Settings
    from stream_dp.config.topic_roles import deployment_problem
    from stream_dp.budget.redis_url import is_cluster_url
    from stream_dp.worker.access.kafka_plan import (
        DEFAULT_ANALYST_GROUP_PREFIX,
        AclPlanError,
        Principals,
        kafka_acls,
        producer_principals,
    )
    from stream_dp.worker.access.redis_plan import worker_redis_rule
    from stream_dp.worker.access.render import plan_json, plan_text

    try:
        if args.apply and args.check:
            raise ValueError("--apply and --check: run one, then the other")
        config = load_config(args.config)
        settings = Settings()
        shared = deployment_problem(settings.group_id, settings.internal_topic_prefix)
        if shared:
            raise AclPlanError(shared)
        inputs = sorted({q.input_topic for q in config.queries})
        custom = args.custom_principal_types
        principals = Principals(args.worker_principal, args.analyst_principal,
                                producer_principals(inputs, args.producer_principal, DEFAULT_PRODUCER, custom_types=custom))
        acls = kafka_acls(config, settings, principals, custom_types=custom,
                          analyst_group_prefix=args.analyst_group_prefix or DEFAULT_ANALYST_GROUP_PREFIX)
        rule = worker_redis_rule(args.redis_user, cluster=is_cluster_url(settings.redis_url.get_secret_value()))
    except (ConfigError, AclPlanError, ValueError) as exc:
        print(exc, file=sys.stderr)
        return 1
    except ValidationError as exc:
        print(f"invalid environment settings:\n{exc}", file=sys.stderr)
        return 1
    if args.check:
        return _check(acls, config, settings, args.worker_principal)
    if args.json:
        print(json.dumps(plan_json(acls, rule), indent=2))
    else:
        sys.stdout.write(plan_text(acls, rule, settings.kafka_bootstrap_servers))
    if not args.apply:
        return 0
    return _apply(acls, settings)


def _apply(acls: list, settings) -> int:
    from kafka.errors import KafkaError

    from stream_dp.worker.kafka.acl_admin import create_acls

    bindings = [(a.principal, a.resource_type, a.resource_name, a.pattern_type, a.operation) for a in acls]
    try:
        refused = create_acls(settings.kafka_client_options(), bindings)
    except KafkaError as exc:
        print(f"could not create the ACLs on {settings.kafka_bootstrap_servers}: {type(exc).__name__}: {exc}; "
              "connect as an admin (KAFKA_SASL_USERNAME/PASSWORD of a super user, or one allowed to Alter the "
              "cluster) on a broker with an authorizer", file=sys.stderr)
        return 1
    if refused:
        hint = (" (SecurityDisabledError: the broker has no authorizer, authorizer.class.name)"
                if any("SecurityDisabled" in r for r in refused) else "")
        print(f"the broker refused {len(refused)} of {len(bindings)} ACLs{hint}:\n  " + "\n  ".join(refused[:10])
              + ("\n  ..." if len(refused) > 10 else ""), file=sys.stderr)
        return 1
    print(f"created {len(bindings)} ACLs on {settings.kafka_bootstrap_servers} (existing ones are kept)", file=sys.stderr)
    return 0


def _check(acls: list, config, settings, worker: str) -> int:
    from kafka.errors import KafkaError

    from stream_dp.worker.access.audit import Binding, audit, report
    from stream_dp.worker.access.kafka_plan import GROUP, TOPIC, worker_groups, worker_topics
    from stream_dp.worker.kafka.acl_admin import describe_acls

    try:
        existing = [Binding(*row) for row in describe_acls(settings.kafka_client_options())]
    except KafkaError as exc:
        print(f"could not list the ACLs on {settings.kafka_bootstrap_servers}: {type(exc).__name__}: {exc}; connect "
              "as an admin (KAFKA_SASL_USERNAME/PASSWORD of a super user, or one allowed to Describe the cluster) on a "
              "broker with an authorizer", file=sys.stderr)
        return 1
    roles = {**{(TOPIC, t): r for t, r in worker_topics(config, settings).items()},
             **{(GROUP, g): ["worker group"] for g in worker_groups(settings)}}
    findings = audit(existing, acls, roles, worker=worker)
    sys.stdout.write(report(findings, settings.kafka_bootstrap_servers))
    fatal = [f for f in findings if f.fatal]
    if fatal:
        print(f"{len(fatal)} ACL(s) let a principal other than the worker read or write records as sensitive as the "
              "raw events; run the --remove commands printed above (after checking who holds them)", file=sys.stderr)
        return 1
    return 0
