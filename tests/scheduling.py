"""How ``deploy/test.sh`` spreads the suite over pytest-xdist worker processes (``-n N --dist loadgroup``).

Most of the suite's time is spent waiting -- for a window to close, a broker
to come back, a worker process to join its group -- so several pytest
processes on two cores finish far sooner than one. Three rules keep that safe
and short:

* **Tests that share a costly fixture run in one process.** A test is put in a
  group by an ``xdist_group`` mark, or when it uses a module-scoped fixture (the
  audit's worker deployments, a private broker): the module is its group, so the
  fixture is set up once, not once per process. Everything else is sent out test
  by test.
* **The longest work starts first.** Groups and tests holding tests marked
  ``slow`` are handed out before the rest (more slow tests first), so the many
  short tests fill the gaps at the end instead of a long one starting last.
* The groups are decided where the tests are collected, in the worker processes,
  and written to a file the scheduler in the controlling process reads: since
  pytest 9.2 xdist's own ``loadgroup`` no longer sees the marks (it renames test
  ids, which pytest no longer lets it do), and would run every test on its own.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

_SCHEDULE_DIR = "stream_dp_schedule_dir"
_STASH = pytest.StashKey[Path]()


def group_of(item: pytest.Item) -> str | None:
    """The group ``item`` must run in with others (one process, one after the other), or None."""
    names = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                    for mark in item.iter_markers("xdist_group")})
    if names:
        return "@" + "_".join(names)
    info = getattr(item, "_fixtureinfo", None)
    if info is not None and any(defs[-1].scope in ("module", "package", "class")
                                for defs in info.name2fixturedefs.values() if defs):
        return "@" + (item.module.__name__ if getattr(item, "module", None) else item.nodeid.split("::")[0])
    return None


def write_plan(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a worker process: each test's group and whether it is slow, for the scheduler."""
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    if not workerinput or _SCHEDULE_DIR not in workerinput:
        return
    plan = {item.nodeid: [group_of(item), item.get_closest_marker("slow") is not None] for item in items}
    target = Path(workerinput[_SCHEDULE_DIR]) / f"{workerinput['workerid']}.json"
    part = target.with_suffix(".part")
    part.write_text(json.dumps(plan))
    os.replace(part, target)  # the scheduler never reads half a file


def configure_node(node: Any) -> None:
    """In the controlling process, before a worker starts: where it writes its plan."""
    config = node.config
    if _STASH not in config.stash:
        directory = config._tmp_path_factory.getbasetemp() / "schedule"
        directory.mkdir(parents=True, exist_ok=True)
        config.stash[_STASH] = directory
    node.workerinput[_SCHEDULE_DIR] = str(config.stash[_STASH])


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadgroup" or _STASH not in config.stash:
        return None
    from xdist.scheduler import LoadScopeScheduling

    directory = config.stash[_STASH]

    class GroupScheduling(LoadScopeScheduling):
        """xdist's scheduling by scope, with the scopes and their order read from the workers' plan."""

        _plan: dict[str, list] | None = None
        _ordered = False

        def _read_plan(self) -> dict[str, list]:
            if self._plan is None:
                plans = sorted(directory.glob("*.json"))
                if not plans:
                    raise RuntimeError(f"no worker wrote its test plan to {directory}: is tests/conftest.py loaded?")
                self._plan = json.loads(plans[0].read_text())
            return self._plan

        def _split_scope(self, nodeid: str) -> str:
            group = self._read_plan().get(nodeid, [None])[0]
            return group or nodeid

        def _assign_work_unit(self, node: Any) -> None:
            if not self._ordered:  # once, when the queue is first drawn from: the slowest work first
                plan = self._read_plan()
                slow = {scope: sum(bool(plan.get(n, [None, False])[1]) for n in nodeids)
                        for scope, nodeids in self.workqueue.items()}
                order = sorted(self.workqueue, key=lambda scope: -slow[scope])  # stable: collection order
                for scope in order:
                    self.workqueue.move_to_end(scope)
                self._ordered = True
            super()._assign_work_unit(node)

    config.option.loadscopereorder = False  # the order is ours
    return GroupScheduling(config, log)
