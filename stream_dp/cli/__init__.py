"""Command-line interface: ``stream-dp``."""
