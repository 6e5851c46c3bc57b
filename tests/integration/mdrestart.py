"""Test-side helpers for killing and restarting an external media driver under live daemons
(#26.2, #26.4): every process is the real ``python -m tensorpool ...`` command, its output in a
file (a pipe nobody reads could block it), and JSON report lines read back from that file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from tensorpool.transport.cnc import read_cnc_identity
from tensorpool.transport.mediadriver import is_active
from tensorpool.transport.process import stop_process


class Cli:
    """One ``python -m tensorpool`` process with stdout and stderr in files."""

    def __init__(self, work: str, name: str, *args: str) -> None:
        self.out = os.path.join(work, f"{name}.out")
        self.err = os.path.join(work, f"{name}.err")
        with open(self.out, "ab") as out, open(self.err, "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tensorpool", *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
            )

    def lines(self) -> list[dict[str, Any]]:
        """The JSON objects printed so far (non-JSON lines are skipped)."""
        out: list[dict[str, Any]] = []
        with open(self.out, errors="replace") as f:
            for line in f:
                line = line.strip()
                if line.startswith("{") and line.endswith("}"):
                    try:
                        out.append(json.loads(line))
                    except ValueError:
                        continue
        return out

    def text(self) -> str:
        with open(self.out, errors="replace") as f, open(self.err, errors="replace") as g:
            return (
                f"exit {self.proc.poll()}\n--- stdout\n{f.read()[-3000:]}\n--- stderr\n"
                + (g.read()[-3000:])
            )

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        stop_process(self.proc, 20)


def wait_for(pred: Callable[[], object], timeout: float, what: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(what())


def start_media_driver(work: str, aeron_dir: str, name: str, timeout: float = 30) -> Cli:
    md = Cli(work, name, "mediadriver", "--aeron-dir", aeron_dir)

    def serving() -> bool:  # this process's driver, not a killed predecessor's cnc.dat
        identity = read_cnc_identity(aeron_dir)
        return identity is not None and identity.pid == md.proc.pid and is_active(aeron_dir)

    wait_for(lambda: serving() or md.proc.poll() is not None, timeout, md.text)
    assert md.proc.poll() is None, md.text()
    return md


def frames(proc: Cli, key: str = "frames") -> int:
    """The newest cumulative frame count a ``--json`` reporter printed (0 before any)."""
    counts = [int(line[key]) for line in proc.lines() if isinstance(line.get(key), int)]
    return counts[-1] if counts else 0
