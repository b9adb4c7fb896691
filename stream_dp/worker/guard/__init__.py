"""Guards that fail closed: a Redis that lost what it acknowledged is refused before anything is charged
or released (``store``); a sample-and-aggregate function's process loses its capabilities, its core
dumps (``process``) and its sockets (``network``).

May import ``kafka`` (the store marker committed with input offsets) and ``stream_dp.budget``; must not import ``store``,
``ingest``, ``release`` or ``sandbox``.
"""
