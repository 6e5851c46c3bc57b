"""#18.3: two "hosts", one Spark cluster with two executor JVMs, streams read over Flight.

Each host is ``serve_host.py`` in its own mount namespace (``unshare -m``) with a private
tmpfs holding its SHM and Aeron directories, running a media driver, a producer and
``tensorpool serve`` on a loopback port. Spark (``cluster_driver.py``, ``local-cluster[2,1,1024]``)
runs outside both namespaces: its driver and executors cannot map either stream's shared
memory, so every frame travels through Flight. One query reads one stream from each host:

1. it reads the first frames of both;
2. host A's server is killed and restarted while frames keep coming: the query retries and
   goes on, with every frame exactly once;
3. the sink fails on a batch (after Spark logged its offsets); the query restarted from its
   checkpoint replays that batch with exactly the frames it had, then reads on;
4. host A's server is killed for good: the query fails naming the host, once its retry time
   (``flightRetryMs``) is spent.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from jsonlines_proc import JsonLinesProcess
from netports import free_port

from tensorpool.transport.process import stop_process

pytestmark = pytest.mark.spark

HERE = Path(__file__).resolve().parent
SERVE_HOST = str(HERE / "serve_host.py")
CLUSTER_DRIVER = str(HERE / "cluster_driver.py")
SA, SB = 183, 184


def _can_unshare() -> bool:
    return os.geteuid() == 0 and shutil.which("unshare") is not None


class Host(JsonLinesProcess):
    def __init__(self, mount: Path, sid: int, port: int) -> None:
        mount.mkdir()
        cmd = ["unshare", "-m", "--propagation", "private", sys.executable, SERVE_HOST]
        cmd += ["--mount", str(mount), "--stream-id", str(sid), "--port", str(port)]
        super().__init__(cmd)
        self.ready = self.wait_event("ready", 120)
        self.mount = mount

    def do(self, cmd: str, event: str) -> dict[str, Any]:
        self.proc.stdin.write(cmd + "\n")  # type: ignore[union-attr]
        return self.next_event(event, 120)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.do("exit", "closed")
                self.proc.wait(30)
            except (AssertionError, OSError):
                pass
        stop_process(self.proc)


def _seen(drv: JsonLinesProcess, since: int = 0) -> dict[int, list[list[int]]]:
    """Batches reported so far (a replayed batch id overwrites the earlier report)."""
    out: dict[int, list[list[int]]] = {}
    for ev in drv.events[since:]:
        if ev["event"] == "batch":
            out[ev["id"]] = ev["rows"]
    return out


def _wait_rows(drv: JsonLinesProcess, want: set[tuple[int, int]], since: int = 0) -> None:
    """Until the batches reported so far hold ``want``; a query failure after event ``since``
    fails the test."""
    import time

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        got = {tuple(r) for rows in _seen(drv).values() for r in rows}
        if want <= got:
            return
        failed = [e for e in drv.events[since:] if e["event"] == "failed"]
        assert not failed, failed
        with contextlib.suppress(AssertionError):
            drv.next_event("batch", 5)
    raise AssertionError(f"missing {sorted(want - got)[:10]}")


@pytest.mark.skipif(not _can_unshare(), reason="needs root and unshare(1) for mount namespaces")
def test_18_3_two_hosts_two_executors_over_flight(tmp_path: Path) -> None:
    pa_, pb_ = free_port(), free_port()
    hosts: list[Host] = []
    drv: JsonLinesProcess | None = None
    app_dir: str | None = None
    import pyspark

    home = os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__)
    work_existed = os.path.isdir(os.path.join(home, "work"))
    try:
        ha = Host(tmp_path / "hostA", SA, pa_)
        hosts.append(ha)
        hb = Host(tmp_path / "hostB", SB, pb_)
        hosts.append(hb)
        here_ns = os.readlink("/proc/self/ns/mnt")
        assert len({ha.ready["mnt_ns"], hb.ready["mnt_ns"], here_ns}) == 3
        assert os.listdir(ha.mount) == []  # Spark's side sees nothing of host A's SHM
        ha.do("produce 20", "produced")
        hb.do("produce 20", "produced")

        drv = JsonLinesProcess([sys.executable, CLUSTER_DRIVER])
        ready = drv.wait_event("ready", 180)
        app_dir = ready["app_dir"]
        assert ready["executors"] == 2
        a, b = f"127.0.0.1:{pa_}", f"127.0.0.1:{pb_}"
        options = {
            "hosts": f"{a},{b}",
            "streams": f"{a}/{SA},{b}/{SB}",
            "startingOffsets": "earliest",
            "maxFramesPerTrigger": "16",
            "flightRetryMs": "20000",
        }
        ckpt = str(tmp_path / "ckpt")
        start = {"options": options, "checkpoint": ckpt, "fail_at": {"stream": SA, "seq": 27}}
        import json

        drv.proc.stdin.write("start " + json.dumps(start) + "\n")  # type: ignore[union-attr]
        drv.wait_event("started", 120)
        _wait_rows(drv, {(s, q) for s in (SA, SB) for q in range(20)})

        # 2. host A's server dies and comes back while frames keep coming
        ha.do("kill-serve", "serve-killed")
        ha.do("produce 10", "produced")
        hb.do("produce 10", "produced")
        ha.do("start-serve", "serve-started")
        # 3. the sink fails on the batch holding frame (SA, 27): Spark logged its offsets
        attempt = drv.wait_event("attempt", 180)
        failed = drv.wait_event("failed", 120)
        assert "simulated crash" in failed["message"]
        before = _seen(drv)
        assert attempt["id"] not in before
        assert [SA, 27] in attempt["rows"]

        mark = len(drv.events)
        start = {"options": options, "checkpoint": ckpt}
        drv.proc.stdin.write("start " + json.dumps(start) + "\n")  # type: ignore[union-attr]
        replay = drv.next_event("batch", 180)
        assert replay["id"] == attempt["id"]
        assert replay["rows"] == attempt["rows"]  # exactly the frames of the logged batch
        _wait_rows(drv, {(s, q) for s in (SA, SB) for q in range(30)}, mark)
        batches = {**before, **_seen(drv, mark)}
        rows = sorted(tuple(r) for rs in batches.values() for r in rs)
        assert rows == sorted((s, q) for s in (SA, SB) for q in range(30))  # each once
        assert all(ev.get("bad", 0) == 0 for ev in drv.events if ev["event"] == "batch")

        # 4. host A's server gone for good: the query fails naming it
        drv.proc.stdin.write("stop\n")  # type: ignore[union-attr]
        drv.next_event("stopped", 120)
        options["flightRetryMs"] = "3000"
        drv.proc.stdin.write("start " + json.dumps({"options": options, "checkpoint": ckpt}) + "\n")  # type: ignore[union-attr]
        drv.next_event("started", 120)
        ha.do("kill-serve", "serve-killed")
        ha.do("produce 5", "produced")
        failed = drv.next_event("failed", 180)
        assert f"tensorpool serve at {a} did not answer" in failed["message"], failed
    finally:
        if drv is not None:
            try:
                drv.proc.stdin.write("exit\n")  # type: ignore[union-attr]
                drv.proc.stdin.flush()  # type: ignore[union-attr]
                drv.proc.wait(90)
            except Exception:
                pass
            stop_process(drv.proc)
        for h in hosts:
            h.close()
        if app_dir is not None and os.path.basename(app_dir).startswith("app-"):
            shutil.rmtree(app_dir, ignore_errors=True)  # this run's executor logs
            if not work_existed:
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.dirname(app_dir))  # made by this run, and empty now
