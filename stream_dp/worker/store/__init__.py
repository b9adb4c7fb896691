"""The worker's Redis state that both stages read and write, besides the budget (``stream_dp.budget``):
the release ledger, where a window's noisy values are kept before they are published and the ingest
stage journals its charges (``ledger``), and the period register of continual queries
(``period_register``).

May import ``guard`` and ``stream_dp.budget``; must not import ``ingest`` or ``release``.
"""
