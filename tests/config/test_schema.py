"""The query file's JSON Schema (deploy/schemas/queries.schema.json) against the loader it describes.

The schema is generated from the models; what it must do is judged here against the real loader
(``parse_config``, what ``check-config`` runs first), case by case: files made from the example and the
accepted corpus by adding an unknown key to every block, removing every required setting, and giving
every setting of every block values of each JSON type. Where the loader refuses a file for a key or a
type (an unknown key, a missing setting, a value of the wrong type -- pydantic's own errors, or a refusal
of the setting itself when it was given a value of another JSON type than the file had, such as an empty
``top_k:`` for ``top_k: {k: 2}``), the schema must refuse it too; where
the loader accepts one, the schema must accept it, but for a bool given for a number, which pydantic
reads as 0 or 1 and an editor rightly flags. Refusals for a value (a range, a rule between settings) are
the loader's alone; the schema may or may not see them.
"""

from __future__ import annotations

import copy
import json
import types
import typing
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from pydantic import BaseModel, ValidationError

from stream_dp.config import ConfigError, PipelineConfig, parse_config
from stream_dp.config.schema import query_file_schema_text

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = ROOT / "deploy" / "schemas" / "queries.schema.json"
EXAMPLE = ROOT / "deploy" / "queries.example.yaml"
ACCEPTED_CORPUS = sorted(p for p in (ROOT / "tests" / "config" / "corpus").glob("*.yaml")
                         if "# expect: ok" in p.read_text().splitlines())
SCHEMA_LINE = "# yaml-language-server: $schema=./schemas/queries.schema.json"

# pydantic's error types for a key or a type: what the schema must refuse as well
KEY_AND_TYPE_ERRORS = {"missing", "extra_forbidden", "literal_error", "int_from_float", "union_tag_invalid",
                       "union_tag_not_found"}
# one value of each JSON type (and a float with a fraction, which no integer setting takes)
VALUES = [{"unknown": 1}, [1], "text", 12345, 1.5, True, None]


def _validator() -> jsonschema.Draft7Validator:
    return jsonschema.Draft7Validator(json.loads(SCHEMA_PATH.read_text()))


def test_the_committed_schema_is_the_one_the_models_generate():
    assert SCHEMA_PATH.read_text() == query_file_schema_text(), (
        "deploy/schemas/queries.schema.json is stale: regenerate it with "
        "`stream-dp schema > deploy/schemas/queries.schema.json`")


def test_the_schema_is_valid_draft_07():
    jsonschema.Draft7Validator.check_schema(json.loads(SCHEMA_PATH.read_text()))


def test_the_example_names_the_schema_for_editors_on_its_first_line():
    first = EXAMPLE.read_text().splitlines()[0]
    assert first == SCHEMA_LINE
    assert (EXAMPLE.parent / first.split("$schema=", 1)[1]).resolve() == SCHEMA_PATH


@pytest.mark.parametrize("path", [EXAMPLE, *ACCEPTED_CORPUS], ids=lambda path: path.stem)
def test_the_schema_accepts_the_example_and_every_file_check_config_accepts(path):
    document = yaml.safe_load(path.read_text())
    parse_config(document, str(path))
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in _validator().iter_errors(document)]
    assert not errors, f"the schema refuses {path.name}, which the loader accepts:\n" + "\n".join(errors)


# -- the case-by-case comparison -------------------------------------------------------------------------------


def _models_of(annotation: Any) -> list[type[BaseModel]]:
    """The settings models a field's annotation holds (through Optional, unions, Annotated, lists, dicts)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for argument in typing.get_args(annotation) for model in _models_of(argument)]


def _model_for(value: dict[str, Any], annotation: Any) -> type[BaseModel] | None:
    """Which of the annotation's models validates this mapping (a union's branch is told by its keys)."""
    models = _models_of(annotation)
    fitting = [m for m in models if set(value) & {f.alias or n for n, f in m.model_fields.items()}]
    return (fitting or models or [None])[0]


def _blocks(node: Any, model: type[BaseModel], path: tuple[Any, ...]) -> typing.Iterator[tuple[type[BaseModel], tuple]]:
    """Every mapping of a document with the model that validates it, and its path."""
    yield model, path
    for name, field in model.model_fields.items():
        key = field.alias or name
        if key not in node:
            continue
        value = node[key]
        origin = typing.get_origin(field.annotation)
        if isinstance(value, list) and _models_of(field.annotation) and origin is list:
            items = [(i, item) for i, item in enumerate(value)]
        elif isinstance(value, dict) and origin is dict:
            items = list(value.items())
        else:
            items = [(None, value)]
        for index, item in items:
            if isinstance(item, dict) and (sub := _model_for(item, field.annotation)) is not None:
                yield from _blocks(item, sub, (*path, key) if index is None else (*path, key, index))


def _documents() -> list[tuple[str, dict[str, Any]]]:
    """The example's queries one by one, and each accepted corpus file, with every namespace."""
    found = []
    example = yaml.safe_load(EXAMPLE.read_text())
    for query in example["queries"]:
        found.append((f"example:{query['name']}", {"namespaces": example["namespaces"], "queries": [query]}))
    for path in ACCEPTED_CORPUS:
        found.append((path.stem, yaml.safe_load(path.read_text())))
    return found


def _at(document: dict[str, Any], path: tuple[Any, ...]) -> dict[str, Any]:
    node: Any = document
    for step in path:
        node = node[step]
    return node


def _numeric(annotation: Any) -> bool:
    if annotation in (int, float):
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType, typing.Annotated):
        return any(_numeric(a) for a in typing.get_args(annotation)[:1 if typing.get_origin(annotation)
                                                                       is typing.Annotated else None])
    return False


def _json_type(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return repr(value)
    return {dict: "object", list: "array", str: "string"}.get(type(value), "number")


def _cases() -> list[tuple[str, dict[str, Any], str, tuple[Any, ...]]]:
    """(what was done, the file, kind, the setting's place): in each document, at the first block of each model -- an unknown key
    (``key``), each required setting removed (``missing``), each setting given each value of VALUES: of another
    JSON type than the file had (``retyped``), a bool for a number (``lax``), or else (``type``)."""
    cases = []
    seen: set[type[BaseModel]] = set()
    blocks_done: set[tuple[str, str]] = set()  # a block written alike in two documents is changed once
    for name, document in _documents():
        done: set[type[BaseModel]] = set()
        for model, path in _blocks(document, PipelineConfig, ()):
            block = (model.__name__, json.dumps(_at(document, path), sort_keys=True, default=str))
            if model in done or block in blocks_done:
                continue
            done.add(model)
            blocks_done.add(block)
            seen.add(model)
            where = f"{name}: {'.'.join(map(str, path)) or '(top)'}"
            extra = copy.deepcopy(document)
            _at(extra, path)["unknwon_setting"] = 1
            cases.append((f"{where}.unknwon_setting added", extra, "key", (*path, "unknwon_setting")))
            for field_name, field in model.model_fields.items():
                key = field.alias or field_name
                if field.is_required() and key in _at(document, path):
                    missing = copy.deepcopy(document)
                    del _at(missing, path)[key]
                    cases.append((f"{where}.{key} removed", missing, "missing", (*path, key)))
                for value in VALUES:
                    changed = copy.deepcopy(document)
                    _at(changed, path)[key] = copy.deepcopy(value)
                    before = _at(document, path).get(key, ...)
                    kind = ("lax" if value is True and _numeric(field.annotation)
                            else "retyped" if before is not ... and _json_type(before) != _json_type(value)
                            else "type")
                    cases.append((f"{where}.{key} = {value!r}", changed, kind, (*path, key)))
    unreached = {m.__name__ for m in _all_models(PipelineConfig)} - {m.__name__ for m in seen}
    assert not unreached, f"no example or accepted corpus file holds these blocks, so none is checked: {unreached}"
    return cases


def _all_models(model: type[BaseModel]) -> set[type[BaseModel]]:
    found = {model}
    for field in model.model_fields.values():
        for sub in _models_of(field.annotation):
            if sub not in found:
                found |= _all_models(sub)
    return found


def _loader_verdict(document: dict[str, Any], setting: tuple[Any, ...]) -> str:
    """``accepted``; ``key_or_type`` (every error a key's or a type's); ``setting`` (an error of the setting
    itself, or of a value inside it); or ``value`` (errors of other places: rules between settings)."""
    try:
        parse_config(document)
    except ConfigError:
        pass
    else:
        return "accepted"
    try:
        PipelineConfig.model_validate(document)
    except ValidationError as refusal:
        errors = refusal.errors()
        if all(e["type"] in KEY_AND_TYPE_ERRORS or e["type"].endswith(("_type", "_parsing")) for e in errors):
            return "key_or_type"
        # a union's branch names (PublicGroups, Public, bool) are no keys of the file
        places = [tuple(i for i in e["loc"] if not (isinstance(i, str) and (i[:1].isupper() or i == "bool")))
                  for e in errors]
        return "setting" if any(place[:len(setting)] == setting for place in places) else "value"
    raise AssertionError("parse_config refused a file that validates")


def test_the_schema_refuses_every_key_and_type_error_the_loader_refuses_and_accepts_what_it_accepts():
    validator = _validator()
    disagreements, tally = [], {}
    for what, document, kind, setting in _cases():
        loader = _loader_verdict(document, setting)
        schema_accepts = validator.is_valid(document)
        tally[(loader, schema_accepts)] = tally.get((loader, schema_accepts), 0) + 1
        if schema_accepts and (loader == "key_or_type" or (loader == "setting" and kind == "retyped")):
            disagreements.append(f"the loader refuses, the schema accepts: {what}")
        if loader == "accepted" and not schema_accepts and kind != "lax":
            disagreements.append(f"the loader accepts, the schema refuses: {what}")
    assert not disagreements, "\n".join(disagreements)
    # not vacuous: many key and type errors were judged, and files accepted with a changed setting too
    assert tally.get(("key_or_type", False), 0) >= 3000 and tally.get(("accepted", True), 0) >= 200, tally
