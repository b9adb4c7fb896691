"""The ingest stage: input topics -> decode (``decode``) -> window engines -> charge (``charge``,
``period_charge``) -> partials out (``closed_windows``, ``partials_out``), progress markers
(``progress_out``), dead letters (``dead_letters``) and the input offsets it may commit (``commit_plan``);
``stage`` runs the loop.

May import ``partials``, ``query``, ``kafka``, ``guard`` and ``store``; must not import ``release`` or
``combine`` (it reaches the release stage only through the partials topic) nor ``sandbox``.
"""
