"""No import cycle between the top-level packages of ``stream_dp`` (windows, dp, budget, config,
worker, cli, wire, metrics, ...), nor between the stage packages of ``stream_dp.worker``.

A cycle means neither package can be read, tested or moved without the other. Lazy imports inside
functions and imports under ``TYPE_CHECKING`` count: they hide a cycle from the interpreter, not
from a reader (``tests/architecture/imports.py``).
"""

from __future__ import annotations

import textwrap

from tests.architecture.imports import cycles, describe, package_imports, unit_edges


def _cycle_report(prefix: str) -> str:
    edges = unit_edges(package_imports(), prefix)
    return "\n".join(describe(cycle, edges) for cycle in cycles(edges))


def test_no_import_cycle_between_top_level_packages():
    report = _cycle_report("stream_dp")
    assert not report, (
        "import cycle between top-level packages of stream_dp; keep one direction and move the "
        "shared pieces where both sides can import them:\n" + report)


def test_no_import_cycle_between_worker_packages():
    report = _cycle_report("stream_dp.worker")
    assert not report, (
        "import cycle between packages of stream_dp.worker; a stage package imports the packages "
        "below it, never one that imports it back:\n" + report)


def test_the_reader_sees_lazy_and_type_checking_imports(tmp_path, monkeypatch):
    """The checks above can fail: a cycle made only of a function-level import one way and a
    TYPE_CHECKING import the other way, in a package written here, is found and named."""
    package = tmp_path / "stream_dp"
    for name, text in {
        "__init__.py": "",
        "a/__init__.py": "",
        "a/one.py": """
            def late():
                from stream_dp.b.two import thing
                return thing
            """,
        "b/__init__.py": "",
        "b/two.py": """
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from ..a import one
            thing = 1
            """,
        "c/__init__.py": "from stream_dp.a import one\n",
    }.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(textwrap.dedent(text))
    edges = unit_edges(package_imports(tmp_path), "stream_dp")
    found = cycles(edges)
    assert found == [["stream_dp.a", "stream_dp.b", "stream_dp.a"]]
    report = describe(found[0], edges)
    assert "stream_dp/a/one.py:3 imports stream_dp.b.two" in report
    assert "stream_dp/b/two.py:4 imports stream_dp.a.one" in report
