"""One query at run time, built once from the configuration (``runtime``: its engine, combiner, release
plan and settings fingerprint), and what one of its windows costs a unit (``costs``: the privacy plan,
also used by ``stream-dp plan`` and ``check-config``).

No I/O. May import ``partials``, ``combine`` and ``stream_dp.windows``/``dp``/``config``; must
not import ``kafka``, ``guard``, ``store``, ``ingest`` or ``release``.
"""
