"""Configuration: the query file (namespaces, queries) and the environment settings."""

from stream_dp.config.durations import format_duration_ms, parse_duration_ms
from stream_dp.config.loader import ConfigError, load_config, parse_config
from stream_dp.config.namespaces import HorizonBudget, NamespaceConfig
from stream_dp.config.queries import (
    Aggregations,
    BoundsConfig,
    PipelineConfig,
    QueryConfig,
    WindowConfig,
)
from stream_dp.config.settings import Settings, settings_env_names

__all__ = [
    "Aggregations",
    "BoundsConfig",
    "ConfigError",
    "HorizonBudget",
    "NamespaceConfig",
    "PipelineConfig",
    "QueryConfig",
    "Settings",
    "WindowConfig",
    "format_duration_ms",
    "load_config",
    "parse_config",
    "parse_duration_ms",
    "settings_env_names",
]
