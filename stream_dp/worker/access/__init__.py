"""Who may do what: the Kafka ACLs and the Redis ACL rule of the worker, its producers and its analysts,
computed from the query file and the worker's settings (``kafka_plan``, ``redis_plan``), rendered as
``kafka-acls.sh`` commands, JSON and a Redis ACL line (``render``), and checked against what the broker
says the worker may do when it starts (``check``); ``audit``: the ACLs a broker holds beyond the plan
(``stream-dp acls --check``).

May import ``query`` (the worker's configuration error), ``kafka`` (the consumer groups the clients join, the
broker's answers) and ``store`` (the ledger's and period register's key prefixes), and
``stream_dp.config``/``budget``; must not import ``ingest``, ``release``,
``sandbox`` or ``process``.
"""
