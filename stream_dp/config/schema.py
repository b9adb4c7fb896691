"""The query file's JSON Schema, generated from its pydantic models, for editors to validate and complete
query files with (``deploy/schemas/queries.schema.json``, ``stream-dp schema``).

It is written in draft-07, the draft the YAML language servers of common editors validate with. It holds
what the models declare -- keys, types, required settings, the ranges of numbers and lengths of lists, the
descriptions and examples -- and none of what their validators check beyond that (a window offset below its
size, a namespace that exists, what one query's options allow together): ``stream-dp check-config`` says
those. So the schema refuses every file the loader refuses for an unknown key, a value of the wrong type or
a missing setting, and accepts every file the loader accepts, but for values the loader converts (``"5"`` or
``true`` for a number, ``1`` or ``"yes"`` for true or false), which no one writes on purpose.
"""

from __future__ import annotations

import json
import re
from typing import Any

from stream_dp.config.durations import format_duration_ms
from stream_dp.config.queries import PipelineConfig

SCHEMA_ID = "https://github.com/stream-dp/stream-dp/deploy/schemas/queries.schema.json"
DRAFT_07 = "http://json-schema.org/draft-07/schema#"


def _draft_07(node: Any) -> Any:
    """Pydantic writes draft 2020-12; this is the same schema in draft-07's words: ``definitions`` for
    ``$defs``, and a fixed-length list as ``items: [...]`` for ``prefixItems``."""
    if isinstance(node, list):
        return [_draft_07(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key == "$ref":
            out[key] = value.replace("#/$defs/", "#/definitions/")
        elif key == "$defs":
            out["definitions"] = _draft_07(value)
        elif key == "prefixItems":
            out["items"] = _draft_07(value)
            out["additionalItems"] = False
        else:
            out[key] = _draft_07(value)
    return out


def _is_duration(prop: dict[str, Any]) -> bool:
    """A duration setting (``stream_dp.config.durations.DurationMs``): milliseconds or a number and a unit."""
    return any(isinstance(branch, dict) and branch.get("type") == "string" and "pattern" in branch
               for branch in prop.get("anyOf", []))


def _prose(text: str) -> str:
    """A docstring as a description: its wrapped lines joined into paragraphs, code in single backticks."""
    paragraphs = re.split(r"\n\s*\n", text.strip())
    return "\n\n".join(" ".join(line.strip() for line in p.splitlines()) for p in paragraphs).replace("``", "`")


def _tidy(definition: dict[str, Any]) -> None:
    """A settings block's properties without pydantic's titles (``Max Groups Per Unit``: the key says it),
    durations' defaults as a person writes them (``5m``, not ``300000``), descriptions as prose."""
    if "description" in definition:
        definition["description"] = _prose(definition["description"])
    for prop in definition.get("properties", {}).values():
        prop.pop("title", None)
        if "description" in prop:
            prop["description"] = _prose(prop["description"])
        if _is_duration(prop) and isinstance(prop.get("default"), int):
            prop["default"] = format_duration_ms(prop["default"])


def _no_empty_blocks(definition: dict[str, Any], definitions: dict[str, Any]) -> None:
    """An option written with no value (``top_k:``, YAML null) is read as ``{}`` (``stream_dp.config.examples.
    refuse_empty_option``): refused when its block needs a setting (one required, or ``minProperties``), so its
    null branch goes; a block that takes ``{}`` keeps it."""
    for prop in definition.get("properties", {}).values():
        branches = prop.get("anyOf", [])
        blocks = [b for b in branches if "$ref" in b]
        if len(blocks) == 1 and {"type": "null"} in branches:
            block = definitions[blocks[0]["$ref"].rsplit("/", 1)[-1]]
            if block.get("required") or block.get("minProperties"):
                rest = [b for b in branches if b != {"type": "null"}]
                del prop["anyOf"], prop["default"]
                if len(rest) == 1:
                    prop.update(rest[0])
                else:
                    prop["anyOf"] = rest


def _implied_epsilon(query: dict[str, Any]) -> None:
    """A query may leave out ``epsilon`` when it has a ``local_dp`` block, whose epsilon it then takes
    (``stream_dp.config.implied``): ``epsilon`` is required unless ``local_dp`` is a block."""
    query["required"] = [key for key in query["required"] if key != "epsilon"]
    query["anyOf"] = [
        {"required": ["epsilon"]},
        {"required": ["local_dp"], "properties": {"local_dp": {"type": "object"}}},
    ]


def query_file_schema() -> dict[str, Any]:
    """The JSON Schema (draft-07) of a query file."""
    generated = _draft_07(PipelineConfig.model_json_schema(by_alias=True, mode="validation"))
    definitions = generated.pop("definitions")
    for definition in definitions.values():
        _tidy(definition)
        _no_empty_blocks(definition, definitions)
    _implied_epsilon(definitions["QueryConfig"])
    _tidy(generated)
    generated.pop("title", None)
    return {
        "$schema": DRAFT_07,
        "$id": SCHEMA_ID,
        "title": "stream-dp query file",
        **generated,
        "description": (generated.get("description", "") + " Validated in full by `stream-dp check-config FILE`; "
                        "this schema checks keys, types and the ranges of single settings."),
        "definitions": definitions,
    }


def query_file_schema_text() -> str:
    """The schema as the committed file holds it: indented JSON, keys in the models' order, a final newline."""
    return json.dumps(query_file_schema(), indent=2, ensure_ascii=False) + "\n"
