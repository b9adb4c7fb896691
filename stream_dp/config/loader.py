"""Loading the query file with errors a person can act on."""

from __future__ import annotations

import difflib
import functools
import re
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, BeforeValidator, ValidationError

from stream_dp.config.durations import format_duration_ms, parse_duration_ms
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
            # pydantic names union branches by their class (e.g. "PublicGroups"); those are not fields. A
            # capitalised key the file holds ("Continual:") is one, and is named.
            if isinstance(item, str) and item[:1].isupper() and not (isinstance(node, dict) and item in node):
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


_LIMIT_WORDS = {"greater_than": "above", "greater_than_equal": "at least", "less_than": "below",
                "less_than_equal": "at most"}


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _models(annotation: Any) -> typing.Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for argument in typing.get_args(annotation):
        yield from _models(argument)


@functools.cache
def _duration_keys() -> frozenset[str]:
    """The keys of the query file written as durations (``size: 1m``), read into milliseconds."""
    keys: set[str] = set()
    seen: set[type[BaseModel]] = set()

    def walk(model: type[BaseModel]) -> None:
        if model in seen:
            return
        seen.add(model)
        for name, field in model.model_fields.items():
            if any(isinstance(m, BeforeValidator) and m.func is parse_duration_ms for m in field.metadata):
                keys.add(field.alias or name)
            for sub in _models(field.annotation):
                walk(sub)

    walk(PipelineConfig)
    return frozenset(keys)


def _ms(value: Any) -> str:
    return f"{value} ms ({format_duration_ms(value)})" if isinstance(value, int) and value >= 0 else _shown(value)


def _choice(error: dict[str, Any], key: str) -> str:
    """A value outside a list of names: the value, the names, and the nearest one."""
    expected = error.get("ctx", {}).get("expected", "")
    choices = re.findall(r"'([^']*)'", expected)
    given = error.get("input")
    if isinstance(given, str) and given.lower() in choices:
        return f"got {given!r}; names are lower-case: write {key}: {given.lower()}"
    line = f"got {_shown(given)}; choose one of {expected}"
    near = difflib.get_close_matches(given, choices, n=1) if isinstance(given, str) else []
    return line + (f" (did you mean {key}: {near[0]}?)" if near else "")


def _as_list(error: dict[str, Any], key: str) -> str:
    given = error["input"]
    if given.strip().startswith("[") and given.strip().endswith("]"):
        return f"write a YAML list, not a quoted string: {key}: {given.strip()}"
    return f"write a YAML list in brackets, e.g. {key}: [a, b]"


def _message(error: dict[str, Any]) -> str:
    kind = error["type"]
    msg = error["msg"].removeprefix("Value error, ")
    key = next((item for item in reversed(error["loc"]) if isinstance(item, str)), "")
    if kind == "extra_forbidden":
        return "unknown field; remove it or check its spelling against deploy/queries.example.yaml"
    if kind == "missing":
        return "is required; add it (see deploy/queries.example.yaml)"
    limit = next(iter(error.get("ctx", {}).values()), None)
    if kind in _RANGE_ERRORS and key in _duration_keys() and isinstance(limit, int):
        # the limit is in milliseconds, the value was written as "2m": state both in both units
        return (f"must be {_LIMIT_WORDS[kind]} {_ms(limit)}, got {_ms(error.get('input'))}; "
                "change it to a duration in that range")
    if kind in _RANGE_ERRORS:
        return f"{msg}, got {_shown(error.get('input'))}; change it to a value in that range"
    if kind in _SIZE_ERRORS:
        return f"{msg}; see deploy/queries.example.yaml for one that works"
    if kind in ("literal_error", "enum"):
        return _choice(error, key)
    if kind in ("tuple_type", "list_type") and isinstance(error.get("input"), str):
        return f"{msg}, got {_shown(error['input'])}; {_as_list(error, key)}"
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
