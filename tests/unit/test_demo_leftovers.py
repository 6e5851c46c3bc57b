"""`tensorpool demo` removes the working directories of earlier demos that were killed, and
nothing else (deleting is privileged: only what a demo provably made). #30: the proof is the
wake-semaphore sweep's (owner uid, pid namespace, process start tick), not a pid alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tensorpool.commands.demo import OWNER_FILE, claim_demo_dir, remove_dead_demos
from tensorpool.transport.process import creator_stamp, pid_namespace, proc_stat


def _dead_pid() -> int:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return gone.pid


def _dir(root: Path, name: str, owner: str | None, stamp: int | None = None) -> Path:
    """A directory shaped like a demo's; ``owner`` is the text of its :data:`OWNER_FILE`,
    stamped by default as a process of this pid namespace (any start tick)."""
    path = root / name
    (path / "shm").mkdir(parents=True)
    (path / "driver.toml").write_text("x")
    if owner is not None:
        f = path / OWNER_FILE
        f.write_text(owner)
        ns = creator_stamp(pid_namespace(), 12345) if stamp is None else stamp
        os.utime(f, ns=(ns, ns))
    return path


def test_only_directories_of_dead_demos_are_removed(tmp_path: Path) -> None:
    dead = _dir(tmp_path, "tensorpool-demo-dead", str(_dead_pid()))
    alive = tmp_path / "tensorpool-demo-alive"  # a demo still running: this process
    alive.mkdir()
    claim_demo_dir(alive)
    unmarked = _dir(tmp_path, "tensorpool-demo-unmarked", None)  # not provably a demo's
    other = _dir(tmp_path, "someone-else", str(_dead_pid()))  # not named like a demo's
    assert remove_dead_demos(str(tmp_path)) == [str(dead)]
    assert not dead.exists() and alive.exists() and unmarked.exists() and other.exists()


def test_30_a_reused_pid_is_told_apart_by_its_start_tick(tmp_path: Path) -> None:
    """#30: a live process holding the recorded pid is the demo only if it started at the
    stamped tick; the same pid with another start tick is a reused pid (the demo is gone)."""
    me = proc_stat(os.getpid())
    assert me is not None
    same = _dir(
        tmp_path, "tensorpool-demo-same", str(os.getpid()), creator_stamp(pid_namespace(), me[1])
    )
    reused = _dir(
        tmp_path,
        "tensorpool-demo-reused",
        str(os.getpid()),
        creator_stamp(pid_namespace(), me[1] + 1),
    )
    assert remove_dead_demos(str(tmp_path)) == [str(reused)]
    assert same.exists()


@pytest.mark.skipif(os.getuid() != 0, reason="chown to another uid needs root")
@pytest.mark.parametrize("what", ["dir", "owner_file"])
def test_30_another_users_directory_is_kept(tmp_path: Path, what: str) -> None:
    """#30: a dead demo's directory (or its pid file) owned by another uid (65534, as root
    before) is not ours to remove."""
    path = _dir(tmp_path, "tensorpool-demo-nobody", str(_dead_pid()))
    os.chown(path if what == "dir" else path / OWNER_FILE, 65534, 65534)
    assert remove_dead_demos(str(tmp_path)) == []
    assert (path / "driver.toml").exists()


@pytest.mark.parametrize("pid", ["0", "-1"])
def test_30_a_pid_that_is_not_a_process_is_not_dead(tmp_path: Path, pid: str) -> None:
    """#30: ``0`` and ``-1`` name process groups, not a process: nothing proves the demo that
    wrote them gone (``demo.pid`` of 0 or -1 counted as dead before)."""
    path = _dir(tmp_path, "tensorpool-demo-group", pid)
    assert remove_dead_demos(str(tmp_path)) == []
    assert path.exists()


@pytest.mark.parametrize("stamp", ["other_namespace", "unstamped"])
def test_30_a_demo_of_another_pid_namespace_is_kept(tmp_path: Path, stamp: str) -> None:
    """#30: a pid recorded in another pid namespace (a container sharing /dev/shm) means
    nothing here: a live demo there was removed from here before. Unstamped files (older
    versions) are not provable either."""
    ns = creator_stamp(pid_namespace() + 1, 12345) if stamp == "other_namespace" else None
    path = _dir(tmp_path, "tensorpool-demo-elsewhere", str(_dead_pid()), ns)
    if ns is None:
        os.utime(path / OWNER_FILE)  # now: a plain mtime
    assert remove_dead_demos(str(tmp_path)) == []
    assert path.exists()


@pytest.mark.parametrize("link", ["dir", "owner_file"])
def test_30_symlinks_are_never_followed_nor_reported(tmp_path: Path, link: str) -> None:
    """#30: a demo-named symlink to a dead demo's directory elsewhere (or a pid file that is a
    link) is kept, its target too, and not reported removed (it was reported before)."""
    root, elsewhere = tmp_path / "root", tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    target = _dir(elsewhere, "tensorpool-demo-target", str(_dead_pid()))
    if link == "dir":
        entry = root / "tensorpool-demo-link"
        entry.symlink_to(target)
    else:
        entry = _dir(root, "tensorpool-demo-linked-pid", None)
        (entry / OWNER_FILE).symlink_to(target / OWNER_FILE)
    assert remove_dead_demos(str(root)) == []
    assert entry.exists() and (target / "driver.toml").exists()
