"""From a loaded query file to worker objects, before anything connects (``runtimes``: the budget policy,
each query's window engine, combiner, plan, privacy statement and sandbox). ``stream-dp run`` and
``stream-dp check-config`` both build through it, so the checker accepts exactly what a worker can start with.

May import ``combine``, ``query``, ``kafka``, ``release`` and ``sandbox``; must not import ``ingest`` (it builds
what the stages run, not the stages) nor ``store``, ``guard`` or ``access`` (no connection here).
"""
