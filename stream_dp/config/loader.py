"""Loading the query file with errors a person can act on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from stream_dp.config.queries import PipelineConfig


class ConfigError(ValueError):
    """The query configuration is invalid; the message lists every problem, one per line."""


def _location(data: Any, loc: tuple[Any, ...]) -> str:
    """``queries[0] (pageviews).window.size`` from a pydantic error location."""
    parts: list[str] = []
    node = data
    for item in loc:
        if isinstance(item, int):
            label = f"[{item}]"
            if isinstance(node, list) and 0 <= item < len(node):
                node = node[item]
                if isinstance(node, dict) and isinstance(node.get("name"), str):
                    label += f" ({node['name']})"
            parts.append(label)
        else:
            # pydantic names union branches by their class (e.g. "PublicGroups"); those are not fields.
            if isinstance(item, str) and item[:1].isupper():
                continue
            parts.append(f".{item}" if parts else str(item))
            node = node.get(item) if isinstance(node, dict) else None
    return "".join(parts) or "(top level)"


def _message(error: dict[str, Any]) -> str:
    kind = error["type"]
    msg = error["msg"].removeprefix("Value error, ")
    if kind == "extra_forbidden":
        return "unknown field; remove it or check its spelling against deploy/queries.example.yaml"
    if kind == "missing":
        return "is required; add it (see deploy/queries.example.yaml)"
    return msg


def parse_config(data: Any, source: str = "<config>") -> PipelineConfig:
    """Validate already-parsed YAML/JSON data."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping with `namespaces:` and `queries:` at the top level")
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as exc:
        lines = []
        seen = set()
        for error in exc.errors():
            line = f"{source}: {_location(data, tuple(error['loc']))}: {_message(error)}"
            if line not in seen:
                seen.add(line)
                lines.append(line)
        raise ConfigError("\n".join(lines)) from None


def load_config(path: str | Path) -> PipelineConfig:
    """Read and validate a query configuration YAML file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the configuration file ({exc.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    return parse_config(data, str(path))
