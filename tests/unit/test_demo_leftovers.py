"""`tensorpool demo` removes the working directories of earlier demos that were killed, and
nothing else (deleting is privileged: only what a demo provably made)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tensorpool.commands.demo import OWNER_FILE, remove_dead_demos


def _dir(root: Path, name: str, owner: int | None) -> Path:
    path = root / name
    (path / "shm").mkdir(parents=True)
    (path / "driver.toml").write_text("x")
    if owner is not None:
        (path / OWNER_FILE).write_text(str(owner))
    return path


def test_only_directories_of_dead_demos_are_removed(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = _dir(tmp_path, "tensorpool-demo-dead", gone.pid)
    alive = _dir(tmp_path, "tensorpool-demo-alive", os.getpid())  # a demo still running
    unmarked = _dir(tmp_path, "tensorpool-demo-unmarked", None)  # not provably a demo's
    other = _dir(tmp_path, "someone-else", gone.pid)  # not named like a demo's
    assert remove_dead_demos(str(tmp_path)) == [str(dead)]
    assert not dead.exists() and alive.exists() and unmarked.exists() and other.exists()
