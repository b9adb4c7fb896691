"""Each stage package of ``stream_dp.worker`` says in its ``__init__`` docstring which other worker packages
it may import and which it must not, in one form::

    May import ``partials``, ``query`` and ``stream_dp.windows``/``dp``; must not import ``release`` or
    ``combine`` (why) nor ``sandbox``.

or ``Must not import any other worker package.`` A name in double backquotes is a worker package unless it
starts with ``stream_dp.`` (then it and the names joined to it by ``/`` are top-level packages, which the
top-level cycle test covers). Every import a module of the package makes of another worker package -- at
the top, inside a function or under ``TYPE_CHECKING`` -- must name one the "May import" clause lists; the
"must not import" names must be worker packages it does not list. The docstring is the rule a reader sees
first; this test keeps it true.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.architecture.imports import ROOT, package_imports, unit_of

WORKER = "stream_dp.worker"
_CLAUSE_END = r"(?=;|\.(?:\s|$)|$)"
_MAY = re.compile(r"\bMay import\b(?P<clause>.*?)" + _CLAUSE_END, re.DOTALL)
_MUST_NOT = re.compile(r"\bmust not import\b(?P<clause>.*?)" + _CLAUSE_END, re.DOTALL | re.IGNORECASE)
_NAMES = re.compile(r"``([\w.]+)``((?:/``[\w.]+``)*)")


@dataclass(frozen=True)
class Rule:
    may: frozenset[str]  # worker packages it may import
    must_not: frozenset[str]  # worker packages its docstring names as forbidden


def _worker_names(clause: str) -> set[str]:
    return {first for first, _joined in _NAMES.findall(clause) if not first.startswith("stream_dp.")}


def declared(init: Path) -> Rule | None:
    """The rule an ``__init__`` docstring states, or None when it states none."""
    doc = " ".join((ast.get_docstring(ast.parse(init.read_text())) or "").split())  # a clause may wrap
    may = [match.group("clause") for match in _MAY.finditer(doc)]
    must_not = [match.group("clause") for match in _MUST_NOT.finditer(doc)]
    if len(may) > 1 or len(must_not) > 1 or not (may or "any other worker package" in "".join(must_not)):
        return None
    return Rule(frozenset(_worker_names(may[0]) if may else ()), frozenset(_worker_names("".join(must_not))))


def worker_packages(root: Path = ROOT) -> list[Path]:
    return sorted(path.parent for path in (root / "stream_dp" / "worker").glob("*/__init__.py"))


def violations(root: Path = ROOT) -> list[str]:
    """Every worker package without a rule, every rule naming no worker package or contradicting itself,
    and every import of a worker package its importer's rule does not allow."""
    packages = {path.name: path for path in worker_packages(root)}
    rules = {}
    found = []
    for name, path in packages.items():
        where = f"{path.relative_to(root).as_posix()}/__init__.py"
        rule = declared(path / "__init__.py")
        if rule is None:
            found.append(f"{where}: its docstring states no import rule ('May import ``a`` and ``b``; must not "
                         f"import ``c``.' or 'Must not import any other worker package.')")
            continue
        found += [f"{where}: names {unknown!r}, no package of stream_dp.worker"
                  for unknown in sorted((rule.may | rule.must_not) - set(packages))]
        found += [f"{where}: both may and must not import {both!r}" for both in sorted(rule.may & rule.must_not)]
        rules[name] = rule
    for each in package_imports(root):
        source, target = unit_of(each.importer, WORKER), unit_of(each.imported, WORKER)
        if not source or not target or source == target or source == WORKER or target == WORKER:
            continue
        source_name, target_name = source.rsplit(".", 1)[-1], target.rsplit(".", 1)[-1]
        if source_name in rules and target_name not in rules[source_name].may:
            allowed = sorted(rules[source_name].may) or "no worker package"
            found.append(f"{each.path}:{each.line} imports {each.imported}, but stream_dp.worker.{source_name} "
                         f"may import only {allowed}")
    return found


def test_worker_packages_import_only_what_their_docstrings_allow():
    if not worker_packages():
        pytest.skip("stream_dp.worker has no stage packages")
    problems = violations()
    assert not problems, "worker import rules broken:\n" + "\n".join(problems)


def test_a_broken_rule_is_named(tmp_path):
    """The check can fail: an import the docstring does not allow (a lazy one), a package without a rule, a
    rule naming no package and a contradicting rule are each reported; what the rules allow is not."""
    files = {
        "stream_dp/__init__.py": "",
        "stream_dp/worker/__init__.py": "",
        "stream_dp/worker/app.py": "from stream_dp.worker.release import stage\n",
        "stream_dp/worker/kafka/__init__.py": '"""Kafka clients.\n\nMust not import any other worker package.\n"""\n',
        "stream_dp/worker/kafka/clients.py": "import stream_dp.windows\n",
        "stream_dp/worker/store/__init__.py": '"""Redis state.\n\nMay import ``kafka`` (offsets) and ``stream_dp.budget``/'
                                              '``dp``; must not import ``gaurd``.\n"""\n',
        "stream_dp/worker/store/ledger.py": "from stream_dp.worker.kafka import clients\n",
        "stream_dp/worker/release/__init__.py": '"""Release.\n\nMay import ``store`` and\n``kafka``; must not import '
                                                '``kafka`` nor\n``ingest``.\n"""\n',
        "stream_dp/worker/release/stage.py": """
            from stream_dp.worker.store import ledger
            def late():
                from stream_dp.worker.ingest.stage import run
            """,
        "stream_dp/worker/ingest/__init__.py": '"""Ingest, with no rule."""\n',
        "stream_dp/worker/ingest/stage.py": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    assert violations(tmp_path) == [
        "stream_dp/worker/ingest/__init__.py: its docstring states no import rule ('May import ``a`` and ``b``; "
        "must not import ``c``.' or 'Must not import any other worker package.')",
        "stream_dp/worker/release/__init__.py: both may and must not import 'kafka'",
        "stream_dp/worker/store/__init__.py: names 'gaurd', no package of stream_dp.worker",
        "stream_dp/worker/release/stage.py:4 imports stream_dp.worker.ingest.stage, but stream_dp.worker.release "
        "may import only ['kafka', 'store']",
    ]
