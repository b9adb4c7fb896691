"""Loading the query file with errors a person can act on."""

from __future__ import annotations

import difflib
import functools
import re
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, BeforeValidator, Tag, ValidationError
from pydantic.fields import FieldInfo

from stream_dp.config.durations import format_duration_ms, parse_duration_ms
from stream_dp.config.examples import as_yaml, block_example, field_example, option_model
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
    given = error["input"].strip()
    if given.startswith("[") and given.endswith("]"):
        return f"write a YAML list, not a quoted string: {key}: {given}"
    if given and all(part.strip() for part in given.split(",")):  # `page` or `a, b`: its items in brackets
        return f"write a YAML list in brackets, e.g. {key}: [{', '.join(p.strip() for p in given.split(','))}]"
    return f"write a YAML list in brackets, e.g. {key}: [a, b]"


def _branch_name(annotation: Any) -> str | None:
    """A union branch's name in an error location: its tag, else its class's name."""
    if typing.get_origin(annotation) is typing.Annotated:
        tag = next((m.tag for m in annotation.__metadata__ if isinstance(m, Tag)), None)
        return tag or _branch_name(typing.get_args(annotation)[0])
    return getattr(annotation, "__name__", None)


def _below(annotation: Any, item: Any) -> tuple[Any, FieldInfo | None] | None:
    """The type one step of an error location below ``annotation`` (a field, an item, a union branch)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _below(args[0], item)
    if origin in (typing.Union, types.UnionType):
        branches = [arg for arg in args if arg is not type(None)]
        named = [arg for arg in branches if _branch_name(arg) == item]
        if named:
            return named[0], None
        found = [step for arg in branches if (step := _below(arg, item)) is not None]
        return found[0] if found else None
    if origin in (list, tuple) and isinstance(item, int):
        return (args[min(item, len(args) - 1)] if origin is tuple and args and args[-1] is not Ellipsis
                else args[0] if args else Any), None
    if origin is dict and args:
        return args[1], None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel) and isinstance(item, str):
        for name, field in annotation.model_fields.items():
            if item in (name, field.alias):
                return field.annotation, field
    return None


def _field_at(loc: tuple[Any, ...]) -> tuple[Any, FieldInfo | None]:
    """The type and field an error location points at (None for the field when it is not one)."""
    annotation: Any = PipelineConfig
    field: FieldInfo | None = None
    for item in loc:
        step = _below(annotation, item)
        if step is None:
            return None, None
        annotation, field = step
    return annotation, field


_KIND_WORDS = {"int": "an integer", "float": "a number", "bool": "true or false", "string": "a string"}


def _form(error: dict[str, Any], key: str) -> str | None:
    """How a value of the wrong type is written, from the model: a block's settings, a list, a number;
    None when the model says nothing more than the error."""
    kind, given = error["type"], error.get("input")
    annotation, field = _field_at(tuple(error["loc"]))
    example = field_example(field) if field is not None else None
    if kind in ("model_type", "model_attributes_type", "dict_type") and not isinstance(given, dict):
        model = option_model(annotation)
        settings = block_example(model) if model is not None else None
        shape = f"e.g. {key}: {settings}" if settings else "see deploy/queries.example.yaml"
        if isinstance(error["loc"][-1], int):  # an item of a list of blocks (queries, budgets)
            item = f"e.g. {settings}" if settings else "see deploy/queries.example.yaml"
            return f"each item of {key} is a mapping of settings, got {_shown(given)}; {item}"
        return f"{key} takes its settings as a mapping, got {_shown(given)}; write them under it, {shape}"
    if kind in ("list_type", "tuple_type") and not isinstance(given, str):
        fixed = typing.get_origin(annotation) is tuple and Ellipsis not in typing.get_args(annotation)
        wrapped = given if isinstance(given, (int, float, dict)) and not isinstance(given, bool) else None
        written = as_yaml(example) if fixed or wrapped is None else as_yaml([wrapped])
        shape = f", e.g. {key}: {written}" if written != "null" else ""
        return f"{key} is a list in brackets, got {_shown(given)}; write it as one{shape}"
    word = next((w for prefix, w in _KIND_WORDS.items() if kind.startswith(prefix + "_")), None)
    if word is None:
        return None
    shape = f"; write e.g. {key}: {as_yaml(example)}" if example is not None else ""
    return f"{key} must be {word}, got {_shown(given)}{shape}"


def _message(error: dict[str, Any]) -> str:
    kind = error["type"]
    msg = error["msg"].removeprefix("Value error, ")
    key = next((item for item in reversed(error["loc"]) if isinstance(item, str) and not item[:1].isupper()), "")
    if kind == "extra_forbidden":
        given = error["loc"][-1]
        near = _nearest(given, _settings_beside(tuple(error["loc"]))) if isinstance(given, str) else None
        if near is not None:
            return f"unknown field; did you mean {near}?"
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
        return f"{key} is a list, got {_shown(error['input'])}; {_as_list(error, key)}"
    form = _form(error, key) if key else None
    if form is not None:
        return form
    if kind.endswith(("_type", "_parsing")):
        return f"{msg}, got {_shown(error.get('input'))}"
    return msg


def _not_a_branch_that_applies(error: dict[str, Any]) -> bool:
    return (isinstance(error.get("input"), (dict, list))
            and any(isinstance(item, str) and item in _SCALAR_BRANCHES for item in error["loc"]))


def _misspellings(errors: list[dict[str, Any]]) -> dict[int, str]:
    """Unknown keys that are a required sibling's name misspelt (``dleta`` for ``delta``): the unknown
    key's error index -> the name meant; the sibling's "is required" is then that one mistake."""
    missing: dict[tuple[Any, ...], list[str]] = {}
    for error in errors:
        if error["type"] == "missing" and isinstance(error["loc"][-1], str):
            missing.setdefault(tuple(error["loc"][:-1]), []).append(error["loc"][-1])
    meant = {}
    for i, error in enumerate(errors):
        if error["type"] == "extra_forbidden" and isinstance(error["loc"][-1], str):
            near = _nearest(error["loc"][-1], missing.get(tuple(error["loc"][:-1]), []))
            if near:
                meant[i] = near
    return meant


def _nearest(key: str, names: list[str]) -> str | None:
    """The name ``key`` is nearest to, ignoring case (``K`` for ``k``), or None."""
    lowered = {name.lower(): name for name in names}
    near = difflib.get_close_matches(key.lower(), list(lowered), n=1)
    return lowered[near[0]] if near else None


def _settings_beside(loc: tuple[Any, ...]) -> list[str]:
    """The names of the settings of the block holding ``loc``'s last key."""
    model = option_model(_field_at(loc[:-1])[0])
    return [field.alias or name for name, field in model.model_fields.items()] if model is not None else []


_LOCAL_EPSILON = "left out, it is local_dp.epsilon, but local_dp is not valid (see its line): fix local_dp"


def _local_epsilon_missing(data: dict[str, Any], error: dict[str, Any]) -> bool:
    """A query's missing epsilon beside a local_dp block, which would have given it had it been valid
    (``stream_dp.config.implied``)."""
    loc = tuple(error["loc"])
    if error["type"] != "missing" or len(loc) != 3 or loc[0] != "queries" or loc[2] != "epsilon":
        return False
    queries = data.get("queries")
    query = queries[loc[1]] if isinstance(queries, list) and isinstance(loc[1], int) and loc[1] < len(queries) else None
    return isinstance(query, dict) and "local_dp" in query


def parse_config(data: Any, source: str = "<config>") -> PipelineConfig:
    """Validate already-parsed YAML/JSON data."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping with `namespaces:` and `queries:` at the top level")
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as exc:
        lines = []
        seen = set()
        errors = exc.errors()
        meant = _misspellings(errors)
        covered = {(*errors[i]["loc"][:-1], name) for i, name in meant.items()}
        for i, error in enumerate(errors):
            if _not_a_branch_that_applies(error) or (error["type"] == "missing" and tuple(error["loc"]) in covered):
                continue
            message = (f"unknown field; did you mean {meant[i]}? (required, see deploy/queries.example.yaml)"
                       if i in meant else _LOCAL_EPSILON if _local_epsilon_missing(data, error) else _message(error))
            for part in message.split("\n"):  # a check that finds several problems gives one line each
                line = f"{source}: {_location(data, tuple(error['loc']))}: {part}"
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
