"""#13.2 for the Spark source: a streaming query with ``driver=true`` survives a restart of the
SHM driver that hosts the embedded media driver (the default deployment).

Real local SparkSession, a real `tensorpool driver` daemon with its embedded media driver in a
private directory, a real `tensorpool produce --driver` process. The daemon is killed with -9
and a new one started on the same config: the query must keep running (no exception) and get
frames of the new epoch, with nothing restarted but the daemon.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from driver_fixtures import DriverProcess, driver_toml
from spark_helpers import SHM_ROOT

from tensorpool.transport.process import stop_process

pytestmark = pytest.mark.spark

STREAM = 10000
CONTROL = 1760  # a control stream of our own


@pytest.fixture
def work() -> Iterator[dict[str, str]]:
    root = tempfile.mkdtemp(prefix="tp-spark-restart-", dir=SHM_ROOT)
    paths = {
        "root": root,
        "aeron": os.path.join(root, "aeron"),
        "base": os.path.join(root, "shm"),
        "config": os.path.join(root, "driver.toml"),
    }
    Path(paths["config"]).write_text(
        driver_toml(
            paths["base"],
            paths["aeron"],
            embedded=True,
            streams=[STREAM],
            control_stream_id=CONTROL,
            policies={"lease_keepalive_interval_ms": 1000, "lease_expiry_grace_intervals": 10},
        )
    )
    yield paths
    shutil.rmtree(root, ignore_errors=True)


def _daemon(work: dict[str, str], name: str) -> tuple[DriverProcess, float]:
    d = DriverProcess(work["config"], work["base"], os.path.join(work["root"], f"{name}.log"))
    t0 = time.monotonic()
    return d.start().wait_ready(30), t0


def test_13_2_streaming_query_with_driver_true_survives_driver_kill9(
    spark: Any, work: dict[str, str]
) -> None:
    """#13.2: kill -9 of the daemon (and its embedded media driver), then a new daemon on the
    same config: the driver=true query reattaches by itself and reads the new epoch."""
    daemon, _ = _daemon(work, "driver-0")
    log = open(os.path.join(work["root"], "producer.log"), "wb")  # noqa: SIM115
    producer = subprocess.Popen(
        [sys.executable, "-m", "tensorpool", "produce", "--driver", "--stream-id", str(STREAM),
         "--shape", "64", "--dtype", "uint8", "--rate", "20", "--quiet",
         "--control-stream-id", str(CONTROL), "--aeron-dir", work["aeron"],
         "--shm-base-dir", work["base"]],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
    )  # fmt: skip
    seen: list[tuple[float, int]] = []

    def sink(df: Any, _batch_id: int) -> None:
        now = time.monotonic()
        seen.extend((now, r.epoch) for r in df.select("epoch").collect())

    opts = {
        "aeronDir": work["aeron"],
        "shmBaseDir": work["base"],
        "attachTimeoutMs": "30000",
        "streams": str(STREAM),
        "driver": "true",
        "controlStreamId": str(CONTROL),
        "failOnDataLoss": "false",  # frames of the dead epoch may be gone: count, go on
    }
    q = (
        spark.readStream.format("tensorpool")
        .options(**opts)
        .load()
        .writeStream.foreachBatch(sink)
        .trigger(processingTime="200 milliseconds")
        .option("checkpointLocation", os.path.join(work["root"], "ckpt"))
        .start()
    )

    def wait(cond: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            assert q.exception() is None, f"query failed: {q.exception()}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}; seen {seen[-3:]}"
            time.sleep(0.05)

    try:
        wait(lambda: len(seen) >= 10, 120, "the first frames")
        e1 = max(e for _, e in seen)
        daemon.signal(signal.SIGKILL)
        daemon.wait(30)
        daemon, t0 = _daemon(work, "driver-1")
        wait(lambda: any(e > e1 for _, e in seen), 120, "frames of a new epoch")
        first = min(t for t, e in seen if e > e1)
        print(f"\n#13.2 spark driver=true: new driver start -> first row of the new epoch "
              f"{first - t0:.2f} s")  # fmt: skip
        assert q.exception() is None and q.isActive
    finally:
        q.stop()
        stop_process(producer, 20)
        log.close()
        daemon.stop()
