"""stream-dp: streaming differential-privacy aggregation worker."""

__version__ = "0.1.0"
