"""How a setting of the query file is written, for the messages that refuse one written otherwise.

Each field's example is its ``examples`` (else its default), as it is written in the file (``1d``, not
milliseconds); an option block's example is its required settings (``top_k: {k: 10}``). The messages are
built from the models, so a new option is explained without a message of its own.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

# An option block with more required settings than this is pointed at the example file instead of
# being spelled out on one line.
_MOST_SETTINGS_SHOWN = 4


def as_yaml(value: Any) -> str:
    """``value`` as written in a YAML flow: ``[0.5, 0.9]``, ``{k: 10}``, ``1d``, ``true``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(as_yaml(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{key}: {as_yaml(item)}" for key, item in value.items()) + "}"
    if value is None:
        return "null"
    return str(value)


def field_example(field: FieldInfo) -> Any:
    """How the field is written (its first example, else its default), or None when neither is known."""
    if field.examples:
        return field.examples[0]
    if field.default is not PydanticUndefined and field.default is not None:
        return field.default
    return None


def option_model(annotation: Any) -> type[BaseModel] | None:
    """The settings model of an option written as a block (``Model`` or ``Model | None``), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(models) == 1:
            return option_model(models[0])
    return None


def block_example(model: type[BaseModel]) -> str | None:
    """``{k: 10}``: the block's own example (``json_schema_extra``), else its required settings with their
    examples; None when too many to show."""
    extra = model.model_config.get("json_schema_extra")
    if isinstance(extra, dict) and extra.get("examples"):
        return as_yaml(extra["examples"][0])
    required = {(field.alias or name): field_example(field) for name, field in model.model_fields.items()
                if field.is_required()}
    if len(required) > _MOST_SETTINGS_SHOWN or any(value is None for value in required.values()):
        return None
    return as_yaml(required)


def refuse_empty_option(model: type[BaseModel], key: str, value: Any) -> Any:
    """An option key written with no value (``top_k:``, YAML null): ``{}`` for an option whose settings
    are all optional (``count:``), refused for one that needs settings -- read as absent, the release
    the file asks for would silently not happen."""
    if value is not None:
        return value
    if not any(field.is_required() for field in model.model_fields.values()):
        return {}
    example = block_example(model)
    raise ValueError(f"{key} is empty; it needs settings, e.g. {key}: {example or '{...}'} "
                     "(see deploy/queries.example.yaml), or remove it")


def refuse_empty_options(model: type[BaseModel], value: Any, name: str) -> Any:
    """``refuse_empty_option`` for field ``name`` of ``model`` when it is an option block; else the value."""
    field = model.model_fields[name]
    settings = option_model(field.annotation)
    if settings is None:
        return value
    return refuse_empty_option(settings, field.alias or name, value)
