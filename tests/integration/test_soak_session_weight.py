"""#30.1 (the soak's Spark leg under load): a part of many processes gets its session's weight.

Every soak part runs in a session of its own, and with Linux autogroups the kernel shares the
CPU between sessions: the Spark query's driver, JVM and Python workers together got what one
producer gets (1/27 of the CPU at the soak's own load), and Spark's streaming-source Python
worker missed Spark's fixed 10 s connect-back. The soak sets the weight of the part's session
(``Role.session_nice``, -10 for Spark); here a positive value, which needs no privilege,
checks that the weight reaches the session and what its children start later.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from tensorpool.commands.soak import SPARK_SESSION_NICE, Role, Topology, build

AUTOGROUPS = Path("/proc/sys/kernel/sched_autogroup_enabled")

pytestmark = pytest.mark.skipif(
    not AUTOGROUPS.exists() or AUTOGROUPS.read_text().strip() == "0",
    reason="the kernel has no autogroups (it shares the CPU per process)",
)

#: the part forks a child after its start: the child is in the same session, so it must get
#: the weight too (Spark's JVM starts its Python workers long after the query's process)
CHILD = (
    "import pathlib, subprocess, sys, time; time.sleep(0.5); "
    "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
    "pathlib.Path(sys.argv[1]).write_text(str(p.pid)); p.wait()"
)


def _nice(pid: int) -> int:
    return int(Path(f"/proc/{pid}/autogroup").read_text().split("nice")[1])


def test_30_1_part_session_weight_reaches_the_session_and_its_later_children(
    tmp_path: Path,
) -> None:
    (tmp_path / "logs").mkdir()
    topo = Topology(tmp_path)
    pid_file = tmp_path / "child.pid"
    topo.add(Role("many", "spark", [sys.executable, "-c", CHILD, str(pid_file)], session_nice=7))
    topo.add(Role("one", "producer", [sys.executable, "-c", "import time; time.sleep(60)"]))
    many, one = topo.start("many"), topo.start("one")
    try:
        deadline = time.monotonic() + 120  # a loaded host starts Python slowly
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline and many.proc.poll() is None
            time.sleep(0.1)
        child = int(pid_file.read_text())
        assert _nice(many.proc.pid) == 7
        assert _nice(child) == 7  # the child joined the session's group after the weight
        assert _nice(one.proc.pid) == 0  # another part's session is left alone
        assert topo.session_weight == {"session_nice": 7}
    finally:
        topo.stop_all(["many", "one"])


def test_30_1_spark_query_session_weighs_as_its_processes(tmp_path: Path) -> None:
    topo = build(tmp_path)
    if "spark" not in topo.roles:
        pytest.skip("the Spark extra is not installed")
    assert topo.roles["spark"].session_nice == SPARK_SESSION_NICE < 0
    assert all(r.session_nice == 0 for n, r in topo.roles.items() if n != "spark")
