"""MkDocs hook: ARCHITECTURE.md, kept at the repository's top where a newcomer looks first, is also the
site's Architecture page. Its links to ``docs/`` pages are rewritten to the site's own paths, so one
file serves both, and the strict build checks its links like any page's."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

PAGE = "architecture.md"
_DOCS_LINK = re.compile(r"\]\(docs/")


def _source(config: Any) -> Path:
    return Path(config.config_file_path).parent / "ARCHITECTURE.md"


def on_config(config: Any) -> Any:
    config.watch.append(str(_source(config)))  # `mkdocs serve` rebuilds when it changes
    return config


def on_files(files: Files, config: Any) -> Files:
    text = _DOCS_LINK.sub("](", _source(config).read_text(encoding="utf-8"))
    files.append(File.generated(config, PAGE, content=text))
    return files
