"""Running a sample-and-aggregate query's user function away from the worker: one process per query
(``runner``), a new interpreter started as ``python -m stream_dp.worker.sandbox.child``.

May import ``guard`` (the process and network guards the child applies); must not import ``store``,
``ingest`` or ``release``: the child holds none of the worker's objects, connections or secrets.
"""
