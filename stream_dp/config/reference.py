"""The query-file reference (``docs/reference/query-file.md``), rendered from the query file's JSON Schema.

The schema is generated from the pydantic models (``stream_dp.config.schema``), so the page, the schema
editors validate with and the loader cannot disagree about a setting: one section per settings block, in
the order a file reads them, one row per setting with its key, how it is written, its default, the bounds
the model checks and its description. ``stream-dp schema --markdown`` prints it; a test fails when the
committed page differs.
"""

from __future__ import annotations

import json
from typing import Any

from stream_dp.config.schema import query_file_schema

_HEADER = """\
# Query file reference

<!-- Generated from the pydantic models in stream_dp/config by `stream-dp schema --markdown`; edit the
models' descriptions, not this page (tests/config/test_reference.py fails when it is stale). -->

A query file is YAML with two keys: `namespaces`, the kinds of privacy unit and their budgets, and
`queries`. `deploy/queries.example.yaml` is a commented example of every option, and
`stream-dp check-config FILE` checks a file as the worker builds it, naming the file, query and
setting of every problem. This page lists every setting; what the options compute and cost is
explained under [Query options](../queries/index.md).

**Durations** are written as a number and a unit, `ms`, `s`, `m`, `h` or `d` (`500ms`, `1.5s`,
`1m`, `24h`, `7d`), or as a whole number of milliseconds.

**In an editor**, the JSON Schema `deploy/schemas/queries.schema.json` (generated from the same
models) validates and completes query files: the YAML language server (VS Code's YAML extension,
and others) reads the first line of the example,
`# yaml-language-server: $schema=./schemas/queries.schema.json` (a path relative to the file).
The schema checks keys, types and the range of each setting; the rules between settings are
`check-config`'s.
"""


def _ref_name(node: dict[str, Any]) -> str | None:
    ref = node.get("$ref")
    return ref.rsplit("/", 1)[-1] if isinstance(ref, str) else None


def _anchor(name: str) -> str:
    return name.lower()


def _code(value: Any) -> str:
    """A value as written in a YAML file, in backticks."""
    return f"`{_yaml(value)}`"


def _yaml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return value
    if isinstance(value, (list, dict)):
        return json.dumps(value, ensure_ascii=False).replace('"', "")
    return f"{value:g}" if isinstance(value, float) else str(value)


def _is_duration(node: dict[str, Any]) -> bool:
    return any(branch.get("type") == "string" and "pattern" in branch for branch in node.get("anyOf", []))


def _written(node: dict[str, Any], titles: dict[str, str]) -> str:
    """How a value is written: ``integer``, ``[number, number]``, a link to a block's section, ..."""
    name = _ref_name(node)
    if name is not None:
        return f"[{titles[name]}](#{_anchor(name)})"
    if _is_duration(node):
        return "duration"
    if "anyOf" in node or "oneOf" in node:
        branches = [b for b in node.get("anyOf", node.get("oneOf")) if b.get("type") != "null"]
        return " or ".join(_written(branch, titles) for branch in branches)
    if "enum" in node:
        return "one of " + ", ".join(_code(choice) for choice in node["enum"])
    kind = node.get("type")
    if kind == "array":
        items = node.get("items", {})
        if isinstance(items, list):
            return "[" + ", ".join(_written(item, titles) for item in items) + "]"
        return f"[{_written(items, titles)}, ...]" if items else "list"
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"{{name: {_written(node['additionalProperties'], titles)}, ...}}"
    return {"integer": "integer", "number": "number", "string": "string", "boolean": "true or false",
            "object": "mapping"}.get(kind, "any value")


_BOUNDS = (("minimum", "≥ {}"), ("exclusiveMinimum", "> {}"), ("maximum", "≤ {}"), ("exclusiveMaximum", "< {}"),
           ("minLength", "at least {} characters"), ("maxLength", "at most {} characters"),
           ("minItems", "at least {} items"), ("maxItems", "at most {} items"),
           ("minProperties", "at least {} entries"))
_NOT_EMPTY = ("minLength", "minItems", "minProperties")


def _bounds(node: dict[str, Any]) -> list[str]:
    """The bounds the schema states for a value, in words (a fixed-length list's length goes without saying)."""
    found = []
    for branch in [node, *node.get("anyOf", [])]:
        if isinstance(branch.get("items"), list):
            continue
        for key, words in _BOUNDS:
            if key not in branch or (key == "minimum" and branch[key] == 0 and _is_duration(node)):
                continue  # a duration's whole milliseconds are never negative: nothing to say
            number = branch[key]
            if key in _NOT_EMPTY and number == 1:
                found.append("not empty")
            else:
                found.append(words.format(f"{number:g}" if isinstance(number, float) else f"{number:,}"))
    return found


def _default(key: str, node: dict[str, Any], definition: dict[str, Any]) -> str:
    if key in definition.get("required", []):
        return "required"
    if "default" in node:
        return "—" if node["default"] is None else _code(node["default"])
    # required unless another setting is given (a query's epsilon, unless it has local_dp)
    alternatives = [alt.get("required", []) for alt in definition.get("anyOf", [])]
    if any(key in alt for alt in alternatives):
        others = sorted({other for alt in alternatives if key not in alt for other in alt})
        return "required unless " + " or ".join(f"`{other}`" for other in others)
    return "—"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n\n", "<br><br>").replace("\n", " ")


def _sections(schema: dict[str, Any]) -> list[tuple[str, str | None, dict[str, Any]]]:
    """(path, definition name, definition) of the file and of each block it holds, in reading order; a
    block written in two forms (``groups``) gets a section per form."""
    definitions = schema["definitions"]
    seen: set[str] = set()
    found: list[tuple[str, str | None, dict[str, Any]]] = [("", None, schema)]

    def refs(node: Any) -> list[str]:
        if isinstance(node, list):
            return [name for item in node for name in refs(item)]
        if not isinstance(node, dict):
            return []
        name = _ref_name(node)
        return [name] if name else [n for key, value in node.items() if key != "properties" for n in refs(value)]

    def walk(path: str, definition: dict[str, Any]) -> None:
        for key, prop in definition.get("properties", {}).items():
            step = f"{path}.{key}" if path else key
            if prop.get("type") == "array":
                step += "[]"
            elif prop.get("type") == "object" and "additionalProperties" in prop:
                step += ".NAME"
            for name in refs(prop):
                if name not in seen:
                    seen.add(name)
                    found.append((step, name, definitions[name]))
                    walk(step, definitions[name])

    walk("", schema)
    return found


def query_file_reference() -> str:
    """The reference page's markdown."""
    schema = query_file_schema()
    sections = _sections(schema)
    forms: dict[str, int] = {}
    for path, _, _ in sections:
        forms[path] = forms.get(path, 0) + 1
    titles = {name: f"{next(iter(definition.get('properties', {'': 0})))} block".strip() if forms[path] > 1
              else "block" for path, name, definition in sections if name}
    lines = [_HEADER]
    for path, name, definition in sections:
        properties = definition.get("properties", {})
        if name is None:
            lines.append("## The file {#the-file}\n")
        else:
            form = f" with `{next(iter(properties))}`" if forms[path] > 1 else ""
            lines.append(f"## `{path}`{form} {{#{_anchor(name)}}}\n")
        if definition.get("description"):
            lines.append(definition["description"] + "\n")
        if not properties:
            lines.append("No settings: written `{}`.\n")
            continue
        lines.append("| Key | Written as | Default | Bounds | Description |")
        lines.append("| --- | --- | --- | --- | --- |")
        for key, prop in properties.items():
            written = _written(prop, titles)
            # pydantic leaves out a block's description beside its $ref when it is the block's own
            described = prop.get("description") or schema["definitions"].get(_ref_name(prop) or "", {}).get(
                "description", "")
            if prop.get("examples"):
                written += f", e.g. {_code(prop['examples'][0])}"
            lines.append("| " + " | ".join(_cell(cell) for cell in (
                f"`{key}`", written, _default(key, prop, definition), ", ".join(_bounds(prop)) or "—",
                described)) + " |")
        lines.append("")
    return "\n".join(lines)
