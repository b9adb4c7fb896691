"""Kafka for both stages: clients sized to the record limits (``clients``), the admin calls (``admin``; the
rights the broker reports and ACLs created: ``acl_admin``),
the worker's topics planned and set up at start (``topics``, ``topic_setup``), whose clock stamps the
input (``input_clock``), the columnar consumer (``columnar_consumer``, ``record_columns``), what is
committed beside an input offset (``commit_metadata``), where the consumer stands (``positions``) and the
pacing of commits and heartbeats (``spacing``).

May import ``partials``, ``query`` and ``stream_dp.wire``/``windows``/``config``; must not import
``guard``, ``store``, ``ingest``, ``release`` or ``sandbox``.
"""
