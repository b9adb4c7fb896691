"""ARCHITECTURE.md cannot rot: every file it names exists, every function named right after a file is
defined in that file (read with ``ast``), every ``Class.method`` it names is defined somewhere in
stream_dp, it maps every package in the order their imports go, and it places every guarantee of the
README's Privacy section.

How a name is tied to a file: a code span holding a path (``stream_dp/...``, ``tests/...``, ``docs/...``,
``deploy/...``) followed by code spans holding names, separated only by spaces, line breaks or single
commas -- ```stream_dp/dp/sensitivity.py` `count_sensitivity`, `sum_sensitivity``. Anything else between
two spans (a word, a semicolon, a bracket) ends the run.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

from tests.architecture.imports import ROOT

DOC = ROOT / "ARCHITECTURE.md"
_SPAN = re.compile(r"`([^`\n]+)`")
_PATH = re.compile(r"^(?:stream_dp|tests|docs|deploy)(?:/[\w.-]+)*/?$")
_NAME = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?$")
_BETWEEN_IN_A_RUN = re.compile(r"^\s*,?\s*$")


def named(text: str) -> tuple[list[str], list[tuple[str, str]], list[str]]:
    """(paths, (file, name) pairs tied to a file, ``Class.method`` names not tied to one) in ``text``."""
    paths: list[str] = []
    tied: list[tuple[str, str]] = []
    loose: list[str] = []
    current: str | None = None
    previous_end = 0
    for span in _SPAN.finditer(text):
        content = span.group(1)
        in_run = current is not None and _BETWEEN_IN_A_RUN.match(text[previous_end:span.start()])
        previous_end = span.end()
        if _PATH.match(content):
            paths.append(content)
            current = content if content.endswith(".py") else None
        elif _NAME.match(content) and in_run:
            tied.append((current, content))
        else:
            current = None
            if _NAME.match(content) and "." in content and content[0].isupper():
                loose.append(content)
    return paths, tied, loose


@cache
def definitions(path: Path) -> frozenset[str]:
    """Names a module defines at its top level, and ``Class.attribute`` for what its classes define."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        found.update(_defined(node))
        if isinstance(node, ast.ClassDef):
            found.update(f"{node.name}.{name}" for child in node.body for name in _defined(child))
    return frozenset(found)


def _defined(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [target.id for target in node.targets if isinstance(target, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def problems(text: str, root: Path = ROOT) -> list[str]:
    paths, tied, loose = named(text)
    found = [f"`{path}` does not exist" for path in paths if not (root / path).exists()]
    for path, name in tied:
        if (root / path).exists() and name not in definitions(root / path):
            found.append(f"`{name}` is not defined in `{path}`")
    everywhere = set().union(*(definitions(path) for path in (root / "stream_dp").rglob("*.py")))
    found += [f"`{name}` is defined in no module of stream_dp" for name in loose if name not in everywhere]
    return found


def test_every_file_and_function_the_architecture_names_exists():
    found = problems(DOC.read_text())
    assert not found, "ARCHITECTURE.md names what the code no longer has; fix the names:\n" + "\n".join(found)


def test_the_checks_catch_a_renamed_function_a_moved_file_and_a_stale_method():
    text = ("`stream_dp/windows/bounding.py` `prune`, `prune_order` and `stream_dp/windows/bounding.py` `prune_all`;"
            " `stream_dp/windows/gone.py` `prune`; `WindowEngine.process`, `WindowEngine.vanished`")
    assert named(text)[1] == [("stream_dp/windows/bounding.py", "prune"), ("stream_dp/windows/bounding.py", "prune_order"),
                              ("stream_dp/windows/bounding.py", "prune_all"), ("stream_dp/windows/gone.py", "prune")]
    assert problems(text) == [
        "`stream_dp/windows/gone.py` does not exist",
        "`prune_all` is not defined in `stream_dp/windows/bounding.py`",
        "`WindowEngine.vanished` is defined in no module of stream_dp",
    ]


def test_the_map_names_every_package():
    text = DOC.read_text()
    packages = [path for path in sorted((ROOT / "stream_dp").glob("*/__init__.py"))]
    missing = [f"stream_dp/{p.parent.name}/" for p in packages if f"`stream_dp/{p.parent.name}/`" not in text]
    missing += [f"{p.parent.name}/ (in stream_dp/worker/)" for p in sorted((ROOT / "stream_dp" / "worker").glob("*/__init__.py"))
                if f"`{p.parent.name}/`" not in text]
    assert not missing, f"ARCHITECTURE.md's map of packages leaves out {missing}"


def _privacy_guarantees() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Privacy\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\* \*\*(.+?)\*\*", section, flags=re.MULTILINE)


def test_every_privacy_guarantee_has_its_place_with_a_file_and_a_function():
    guarantees = _privacy_guarantees()
    assert len(guarantees) >= 9, f"the README's Privacy section was not read: {guarantees}"
    text = DOC.read_text()
    section = text.split("\n## Where each guarantee", 1)[1].split("\n## ", 1)[0]
    paragraphs = {match.group(1).rstrip("."): match.group(0)
                  for match in re.finditer(r"^\*\*(.+?)\*\*.*?(?=^\*\*|\Z)", section, flags=re.MULTILINE | re.DOTALL)}
    missing = [title for title in guarantees if title not in paragraphs]
    assert not missing, f"ARCHITECTURE.md does not say where these Privacy guarantees are enforced: {missing}"
    unplaced = [title for title in guarantees if not named(paragraphs[title])[1]]
    assert not unplaced, f"ARCHITECTURE.md names no file and function for: {unplaced}"


def test_the_architecture_stays_a_map():
    lines = len(DOC.read_text().splitlines())
    assert lines <= 150, f"ARCHITECTURE.md has {lines} lines; keep it a map of at most 150 and move detail to docs/"


def test_the_package_order_the_map_states_is_the_order_of_the_imports():
    """The map lists the top-level packages in groups separated by '·' (each group's members in backquotes
    before its parenthesis); every import between packages goes from a later group to an earlier one."""
    from tests.architecture.imports import package_imports, unit_edges

    text = DOC.read_text()
    start = text.index("Each package imports only those before it here")
    paragraph = text[start:text.index("\n\n", start)]
    groups = [re.findall(r"`(\w+)`", segment.split("(")[0]) for segment in paragraph.split(":", 1)[1].split("·")]
    rank = {f"stream_dp.{name}": position for position, names in enumerate(groups) for name in names}
    packages = {f"stream_dp.{p.parent.name}" for p in (ROOT / "stream_dp").glob("*/__init__.py")}
    assert set(rank) == packages, f"the map's package order names {sorted(rank)}, the packages are {sorted(packages)}"
    backwards = [f"{source} imports {target} ({edges[0].path}:{edges[0].line})"
                 for (source, target), edges in sorted(unit_edges(package_imports(), "stream_dp").items())
                 if source in rank and target in rank and rank[target] >= rank[source]]
    assert not backwards, "ARCHITECTURE.md's package order is not the imports' order:\n" + "\n".join(backwards)
