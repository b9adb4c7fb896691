"""The query-file reference page (docs/reference/query-file.md): generated from the models, complete, fresh."""

from __future__ import annotations

import re
import typing
from pathlib import Path

from pydantic import BaseModel

from stream_dp.config import PipelineConfig
from stream_dp.config.reference import query_file_reference

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "reference" / "query-file.md"


def _models(model: type[BaseModel], found: dict[str, type[BaseModel]] | None = None) -> dict[str, type[BaseModel]]:
    """Every settings block reachable from ``model``, by class name."""
    found = {} if found is None else found
    found[model.__name__] = model

    def inner(annotation: typing.Any) -> typing.Iterator[type[BaseModel]]:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield annotation
        for argument in typing.get_args(annotation):
            yield from inner(argument)

    for field in model.model_fields.values():
        for sub in inner(field.annotation):
            if sub.__name__ not in found:
                _models(sub, found)
    return found


def test_the_committed_page_is_the_one_the_models_generate():
    assert PAGE.read_text() == query_file_reference(), (
        "docs/reference/query-file.md is stale: regenerate it with "
        "`stream-dp schema --markdown > docs/reference/query-file.md`")


def test_every_setting_has_a_description():
    undescribed = [f"{name}.{field_name}" for name, model in _models(PipelineConfig).items()
                   for field_name, field in model.model_fields.items() if not (field.description or "").strip()]
    assert not undescribed, f"settings without Field(description=...): {undescribed}"


def test_every_setting_of_every_block_has_its_row_in_its_section():
    page = PAGE.read_text()
    sections = dict(re.findall(r"\{#(\w[\w-]*)\}\n(.*?)(?=\n## |\Z)", page, flags=re.S))
    missing = []
    for name, model in _models(PipelineConfig).items():
        anchor = "the-file" if model is PipelineConfig else name.lower()
        section = sections.get(anchor)
        if section is None:
            missing.append(f"no section #{anchor} for {name}")
            continue
        for field_name, field in model.model_fields.items():
            key = field.alias or field_name
            if not re.search(rf"^\| `{re.escape(key)}` \|.*\| {re.escape(field.description[:40])}", section, flags=re.M):
                missing.append(f"{name}: no row for {key} with its description")
    assert not missing, "\n".join(missing)
