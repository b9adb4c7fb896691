"""Adding up a window's per-partition partials (``totals``, checked by ``checks``) and deciding when a
window is complete, overdue or unreleasable (``combiner``; the empty windows of public groups, in order per
home: ``empty_windows``).

Pure logic: no Kafka, no Redis, no clock of its own (the release stage passes the time in). May import
``partials`` and ``stream_dp.windows``/``dp``/``config``; must not import ``query``, ``kafka``, ``guard``,
``store``, ``ingest`` or ``release``.
"""
