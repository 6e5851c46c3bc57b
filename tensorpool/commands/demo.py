"""`tensorpool demo`: the whole system on one machine, end to end.

Processes (each a real `tensorpool` subcommand, sharing one temporary directory):

1. the SHM driver (`tensorpool driver`), hosting the Aeron media driver;
2. a synthetic camera (`tensorpool produce --driver`): 640x480 uint16 at 100 Hz with a
   moving pattern (a scrolling ramp whose brightness pulses every 4 s, and a circling disc:
   the mean intensity Spark prints follows the pulse), on stream 10000;
3. a rate limiter (`tensorpool ratelimiter`) copying the newest frame to stream 20000 at
   10 Hz;
4. in this process, a Spark streaming query (`format("tensorpool")`, attached through the
   driver) that prints one line per micro-batch: batch id, frames, mean intensity and
   end-to-end latency (camera timestamp -> micro-batch visible), then a summary. It uses
   Spark's default trigger (the next micro-batch starts when the previous one ends) and a
   checkpoint on tmpfs: the lowest latency at the demo's 10 frames/s (#16.5; the breakdown
   is in docs/benchmarks/spark.md).

`--no-spark` runs steps 1-3 with `tensorpool consume` instead of Spark (no Java needed).
`--view [HOST:PORT]` also runs `tensorpool view` on the camera (http://127.0.0.1:8470/).
Everything is stopped and removed at the end, also on Ctrl-C.
"""

import argparse
import contextlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tensorpool.cli import UserError
from tensorpool.transport.process import (
    child_env,
    stamp_as_creator,
    stamped_creator_gone,
    stop_process,
)

CAMERA_STREAM = 10000
VIEW_STREAM = 20000

DRIVER_TOML = """\
[driver]
instance_id = "demo"
aeron_dir = "{aeron}"
embedded_media_driver = true

[shm]
base_dir = "{shm}"
namespace = "demo"
permissions_mode = "600"
allowed_base_dirs = ["{shm}"]

[policies]
allow_dynamic_streams = false
announce_period_ms = 500
cleanup_shm_on_exit = true
epoch_gc_keep = 1

[profiles.camera]
header_nslots = 64
payload_pools = [{{ pool_id = 1, stride_bytes = 1048576 }}]

# the rate limiter keeps the camera's seq numbers (every 10th), so its ring must be deeper
# in seq terms for Spark to find a micro-batch's frames still there
[profiles.view]
header_nslots = 256
payload_pools = [{{ pool_id = 1, stride_bytes = 1048576 }}]

[streams.camera]
stream_id = {camera}
profile = "camera"

[streams.view]
stream_id = {view}
profile = "view"
"""

RATELIMITER_TOML = """\
[rate_limiter]
instance_id = "demo-view"
descriptor_channel = "aeron:ipc?term-length=16m"
descriptor_stream_id = 1100
max_rate_hz = {rate}

[[mappings]]
source_stream_id = {camera}
dest_stream_id = {view}
profile = "camera"

[driver]
aeron_dir = "{aeron}"

[shm]
base_dir = "{shm}"
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--duration", type=float, default=30.0, help="seconds of streaming")
    p.add_argument("--camera-rate", type=float, default=100.0, help="camera frames/s")
    p.add_argument("--view-rate", type=int, default=10, help="rate limiter output frames/s")
    p.add_argument(
        "--trigger-s",
        type=float,
        default=0.0,
        help="Spark micro-batch interval (0: Spark's default trigger, the next micro-batch "
        "starts when the previous one ends: the lowest latency)",
    )
    p.add_argument("--no-spark", action="store_true", help="plain consumer instead of Spark")
    p.add_argument(
        "--view",
        nargs="?",
        const="127.0.0.1:8470",
        default=None,
        metavar="HOST:PORT",
        help="also serve the camera live in a browser (tensorpool view; default 127.0.0.1:8470)",
    )


def _tp(*args: str) -> list[str]:
    return [sys.executable, "-m", "tensorpool", *args]


def _start_view(bind: str, client: tuple[str, ...]) -> subprocess.Popen[bytes]:
    """``tensorpool view`` of the camera stream; opens a browser where there is one."""
    import webbrowser

    host, _, port = bind.rpartition(":")
    url = f"http://{host or '127.0.0.1'}:{port}/"
    proc = subprocess.Popen(
        _tp("view", "--driver", *client, "--stream-id", str(CAMERA_STREAM), "--bind", bind),
        stdin=subprocess.DEVNULL,
        env=child_env(),  # stops when the demo is gone, however it ended
        stdout=subprocess.DEVNULL,
    )
    print(f"demo: the camera live at {url} (tensorpool view)", flush=True)
    # only with a display: on a console webbrowser may pick a text browser that takes the tty
    if os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"):
        with contextlib.suppress(Exception):  # a browser that cannot start is no demo failure
            webbrowser.open(url)
    return proc


def _wait_driver(config: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    from tensorpool.driver.config import load_driver_config
    from tensorpool.driver.status import status_path, wait_running

    path = status_path(load_driver_config(config))
    if wait_running(path, timeout_s, alive=lambda: proc.poll() is None):
        return
    if proc.poll() is not None:
        raise UserError(f"the SHM driver exited with status {proc.returncode}")
    raise UserError(f"the SHM driver did not come up within {timeout_s:g} s")


#: Written first into a demo's working directory: the pid of the demo that made it, the file
#: stamped with its creator stamp (:func:`~tensorpool.transport.process.creator_stamp`). A demo
#: that was killed cannot remove its directory; the next demo does, once it proves that demo gone.
OWNER_FILE = "demo.pid"


def claim_demo_dir(work: Path) -> None:
    """Mark ``work`` as this demo's: :data:`OWNER_FILE` with our pid, stamped as ours."""
    owner = work / OWNER_FILE
    owner.write_text(str(os.getpid()))
    try:
        stamp_as_creator(str(owner))
    except OSError as exc:  # unprovable: a later demo leaves it (safe side)
        print(f"demo: {owner} not stamped, remove {work} by hand if killed: {exc}", flush=True)


def _dead_demo_dir(path: Path) -> bool:
    """Whether ``path`` is provably the working directory of a demo that is gone: the same
    proof the wake-semaphore sweep requires (:func:`~tensorpool.transport.wakeup
    .remove_if_abandoned`). A real directory (not a link) of our uid holding a regular
    :data:`OWNER_FILE` of our uid (not followed if a link) that names a positive pid, stamped
    by a process of our pid namespace that has exited (or whose pid now belongs to a process
    started at another tick). Anything unreadable or unproven is kept."""
    uid = os.getuid()
    try:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
            return False
        fd = os.open(path / OWNER_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            own = os.fstat(fd)
            text = os.read(fd, 16).decode("ascii")
        finally:
            os.close(fd)
    except (OSError, UnicodeDecodeError):
        return False
    if not stat.S_ISREG(own.st_mode) or own.st_uid != uid or not text.isdigit():
        return False
    return stamped_creator_gone(int(text), own.st_mtime_ns)


def remove_dead_demos(root: str) -> list[str]:
    """Remove working directories of earlier demos that were killed (their processes stopped
    by themselves: :func:`~tensorpool.transport.process.exit_with_parent`): only directories
    named like a demo's that :func:`_dead_demo_dir` proves abandoned. Returns those really
    removed."""
    removed = []
    for path in sorted(Path(root).glob("tensorpool-demo-*")):
        if not _dead_demo_dir(path):
            continue  # not provably a dead demo's: leave it
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            removed.append(str(path))
    return removed


def run(args: argparse.Namespace) -> int:
    root = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    for stale in remove_dead_demos(root):
        print(f"demo: removed {stale}, left by a demo that was killed", flush=True)
    work = Path(tempfile.mkdtemp(prefix="tensorpool-demo-", dir=root))
    claim_demo_dir(work)
    aeron, shm = work / "aeron", work / "shm"
    fields = {
        "aeron": aeron,
        "shm": shm,
        "camera": CAMERA_STREAM,
        "view": VIEW_STREAM,
        "rate": args.view_rate,
    }
    (work / "driver.toml").write_text(DRIVER_TOML.format(**fields))
    (work / "ratelimiter.toml").write_text(RATELIMITER_TOML.format(**fields))
    procs: list[subprocess.Popen[bytes]] = []
    client = ("--aeron-dir", str(aeron), "--shm-base-dir", str(shm))
    print(f"demo: working under {work}", flush=True)
    try:
        procs.append(
            subprocess.Popen(
                _tp("driver", "--config", str(work / "driver.toml"), "--log-level", "warning"),
                stdin=subprocess.DEVNULL,
                env=child_env(),  # stops when the demo is gone, however it ended
            )
        )
        _wait_driver(str(work / "driver.toml"), procs[0], 30)
        print(
            "demo: SHM driver up; starting camera (stream 10000, 640x480 uint16 at "
            f"{args.camera_rate:g} Hz) and rate limiter (-> stream 20000 at "
            f"{args.view_rate} Hz)",
            flush=True,
        )
        procs.append(
            subprocess.Popen(
                _tp(
                    "produce",
                    "--driver",
                    *client,
                    "--stream-id",
                    str(CAMERA_STREAM),
                    "--shape",
                    "480,640",
                    "--dtype",
                    "uint16",
                    "--rate",
                    str(args.camera_rate),
                    "--pattern",
                    "moving",
                    "--quiet",
                    "--meta",
                    "instrument=demo-camera",
                ),
                stdin=subprocess.DEVNULL,
                env=child_env(),  # stops when the demo is gone, however it ended
            )
        )
        with open(work / "ratelimiter.log", "wb") as rl_log:  # its own log; shown on failure
            procs.append(
                subprocess.Popen(
                    _tp(
                        "ratelimiter",
                        "--config",
                        str(work / "ratelimiter.toml"),
                        "--report-interval",
                        "0",
                    ),
                    stdin=subprocess.DEVNULL,
                    env=child_env(),  # stops when the demo is gone, however it ended
                    stdout=rl_log,
                    stderr=rl_log,
                )
            )
        time.sleep(1.0)
        if procs[-1].poll() is not None:
            sys.stderr.write((work / "ratelimiter.log").read_text())
            raise UserError("the rate limiter exited early (its log is above)")
        if args.view:  # #19.3: the camera in a browser, beside the Spark output
            procs.append(_start_view(args.view, client))
        if args.no_spark:
            return subprocess.call(
                _tp(
                    "consume",
                    "--driver",
                    *client,
                    "--stream-id",
                    str(VIEW_STREAM),
                    "--duration",
                    str(args.duration),
                )
            )
        return _spark(args, str(aeron), str(shm), str(work / "checkpoint"))
    except KeyboardInterrupt:
        print("\ndemo: interrupted", flush=True)
        return 130
    finally:
        for p in reversed(procs):  # clients first, the driver last
            stop_process(p)
        shutil.rmtree(work, ignore_errors=True)


def _spark(args: argparse.Namespace, aeron: str, shm: str, checkpoint: str) -> int:
    import numpy as np

    try:
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise UserError(
            f"the Spark demo needs tensorpool[spark] ({exc}); or use --no-spark"
        ) from None
    import tensorpool.spark_source as tps

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    print("demo: starting Spark (local[2]) ...", flush=True)
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("tensorpool-demo")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    tps.register(spark)

    frames = (
        spark.readStream.format("tensorpool")
        .option("streams", str(VIEW_STREAM))
        .option("aeronDir", aeron)
        .option("shmBaseDir", shm)
        .option("driver", "true")
        .option("failOnDataLoss", "false")
        .load()
        .select("seq", "timestamp_ns", "payload", "dtype", "shape")
    )
    # "warmup": frames taken before the first micro-batch with frames ended waited for Spark's
    # Python workers to start (seconds): they are reported apart from the steady state
    totals = {"batches": 0, "frames": 0, "latency_ms": [], "warmup_ms": [], "warm_ns": None}
    stopping = False

    def show(batch, batch_id: int) -> None:
        try:
            # Arrow straight to this process: the mean is computed here, on zero-copy numpy
            # views, instead of in a pandas UDF (a second Python worker round trip per batch)
            table = batch.toArrow()
        except Exception:
            if stopping:  # the query is being stopped under a running batch: not an error
                return
            raise
        now = time.monotonic_ns()
        if table.num_rows == 0:
            print(f"batch {batch_id:3d}: no frames", flush=True)
            return
        seqs = table.column("seq").to_pylist()
        stamps = table.column("timestamp_ns").to_pylist()
        lat = np.array([(now - ts) / 1e6 for ts in stamps])
        cols = [table.column(c).combine_chunks() for c in ("payload", "dtype", "shape")]
        mean = float(np.mean([a.mean() for a in tps.column_to_numpy(*cols)]))
        if totals["warm_ns"] is None:
            totals["warm_ns"] = now
        for ts, ms in zip(stamps, lat.tolist(), strict=True):
            totals["warmup_ms" if ts < totals["warm_ns"] else "latency_ms"].append(ms)
        totals["batches"] += 1
        totals["frames"] += len(seqs)
        print(
            f"batch {batch_id:3d}: {len(seqs):3d} frames  seq {seqs[0]}..{seqs[-1]}"
            f"  mean intensity {mean:7.1f}  latency p50 {np.median(lat):6.0f} ms"
            f"  max {lat.max():6.0f} ms",
            flush=True,
        )

    query = (
        frames.writeStream.foreachBatch(show)
        .trigger(processingTime=f"{args.trigger_s:g} seconds")
        # in the demo's directory (tmpfs): the offsets and commits files written every
        # micro-batch cost less there than in Spark's default temporary directory
        .option("checkpointLocation", checkpoint)
        .start()
    )
    try:
        query.awaitTermination(args.duration)
    finally:
        stopping = True
        # let a running micro-batch finish (bounded) so the stop does not interrupt it
        deadline = time.monotonic() + 20
        while query.status.get("isTriggerActive") and time.monotonic() < deadline:
            time.sleep(0.1)
        progress = [p for p in query.recentProgress if p.get("numInputRows")]
        query.stop()
        spark.stop()
    lat = np.array(totals["latency_ms"] or [float("nan")])
    warm = np.array(totals["warmup_ms"] or [float("nan")])
    print(
        f"demo: {totals['batches']} micro-batches, {totals['frames']} frames in "
        f"{args.duration:g} s ({totals['frames'] / args.duration:.1f} frames/s after the rate "
        f"limiter); end-to-end latency p50 {np.nanmedian(lat):.0f} ms, "
        f"p90 {np.nanpercentile(lat, 90):.0f} ms, max {np.nanmax(lat):.0f} ms over "
        f"{len(totals['latency_ms'])} frames (not counted: {len(totals['warmup_ms'])} frames "
        "taken before the first micro-batch ended, while Spark's Python workers started: p50 "
        f"{np.nanmedian(warm):.0f} ms)",
        flush=True,
    )
    if progress:  # where a micro-batch's time goes (Spark's durationMs, median)
        keys = ("triggerExecution", "latestOffset", "walCommit", "addBatch", "commitOffsets")
        print(
            "demo: micro-batch time (median of the last "
            f"{len(progress)} with frames, ms): "
            + ", ".join(
                f"{k} {np.median([p['durationMs'].get(k, 0) for p in progress]):.0f}" for k in keys
            ),
            flush=True,
        )
    return 0 if totals["frames"] else 1
