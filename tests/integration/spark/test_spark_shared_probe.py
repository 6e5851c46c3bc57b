"""#15: a batch plan reuses its process's announce probe, only while the announces are fresh.

The fixed cost of a small ``spark.read.format("tensorpool")`` query was an Aeron client, a
control subscription and publication (and closing them) plus a hello round trip, in both the
Python process that runs ``schema()`` and the one that runs ``partitions()``. Spark reuses those
processes, so :func:`~tensorpool.spark_source.rings.probe.shared_probe` keeps the probe between
plans. These tests hold it to the rules a fresh probe obeys, and to the process hygiene rules
(#13.6).

Real parts, no JVM: a standalone media driver, a producer process, the probe in this process or
in a child process.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from spark_helpers import process_alive, source_options, wait_gone

from tensorpool.spark_source.options import parse_source_options
from tensorpool.spark_source.rings import attach, lifecycle, mapped_rings
from tensorpool.spark_source.rings import probe as probes

STREAM = 151


def _probe(opts: dict[str, str], stream: int = STREAM):  # type: ignore[no-untyped-def]
    conn = parse_source_options({**opts, "streams": str(stream)}).connection

    def validate(layout: object) -> None:
        spec = mapped_rings.RegionSpec.from_layout(layout)  # type: ignore[arg-type]
        mapped_rings.mapped(spec, conn.base_dirs, revalidate=True)

    return probes.shared_probe(
        conn.client_settings(freshness_ms=int(opts.get("freshnessMs", "3000"))),
        map_layout=validate,
        is_current=mapped_rings.layout_still_mapped,
        scope=conn.base_dirs,
    )


def test_second_plan_reuses_the_probe_and_drops_layouts_gone_or_stale(
    spark_media_driver, tmp_shm, producers
):
    """The second plan gets the same Aeron client and the layout without a hello; a layout
    whose files were removed, or whose producer stopped announcing for a freshness window, is
    never handed out (the plan asks again and times out like a fresh probe)."""
    opts = source_options(spark_media_driver, tmp_shm, freshnessMs="1000")
    p = producers("--stream-id", str(STREAM), "--nslots", "8")
    try:
        with _probe(opts) as first:
            got = first.wait_for_layouts(10, (STREAM,))
            assert got[STREAM].epoch == p.epoch
        time.sleep(0.5)  # the keeper polls the periodic announces meanwhile
        with _probe(opts) as second:
            hellos = second.hellos
            assert second is first and second.context is first.context
            assert second.wait_for_layouts(10, (STREAM,))[STREAM].epoch == p.epoch
            assert second.hellos == hellos  # no round trip: the layout was fresh
            # streams="lo-hi": what was announced within the last window (#16.4)
            assert second.announced(STREAM - 1, STREAM + 1, 0.5) == (STREAM,)
            assert second.announced(STREAM + 1, STREAM + 9, 0.5) == ()
        # the producer dies and its files go: the remembered layout is not current any more
        p.proc.kill()
        p.proc.wait()
        shutil.rmtree(os.path.join(tmp_shm, os.listdir(tmp_shm)[0]))
        with _probe(opts) as third, pytest.raises(attach.StreamsNotAttached):
            third.wait_for_layouts(0.3, (STREAM,))
        # a second producer; then it stops announcing (SIGSTOP) with its files in place
        q = producers("--stream-id", str(STREAM), "--nslots", "8")
        with _probe(opts) as fourth:
            assert fourth.wait_for_layouts(10, (STREAM,))[STREAM].epoch == q.epoch
        q.proc.send_signal(signal.SIGSTOP)
        try:
            time.sleep(1.2)  # > freshnessMs since its last announce
            with _probe(opts) as fifth:
                assert fifth.announced(STREAM, STREAM, 0.5) == ()  # not announced lately
                with pytest.raises(attach.StreamsNotAttached):
                    fifth.wait_for_layouts(0.3, (STREAM,))
        finally:
            q.proc.send_signal(signal.SIGCONT)
    finally:
        lifecycle.close_all()
    assert probes.shared_probes() == 0


def test_same_epoch_from_other_files_replaces_the_remembered_layout(spark_media_driver, tmp_shm):
    """Epochs count per producer directory: a producer in another directory can announce the
    epoch the probe holds. Its announce must replace the remembered layout, not refresh it,
    even while the first producer's files are still there and its last announce is fresh."""
    from spark_helpers import ProducerProc

    opts = source_options(spark_media_driver, tmp_shm)
    dirs = [os.path.join(tmp_shm, name) for name in ("a", "b")]
    first = ProducerProc(spark_media_driver.dir, dirs[0], "--stream-id", "152", "--nslots", "8")
    second = None
    try:
        with _probe(opts, 152) as probe:
            old = probe.wait_for_layouts(10, (152,))[152]
        first.proc.kill()  # its files stay
        first.proc.wait()
        second = ProducerProc(
            spark_media_driver.dir, dirs[1], "--stream-id", "152", "--nslots", "8"
        )
        assert second.epoch == first.epoch
        time.sleep(0.5)  # it announces every 0.2 s; the keeper hears it
        with _probe(opts, 152) as probe:
            new = probe.wait_for_layouts(10, (152,))[152]
        assert new.epoch == old.epoch and new.header_region_uri != old.header_region_uri
        assert dirs[1] in new.header_region_uri
    finally:
        lifecycle.close_all()
        for p in (first, second):
            if p is not None:
                p.close()


def test_kept_metadata_tracker_waits_for_the_planned_epoch(spark_media_driver, tmp_shm, producers):
    """includeStreamMetadata on the shared probe: one tracker, kept with the probe (polled by its
    keeper between plans). It already knows the metadata of an earlier epoch of a restarted
    producer, so the plan waits for the metadata of the epoch it plans, not for any."""
    opts = source_options(spark_media_driver, tmp_shm)
    sid = 153
    p = producers("--stream-id", str(sid), "--nslots", "8", "--name", "cam", "--meta", "site=A")
    try:
        with _probe(opts, sid) as probe:
            meta = probe.meta_tracker()
            layout = probe.wait_for_layouts(10, (sid,))[sid]
            assert meta.wait((sid,), 10, probe.hello, epochs={sid: layout.epoch}) == []
            assert dict(meta.versions_for(sid, p.epoch)[-1][1]) == {"name": "cam", "site": "A"}
        p.close()
        q = producers("--stream-id", str(sid), "--nslots", "8", "--name", "cam", "--meta", "site=B")
        with _probe(opts, sid) as probe:
            assert probe.meta_tracker() is meta  # one subscription for the probe's lifetime
            layout = probe.wait_for_layouts(10, (sid,))[sid]
            assert layout.epoch == q.epoch > p.epoch
            assert meta.wait((sid,), 10, probe.hello, epochs={sid: layout.epoch}) == []
            assert dict(meta.versions_for(sid, q.epoch)[-1][1]) == {"name": "cam", "site": "B"}
    finally:
        lifecycle.close_all()
    assert probes.shared_probes() == 0


CHILD = textwrap.dedent(
    """
    import atexit, os, sys, threading, time

    # registered before tensorpool's own exit hook, so it runs after it (LIFO)
    atexit.register(lambda: print("exit", probes.shared_probes(), flush=True))
    from tensorpool.spark_source.rings import probe as probes
    from tensorpool.client.settings import ClientSettings
    from tensorpool.transport.config import TransportConfig

    aeron_dir, shm, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    probes.PROBE_IDLE_S = 0.3
    s = ClientSettings(transport=TransportConfig(aeron_dir=aeron_dir), shm_base_dir=shm)

    def keepers():
        return sum(t.name == "tensorpool-spark-probe" for t in threading.enumerate())

    def plan():
        with probes.shared_probe(s, map_layout=lambda layout: None) as probe:
            probe.hello(4343)
            return probe

    probe = plan()
    print("open", probes.shared_probes(), keepers(), flush=True)
    if mode == "idle":
        deadline = time.monotonic() + 10
        while (probes.shared_probes() or keepers()) and time.monotonic() < deadline:
            time.sleep(0.05)
        print("idle", probes.shared_probes(), keepers(), probe.closed, flush=True)
        plan()  # a later plan opens a new one; the normal exit closes it (atexit)
        print("again", probes.shared_probes(), flush=True)
    else:
        time.sleep(600)  # the parent is killed: the parent watch must end this process
    """
)


def test_shared_probe_closes_when_idle_and_at_exit(spark_media_driver, tmp_shm):
    """An unused shared probe closes itself (client and keeper thread gone); a normal exit closes
    the one still open; the process leaves nothing in its SHM directory."""
    child = subprocess.run(
        [sys.executable, "-c", CHILD, spark_media_driver.dir, tmp_shm, "idle"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.split("\n")[:4] == ["open 1 1", "idle 0 0 True", "again 1", "exit 0"]
    assert "Traceback" not in child.stderr
    assert os.listdir(tmp_shm) == []


def test_worker_with_a_shared_probe_exits_when_its_parent_goes_away(spark_media_driver, tmp_shm):
    """#13.6 for the probe: in a process the JVM started, it starts the parent watch, so the
    worker does not outlive a crashed JVM."""
    parent_code = textwrap.dedent(
        """
        import os, subprocess, sys, time
        env = {**os.environ, "PYTHON_WORKER_FACTORY_PORT": "1"}
        child = subprocess.Popen([sys.executable, "-c", *sys.argv[1:]], env=env,
                                 stdout=subprocess.PIPE, text=True)
        print(child.pid, child.stdout.readline().strip(), flush=True)
        time.sleep(600)
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", parent_code, CHILD, spark_media_driver.dir, tmp_shm, "hold"],
        stdout=subprocess.PIPE,
        text=True,
    )
    worker = None
    try:
        assert parent.stdout is not None
        pid, *line = parent.stdout.readline().split()
        worker = int(pid)
        assert line == ["open", "1", "1"]
        parent.kill()
        parent.wait()
        assert wait_gone(worker), "the worker outlived its parent"
        assert os.listdir(tmp_shm) == []
    finally:
        if worker is not None and process_alive(worker):
            os.kill(worker, signal.SIGKILL)
        if parent.poll() is None:
            parent.kill()
            parent.wait()
