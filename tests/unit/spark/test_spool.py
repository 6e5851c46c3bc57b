"""#13.6 read-time loss reports leave no file behind; old file spools are swept, only if proven."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tensorpool.spark_source.rings import spool


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _bound(address: str) -> bool:
    """Whether an abstract Unix socket of that name exists (``/proc/net/unix``)."""
    return ("@" + address.removeprefix("@")) in Path("/proc/net/unix").read_text()


def test_reports_reach_the_reader_and_leave_no_file(tmp_path: Path) -> None:
    """#13.6: the spool is an abstract socket: reports reach the reader and stay until an offset
    records them (``forget``); nothing is ever created under shmBaseDir, and closing the spool
    (or the process ending) leaves nothing."""
    addr = spool.make_spool(str(tmp_path), "pulse")
    try:
        spool.report(addr, 7, 1, 3)
        spool.report(addr, 7, 1, 2)
        spool.report(addr, 8, 1, 4)
        late, tokens = spool.collect(addr, (7,))
        assert late == {7: 5} and len(tokens) == 3
        assert spool.collect(addr, (7,))[0] == {7: 5}  # not recorded yet: counted again
        spool.forget(tokens)
        assert spool.collect(addr, (7,)) == ({}, [])
        spool.report(addr, 7, 1, 1)
        assert spool.collect(addr, (7,))[0] == {7: 1}
        assert os.listdir(tmp_path) == []
        assert _bound(addr)
    finally:
        spool.remove_spool(addr)
    assert not _bound(addr)
    spool.report(addr, 7, 1, 1)  # the reader is gone: logged, not raised, nothing created
    assert os.listdir(tmp_path) == []


def test_reader_process_ending_on_sigterm_leaves_nothing(tmp_path: Path) -> None:
    """#13.6: a reader killed with SIGTERM (how Spark stops it: no cleanup code runs) leaves no
    spool behind, with reports pending."""
    code = (
        "import sys, time; from tensorpool.spark_source.rings import spool;"
        "a = spool.make_spool(sys.argv[1]); spool.report(a, 1, 1, 1);"
        "print(a, flush=True); time.sleep(600)"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        addr = child.stdout.readline().strip()
        assert _bound(addr)
        child.terminate()
        assert child.wait(30) != 0
        assert not _bound(addr)
        assert os.listdir(tmp_path) == []
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to send as another user")
def test_reports_of_another_user_are_ignored(tmp_path: Path) -> None:
    """#13.6 (the socket has no file mode): only processes of the reader's user count."""
    addr = spool.make_spool(str(tmp_path))
    try:
        code = (
            "import os, sys; from tensorpool.spark_source.rings import spool;"
            "os.setuid(65534); spool.report(sys.argv[1], 7, 1, 9)"
        )
        subprocess.run([sys.executable, "-c", code, addr], check=True, timeout=60)
        spool.report(addr, 7, 1, 1)
        assert spool.collect(addr, (7,))[0] == {7: 1}
    finally:
        spool.remove_spool(addr)


def test_next_reader_sweeps_only_proven_file_spools_of_dead_readers(tmp_path: Path) -> None:
    """#13.6: file spools of tensorpool before issue #13 are removed by the next reader when their
    reader is gone; a live reader's, anything not named like one, and one holding files a spool
    never has are kept."""
    root = tmp_path / spool.SPOOL_ROOT
    dead = _dead_pid()
    stale = root / f"{dead}-pulse-0123456789ab"
    stale.mkdir(parents=True)
    (stale / f"7-1-{dead}-{'a' * 32}.json").write_text("{}")
    (stale / ".tmp-abc_12").write_text("")
    live = root / f"{os.getpid()}-0123456789ab"
    live.mkdir()
    other = root / "notes"
    other.mkdir()
    odd = root / f"{dead}-fedcba987654"
    odd.mkdir()
    (odd / "precious.txt").write_text("x")
    spool.remove_spool(spool.make_spool(str(tmp_path)))
    assert not stale.exists()
    assert live.exists() and other.exists() and odd.exists()
    for d in (live, other, odd):
        for f in d.iterdir():
            f.unlink()
        d.rmdir()
    spool.remove_spool(spool.make_spool(str(tmp_path)))
    assert not root.exists()  # the empty root goes too
