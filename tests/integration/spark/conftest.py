"""Spark fixtures: one local SparkSession for the whole Spark suite, scriptable producers.

Starting a JVM costs 10-30 s on the 2-core CI host, so the session is shared by every Spark
test module (queries are independent; each test uses its own SHM directory and stream ids).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from spark_helpers import SHM_ROOT, ProducerProc

from tensorpool.transport.mediadriver import MediaDriverProcess

pyspark = pytest.importorskip("pyspark")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import tensorpool.spark_source as tps

    session = (
        SparkSession.builder.master("local[2]")
        .appName("tensorpool-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.pollingDelay", "50ms")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    tps.register(session)
    yield session
    session.stop()
    _stop_jvm()


def _stop_jvm() -> None:
    """End the gateway JVM now, not at interpreter exit (#13.6: the session's leak check runs
    after the fixtures and before exit). The JVM exits when its stdin closes; its Python workers
    follow (tensorpool's source runner watches its parent)."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    if gateway is None:
        return
    proc = getattr(gateway, "proc", None)
    with contextlib.suppress(Exception):
        gateway.shutdown()
    if proc is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    SparkContext._gateway = None
    SparkContext._jvm = None


@pytest.fixture(scope="module")
def spark_media_driver() -> Iterator[MediaDriverProcess]:
    with MediaDriverProcess() as md:
        yield md


@pytest.fixture
def tmp_shm() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="tp-spark-", dir=SHM_ROOT)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def producers(spark_media_driver: MediaDriverProcess, tmp_shm: str) -> Iterator[Any]:
    started: list[ProducerProc] = []

    def start(*args: str) -> ProducerProc:
        p = ProducerProc(spark_media_driver.dir, tmp_shm, *args)
        started.append(p)
        return p

    yield start
    for p in started:
        p.close()
