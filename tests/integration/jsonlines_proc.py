"""A child process that reports one JSON object per stdout line (``{"event": ...}``).

Shared by the test harnesses that drive scripted role processes and daemons with ``--json``
(roles.py, spark_roles.py, ``tensorpool ratelimiter``), imported as a plain module like
driver_fixtures.
"""

from __future__ import annotations

import json
import select
import subprocess
import time
from typing import IO, Any


class JsonLinesProcess:
    def __init__(self, cmd: list[str], *, stdin: int = subprocess.PIPE, stderr: int | None = None):
        self.proc = subprocess.Popen(
            cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=stderr, text=True, bufsize=1
        )
        self.events: list[dict[str, Any]] = []

    @property
    def stdout(self) -> IO[str]:
        assert self.proc.stdout is not None
        return self.proc.stdout

    def wait_event(self, name: str, timeout: float = 30.0) -> dict[str, Any]:
        """The first ``name`` event the process ever reported (waiting for it if need be)."""
        return self._event(name, timeout, 0)

    def next_event(self, name: str, timeout: float = 60.0) -> dict[str, Any]:
        """The next ``name`` event after everything read so far (for repeated events)."""
        return self._event(name, timeout, len(self.events))

    def _event(self, name: str, timeout: float, start: int) -> dict[str, Any]:
        for ev in self.events[start:]:
            if ev.get("event") == name:
                return ev
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r, _, _ = select.select([self.stdout], [], [], 0.1)
            if not r:
                if self.proc.poll() is not None:
                    break
                continue
            line = self.stdout.readline()
            if not line:
                break
            ev = json.loads(line)
            self.events.append(ev)
            if ev.get("event") == name:
                return ev
        raise AssertionError(
            f"no {name!r} event (exit {self.proc.poll()}); got {self.events}{self.diagnostics()}"
        )

    def diagnostics(self) -> str:
        """Extra text for a failed wait (subclasses: e.g. the child's stderr)."""
        return ""

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
