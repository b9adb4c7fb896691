"""The partials topic, the one contract between the ingest and release stages: its wire format
(``wire``: partials, chunks, progress markers) and each window's home partition (``homes``).

Pure encode/decode and arithmetic, no I/O. May import ``stream_dp.wire``, ``stream_dp.windows`` and
``stream_dp.dp`` (the histograms); must not import any other worker package.
"""
