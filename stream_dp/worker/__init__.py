"""The worker: Kafka in, noisy per-window releases out, the privacy budget in Redis.

Owns: ``app`` (one worker process: builds every query's runtime with ``assemble``, connects Kafka, Redis and
the metrics endpoint, runs both stages) and ``supervisor`` (``stream-dp run --processes N``). Every other module
belongs to a package, one per stage or shared concern. A package may import only those before it:

    partials < combine < query < kafka < guard < store < access < ingest, release, sandbox, process < assemble < app

``ingest`` and ``release`` never import each other: they meet only on the partials topic
(``partials``) and in the stores (``store``). ``supervisor`` imports no worker package.
May import: every package of ``stream_dp`` but ``cli``. Nothing here runs at import time.
"""
