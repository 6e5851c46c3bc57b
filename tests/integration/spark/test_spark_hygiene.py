"""#13.6 nothing is left behind: the source runner exits with its query or its JVM, no spool stays.

Real parts: a standalone media driver, real producer processes, a real local SparkSession, real
child processes signalled or orphaned.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from spark_helpers import (
    BatchLog,
    ProducerProc,
    process_alive,
    source_options,
    start_query,
    wait_gone,
    wait_query,
)

from tensorpool.spark_source.rings import spool

RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"

# Holds an attachment (standalone: no producer needed) with its polling thread running.
ATTACHED = textwrap.dedent(
    """
    import sys, time
    from tensorpool.client.settings import ClientSettings
    from tensorpool.spark_source.rings import spool
    from tensorpool.spark_source.rings.attach import open_attachment
    from tensorpool.transport.config import TransportConfig

    aeron_dir, shm = sys.argv[1], sys.argv[2]
    s = ClientSettings(transport=TransportConfig(aeron_dir=aeron_dir), shm_base_dir=shm)
    att = open_attachment((4242,), s, driver=False)
    addr = spool.make_spool(shm)
    spool.report(addr, 4242, 1, 3)  # a loss report not folded into an offset yet
    print(addr, flush=True)
    while True:
        time.sleep(0.05)
        att.layouts()
    """
)


def test_sigterm_terminates_a_process_holding_an_attachment(spark_media_driver, tmp_shm):
    """#13.6: tensorpool installs no SIGTERM handler (one that waited on a lock kept runners alive
    for hours): SIGTERM, twice in a row as Spark's stop sends it, ends the process at once."""
    child = subprocess.Popen(
        [sys.executable, "-c", ATTACHED, spark_media_driver.dir, tmp_shm],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip()
        child.send_signal(signal.SIGTERM)
        child.send_signal(signal.SIGTERM)
        assert child.wait(30) == -signal.SIGTERM
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_spark_worker_exits_when_its_parent_goes_away(spark_media_driver, tmp_shm):
    """#13.6: in a process the JVM started (PYTHON_WORKER_FACTORY_* set), the first attachment
    starts a parent watch: when the parent dies (SIGKILL, as a crashed JVM), the worker exits
    instead of living on, re-parented, and leaves nothing (its loss spool is a socket)."""
    parent_code = textwrap.dedent(
        """
        import os, subprocess, sys, time
        env = {**os.environ, "PYTHON_WORKER_FACTORY_PORT": "1"}
        child = subprocess.Popen([sys.executable, "-c", sys.argv[1], *sys.argv[2:]], env=env,
                                 stdout=subprocess.PIPE, text=True)
        print(child.pid, child.stdout.readline().strip(), flush=True)
        time.sleep(600)
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_code, ATTACHED, spark_media_driver.dir, tmp_shm],
        stdout=subprocess.PIPE,
        text=True,
    )
    worker = None
    try:
        assert parent.stdout is not None
        pid, addr = parent.stdout.readline().split()
        worker = int(pid)
        assert addr in Path("/proc/net/unix").read_text()
        parent.kill()
        parent.wait()
        assert wait_gone(worker), "the worker outlived its parent"
        # the kernel frees an exited process's socket on its own time (seen listed after the
        # worker was a zombie, at load 30): gone within a bound, not at once
        deadline = time.monotonic() + 15
        while addr in Path("/proc/net/unix").read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert addr not in Path("/proc/net/unix").read_text()
        assert os.listdir(tmp_shm) == []
    finally:
        if worker is not None and process_alive(worker):
            os.kill(worker, signal.SIGKILL)
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def _runners() -> set[int]:
    """Source runner processes that are children of this session's JVM (and not zombies)."""
    from pyspark import SparkContext

    jvm = str(SparkContext._gateway.proc.pid)  # type: ignore[union-attr]
    out: set[int] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            if (
                stat[1] == jvm
                and stat[0] != "Z"
                and RUNNER.encode() in (proc / "cmdline").read_bytes()
            ):
                out.add(int(proc.name))
        except OSError:
            continue
    return out


def test_stopped_and_failed_queries_leave_no_runner_and_no_spool(
    spark, spark_media_driver, tmp_shm
):
    """#13.6: the source runner of a stopped query and of a failed query exits, and neither
    leaves a loss spool behind (``.spark-loss`` was one; they are sockets now)."""
    md = spark_media_driver
    producer = ProducerProc(md.dir, tmp_shm, "--stream-id", "61")
    try:
        producer.produce_at(1_000_000, 20.0)  # the ring holds 3 s: no loss
        opts = source_options(md, tmp_shm, streams="61", failOnDataLoss="false")
        for fail in (False, True):
            before = _runners()
            sink = BatchLog(fail_on=1 if fail else None)
            with tempfile.TemporaryDirectory(prefix="tp-hyg-ckpt-") as ckpt:
                q = start_query(spark, opts, sink, ckpt)
                try:
                    if fail:
                        deadline = time.monotonic() + 90
                        while q.isActive and time.monotonic() < deadline:
                            time.sleep(0.1)
                        assert q.exception() is not None
                    else:
                        wait_query(lambda s=sink: len(s.batches) >= 2, q)
                    mine = _runners() - before
                    if not fail:
                        assert len(mine) == 1
                finally:
                    q.stop()
                for pid in mine:
                    assert wait_gone(pid), f"source runner {pid} outlived its query"
            assert not os.path.exists(os.path.join(tmp_shm, spool.SPOOL_ROOT))
    finally:
        producer.close()
