"""Moved to :mod:`stream_dp.dp.histogram` (the quantiles release's input lives beside the release,
so ``dp`` never imports ``windows``). Import from there; this name goes once nothing uses it."""

from stream_dp.dp.histogram import MAX_BINS, HistogramSpec, SparseHistogram, add_histograms

__all__ = ["MAX_BINS", "HistogramSpec", "SparseHistogram", "add_histograms"]
