"""The worker's Redis rule against the commands its code and scripts issue."""

from __future__ import annotations

import re
from pathlib import Path

from stream_dp.worker.access.redis_plan import WORKER_COMMANDS, key_patterns, worker_redis_rule

PACKAGE = Path(__file__).resolve().parents[3] / "stream_dp"
_SCRIPT_CALL = re.compile(r"(?:redis\.p?call|rcall)\(\s*'([A-Za-z]+)'")
#: The operator's ``stream-dp budget reset`` runs this one, as another user.
OPERATOR_SCRIPTS = {"reset.lua"}


def script_commands() -> dict[str, set[str]]:
    """Every command a Lua script of the package runs, by file (``.lua`` files and scripts inside ``.py``)."""
    found: dict[str, set[str]] = {}
    for path in [*PACKAGE.rglob("*.lua"), *PACKAGE.rglob("*.py")]:
        if path.name in OPERATOR_SCRIPTS:
            continue
        names = {name.lower() for name in _SCRIPT_CALL.findall(path.read_text())}
        if names:
            found[str(path.relative_to(PACKAGE))] = names
    return found


def test_every_command_the_worker_scripts_run_is_in_the_rule():
    found = script_commands()
    assert "budget/charge.lua" in found and "worker/store/ledger.py" in found, sorted(found)
    missing = {path: sorted(names - set(WORKER_COMMANDS)) for path, names in found.items() if names - set(WORKER_COMMANDS)}
    assert not missing, f"scripts run commands the worker's Redis rule does not allow: {missing}"


def test_the_scan_sees_a_command_missing_from_the_rule(tmp_path):
    """The check above fails on a doctored rule: without HSET the ledger's scripts are refused."""
    found = script_commands()
    doctored = set(WORKER_COMMANDS) - {"hset"}
    assert any("hset" in names - doctored for names in found.values())


def test_the_rule_names_only_the_worker_prefixes_and_no_dangerous_command():
    rule = worker_redis_rule("dpworker")
    assert key_patterns() == ("dp:*", "stream-dp:ledger:*", "stream-dp:periods:*")
    tokens = rule.tokens()
    assert tokens[:1] == ["resetkeys"] and "-@all" in tokens and "resetchannels" in tokens
    assert not {"+config", "+keys", "+scan", "+flushall", "+flushdb", "+eval", "+acl", "+debug"} & set(tokens)
    assert rule.acl_file_line("pw").startswith("user dpworker on >pw resetkeys ~dp:* ")
    assert "+cluster|slots" in worker_redis_rule("u", cluster=True).tokens()
