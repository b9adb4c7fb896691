"""The release stage: partials in (``intake``) -> combine -> waits for late partitions (``waits``,
``partition_check``, ``partition_lag``) -> where publication starts (``publication_start``) -> draw the
noise once (``draw``, ``build``, ``continual``, ``hierarchy``) -> the ledger -> render (``entry``,
``ids``) -> publish (``publish``); ``partials_commits`` commits what it read, ``stage`` runs the loop.

May import ``partials``, ``combine``, ``query``, ``kafka``, ``guard`` and ``store``; must not import
``ingest`` (it hears from the ingest stage only through the partials topic) nor ``sandbox``.
"""
