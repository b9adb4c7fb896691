"""The worker's layout stays what ARCHITECTURE.md describes: at the top of ``stream_dp/worker/`` only the
process (``app.py``), the supervisor and ``__init__.py``, every other module in the stage package that owns it,
and no worker module over 400 lines (a module that grows past that has a seam to split along)."""

from __future__ import annotations

from tests.architecture.imports import ROOT

WORKER = ROOT / "stream_dp" / "worker"
TOP_LEVEL = {"__init__.py", "app.py", "supervisor.py"}
MAX_LINES = 400


def test_only_the_app_and_the_supervisor_sit_at_the_top_of_the_worker():
    stray = sorted(path.name for path in WORKER.glob("*.py") if path.name not in TOP_LEVEL)
    assert not stray, f"stream_dp/worker/ holds {stray} at its top; move each into the stage package that owns it"


def test_no_worker_module_is_over_400_lines():
    long = sorted(f"{path.relative_to(ROOT)}: {lines} lines" for path in WORKER.rglob("*.py")
                  if (lines := len(path.read_text().splitlines())) > MAX_LINES)
    assert not long, f"worker modules over {MAX_LINES} lines; split each along a seam:\n" + "\n".join(long)
