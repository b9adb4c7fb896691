"""How ``deploy/test.sh`` spreads the suite over pytest-xdist worker processes (``-n N --dist loadgroup``).

Most of the suite's time is spent waiting -- for a window to close, a broker
to come back, a worker process to join its group -- so several pytest
processes on two cores finish far sooner than one. These rules keep that safe:

* **Tests that share a costly fixture run in one process.** A test is put in a
  group by an ``xdist_group`` mark, or when it uses a module-scoped fixture (the
  audit's worker deployments, a private broker): the module is its group, so the
  fixture is set up once, not once per process. Everything else is sent out test
  by test.
* **Tests marked ``heavy`` run one after the other, in one process** (one group):
  each keeps the cores busy for minutes (the audit's six worker processes, a
  million-group window), and two at once starved everything else.
* **While the heavy group runs, one other process at a time takes a test marked
  ``slow``** -- mostly end-to-end tests that wait on timeouts and windows, and
  can miss them on starved cores, so never several beside the heavy group --
  and the rest take the short tests; whenever no heavy test runs, the slow ones
  go first. So the long work starts early, and the many short tests fill the
  gaps instead of the slow ones queueing until the heavy group ends (a run's
  last quarter of an hour was slow tests alone).

The groups and marks are read where the tests are collected, in the worker
processes, and written to a file the scheduler in the controlling process
reads: since pytest 9.2, xdist's own ``loadgroup`` no longer sees the marks (it
renames test ids, which pytest no longer lets it do) and would run every test
on its own.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

_SCHEDULE_DIR = "stream_dp_schedule_dir"
_STASH = pytest.StashKey[Path]()
HEAVY_GROUP = "@heavy"
HEAVY, SLOW, SHORT = "heavy", "slow", "short"


def group_of(item: pytest.Item) -> str | None:
    """The group ``item`` must run in with others (one process, one after the other), or None."""
    if item.get_closest_marker("heavy"):
        return HEAVY_GROUP
    names = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                    for mark in item.iter_markers("xdist_group")})
    if names:
        return "@" + "_".join(names)
    info = getattr(item, "_fixtureinfo", None)
    if info is not None and any(defs[-1].scope in ("module", "package", "class")
                                for defs in info.name2fixturedefs.values() if defs):
        return "@" + (item.module.__name__ if getattr(item, "module", None) else item.nodeid.split("::")[0])
    return None


def kind_of(item: pytest.Item) -> str:
    if item.get_closest_marker("heavy"):
        return HEAVY
    return SLOW if item.get_closest_marker("slow") else SHORT


def write_plan(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a worker process: each test's group and kind, for the scheduler."""
    workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
    if not workerinput or _SCHEDULE_DIR not in workerinput:
        return
    plan = {item.nodeid: [group_of(item), kind_of(item)] for item in items}
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


def _running(units: list[dict[str, bool]]) -> bool:
    """Whether a unit handed out is not done yet (a unit maps its tests to whether each is done)."""
    return any(not all(unit.values()) for unit in units)


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadgroup" or _STASH not in config.stash:
        return None
    from xdist.scheduler import LoadScopeScheduling

    directory = config.stash[_STASH]

    class GroupScheduling(LoadScopeScheduling):
        """xdist's scheduling by scope, with the scopes and the order of work read from the workers' plan."""

        _plan: dict[str, list] | None = None

        def _read_plan(self) -> dict[str, list]:
            if self._plan is None:
                plans = sorted(directory.glob("*.json"))
                if not plans:
                    raise RuntimeError(f"no worker wrote its test plan to {directory}: is tests/conftest.py loaded?")
                self._plan = json.loads(plans[0].read_text())
            return self._plan

        def _split_scope(self, nodeid: str) -> str:
            return self._read_plan().get(nodeid, [None])[0] or nodeid

        _kinds: dict[str, str] | None = None
        _heavy: list[dict[str, bool]] = []  # the heavy units handed out: done when every test in them is
        _slow: list[dict[str, bool]] = []  # the slow units handed out while a heavy one ran

        def _kind(self, unit: dict[str, bool]) -> str:
            kinds = {self._read_plan().get(nodeid, [None, SHORT])[1] for nodeid in unit}
            return HEAVY if HEAVY in kinds else SLOW if SLOW in kinds else SHORT

        def _assign_work_unit(self, node: Any) -> None:
            # Which unit next: the heavy group first; while it runs, short tests; otherwise slow ones first.
            # Within a kind, collection order.
            if self._kinds is None:  # the first call: the queue holds every unit
                self._kinds = {scope: self._kind(unit) for scope, unit in self.workqueue.items()}
            left = {kind: 0 for kind in (HEAVY, SLOW, SHORT)}
            for scope in self.workqueue:
                left[self._kinds[scope]] += 1
            heavy_running = _running(self._heavy)
            if heavy_running and _running(self._slow):
                order = [HEAVY, SHORT, SLOW]
            else:  # beside a heavy one, one slow unit at a time; else the slow ones first
                order = [HEAVY, SLOW, SHORT]
            wanted = next(kind for kind in order if left[kind])
            scope = next(s for s in self.workqueue if self._kinds[s] == wanted)
            self.workqueue.move_to_end(scope, last=False)
            if wanted == HEAVY:
                self._heavy = [*self._heavy, self.workqueue[scope]]
            elif wanted == SLOW and heavy_running:
                self._slow = [*self._slow, self.workqueue[scope]]
            super()._assign_work_unit(node)

    config.option.loadscopereorder = False  # the order is ours
    return GroupScheduling(config, log)
