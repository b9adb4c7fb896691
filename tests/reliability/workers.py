"""Worker processes as a fault run sees them: start, ``kill -9``, stop, restart, scrape."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.reliability.services import free_port

_SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?P<labels>.*)\})? (?P<value>\S+)$')
_LABEL = re.compile(r'(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Samples of a Prometheus text exposition: (name, labels, value)."""
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        labels = {m["key"]: m["value"] for m in _LABEL.finditer(match["labels"] or "")}
        samples.append((match["name"], labels, float(match["value"])))
    return samples


def metric_total(text: str, name: str, **labels: str) -> float:
    return sum(v for n, ls, v in parse_metrics(text) if n == name and all(ls.get(k) == x for k, x in labels.items()))


class WorkerProcess:
    """One ``stream-dp run`` process slot; restarts reuse the slot's log file and metrics port."""

    def __init__(self, name: str, config_path: Path, env: dict[str, str], log_dir: Path, *,
                 module: str = "stream_dp.cli.main") -> None:
        """``module``: what ``python -m`` runs with ``run --config`` (the audit's doctored builds run another)."""
        self.name = name
        self.module = module
        self.config_path = config_path
        self.metrics_port = free_port()
        self.env = dict(env, STREAM_DP_METRICS_PORT=str(self.metrics_port))
        self.log_path = log_dir / f"{name}.log"
        self.starts = 0
        self.exits: list[int] = []  # return codes of earlier incarnations (-9: killed by us)
        self._process: subprocess.Popen | None = None
        self._slot_lock = threading.Lock()

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> None:
        if self.alive:
            raise RuntimeError(f"worker {self.name} is already running")
        with open(self.log_path, "ab") as log:
            log.write(f"=== start {self.starts + 1} at {time.time():.3f}\n".encode())
            log.flush()
            self._process = subprocess.Popen(
                [sys.executable, "-m", self.module, "run", "--config", str(self.config_path)],
                env=self.env, stdout=subprocess.DEVNULL, stderr=log, cwd=Path(__file__).resolve().parents[2],
            )
        self.starts += 1

    # A fault's threads and the harness's supervisor act on one slot at once (a kill while a leave waits for
    # the process to exit): each method works on the process it found, and empties the slot only if that
    # process is still in it.

    def _release(self, process: subprocess.Popen, code: int) -> int:
        with self._slot_lock:
            if self._process is process:
                self.exits.append(code)
                self._process = None
        return code

    def kill(self) -> None:
        """``kill -9``: no shutdown code runs."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGKILL)
        self._release(process, process.wait())

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM (a graceful leave), SIGKILL if it does not exit in time; returns the exit code."""
        process = self._process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return self._release(process, process.returncode)

    def reap(self) -> int | None:
        """The exit code if the process ended on its own since it was started (the slot is then empty)."""
        process = self._process
        if process is None or process.poll() is None:
            return None
        return self._release(process, process.returncode)

    def scrape(self, timeout_s: float = 3.0) -> str | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=timeout_s) as response:
                return response.read().decode()
        except (urllib.error.URLError, OSError):
            return None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def first_traceback(self, max_lines: int = 60) -> str | None:
        """The first traceback in the log, so a report shows it where the log is gone (CI keeps no tmp files):
        after the line before it, the record that logged it (its logger and message say who, and why), and
        with the exceptions chained to it (a library's error often wraps the one that says what happened)."""
        lines = self.log_text().splitlines()
        chained = ("Traceback", "During handling", "The above exception")
        for start, line in enumerate(lines):
            if "Traceback" in line:
                block = lines[max(0, start - 1):start + 1]
                following = lines[start + 1:start + max_lines]
                for index, text in enumerate(following):
                    block.append(text)
                    if text and not text.startswith((" ", *chained)):  # an exception line
                        rest = [t for t in following[index + 1:index + 3] if t]
                        if not rest or not rest[0].startswith(chained):
                            break  # nothing chained to it: the traceback ends here
                return "\n".join(block)
        return None

    def wait_for_log(self, needle: str, timeout_s: float, *, after: int = 0) -> bool:
        """Whether ``needle`` appears in the log past byte ``after`` within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        encoded = needle.encode()
        while time.monotonic() < deadline:
            data = self.log_path.read_bytes() if self.log_path.exists() else b""
            if encoded in data[after:]:
                return True
            if not self.alive:
                return False
            time.sleep(0.1)
        return False

    def log_size(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0
