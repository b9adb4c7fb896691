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


_RANGE_ERRORS = frozenset({"greater_than", "greater_than_equal", "less_than", "less_than_equal"})
_SIZE_ERRORS = frozenset({"too_short", "too_long"})
# pydantic names the branches of a union by their type; an error of a scalar branch for a mapping or
# list is that branch not applying ("hierarchy.bool: Input should be a valid boolean" for a split),
# not something to fix.
_SCALAR_BRANCHES = frozenset({"bool", "int", "float", "str"})


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _message(error: dict[str, Any]) -> str:
    kind = error["type"]
    msg = error["msg"].removeprefix("Value error, ")
    if kind == "extra_forbidden":
        return "unknown field; remove it or check its spelling against deploy/queries.example.yaml"
    if kind == "missing":
        return "is required; add it (see deploy/queries.example.yaml)"
    if kind in _RANGE_ERRORS:
        return f"{msg}, got {_shown(error.get('input'))}; change it to a value in that range"
    if kind in _SIZE_ERRORS:
        return f"{msg}; see deploy/queries.example.yaml for one that works"
    if kind.endswith(("_type", "_parsing")):
        return f"{msg}, got {_shown(error.get('input'))}"
    return msg


def _not_a_branch_that_applies(error: dict[str, Any]) -> bool:
    return (isinstance(error.get("input"), (dict, list))
            and any(isinstance(item, str) and item in _SCALAR_BRANCHES for item in error["loc"]))


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
            if _not_a_branch_that_applies(error):
                continue
            line = f"{source}: {_location(data, tuple(error['loc']))}: {_message(error)}"
            if line not in seen:
                seen.add(line)
                lines.append(line)
        if not lines:  # every error was a union branch's: show them rather than nothing
            lines = [f"{source}: {_location(data, tuple(e['loc']))}: {_message(e)}" for e in exc.errors()]
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
