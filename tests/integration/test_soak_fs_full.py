"""#30 (the 30-minute run): the fs-full fault leaves no tmpfs mounted behind it.

Each `fs-full` fault mounts a 64 MiB tmpfs in the soak's working directory, fills it and
points a real `tensorpool produce` at it. The 30-minute run injected it 10 times and left 9
mounts stacked on the same directory (only the last one was unmounted at the end), so the
working directory could not be removed: 2 leftovers. Each fault now unmounts its own tmpfs.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from tensorpool.commands.soak import Injector

pytestmark = pytest.mark.slow


def _mounts_under(path: Path) -> list[str]:
    text = Path("/proc/self/mounts").read_text()
    return [ln for ln in text.splitlines() if ln.split()[1].startswith(str(path))]


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("mount") is None, reason="needs root to mount a tmpfs"
)
def test_30_each_fs_full_fault_unmounts_its_tmpfs(tmp_path: Path) -> None:
    topo = SimpleNamespace(client_args={"a": ("--aeron-dir", str(tmp_path / "no-aeron"))})
    injector = Injector(topo, tmp_path, random.Random(1))  # type: ignore[arg-type]
    try:
        for _ in range(2):
            note = injector._fs_full()
            assert note.startswith("filled"), note
            assert _mounts_under(tmp_path) == [], note
        injector.cleanup()
        assert _mounts_under(tmp_path) == []
    finally:
        for _ in _mounts_under(tmp_path):  # only ours: the mount point is in this test's dir
            subprocess.run(["umount", str(tmp_path / "fsfull")], check=False)
