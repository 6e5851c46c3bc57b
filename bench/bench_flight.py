"""Frames from another host: ``tensorpool serve`` (Arrow Flight) against its ceiling (#18).

Run: ``.venv/bin/python -m bench.bench_flight`` (about 2-3 min on 2 cores; ``--quick`` halves
the data). Prints markdown tables and the goal check.

Setup, all on loopback: one media driver, a producer thread filling a ring with distinct random
frames (4 KiB x 8192, 1 MiB x 256), ``tensorpool serve`` over that stream in its own process,
and in another process a **bare Flight server** that answers every ``do_get`` with pre-built
record batches of the same schema, rows per batch and payload size (no SHM, no seqlock: the
transport's ceiling). Each source gets a warm-up run, then ``--repeat`` (3) measured runs
interleaved with the others; the table keeps each source's best run (a shared host only ever
makes a run slower) and gives the median too.

* **do_get alone** (no Spark): a client in this process reads the whole ring with one ticket,
  from ``tensorpool serve`` and from the bare server (a), and counts the bytes.
* **into Spark** (``local[2]``, ``spark.read`` with sink ``noop``, ``minPartitions=2``):
  ``hosts=...`` with ``preferLocalReads=false`` (every task does ``do_get``) against (a) a
  trivial Python data source whose tasks ``do_get`` the same partitions from the bare server,
  and (b) the local SHM path: the plain source (Aeron + mapped rings), and ``hosts=...`` with
  ``preferLocalReads=true`` (planning over Flight, tasks map the ring because they see the
  server's header ring file).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any, Final

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from bench import free_ports
from bench.bench_spark import ROOT, ProducerThread, _emit, _split, timed
from tensorpool.spark_source.spark.source import SCHEMA_DDL

KIB: Final = 1024
MIB: Final = 1024 * 1024
STREAM: Final = 18801


# --- (a): the bare Flight server and the Spark source that reads it ------------------------------
def bare_server(port: int) -> None:
    """Serve pre-built batches: ticket ``{"frames": N, "size": S}`` -> N frames of S bytes."""
    import pyarrow.flight as flight

    class Bare(flight.FlightServerBase):
        def do_get(self, context: Any, ticket: Any) -> Any:
            t = json.loads(ticket.ticket)
            batches = list(_emit(int(t["frames"]), int(t["size"])))
            return flight.GeneratorStream(batches[0].schema, iter(batches))

    server = Bare(f"grpc://127.0.0.1:{port}")
    print("ready", flush=True)
    try:
        sys.stdin.read()  # until the parent closes our stdin
    finally:
        server.shutdown()


def _bare_get(port: int, frames: int, size: int) -> Iterator[Any]:
    import pyarrow.flight as flight

    c = flight.FlightClient(f"grpc://127.0.0.1:{port}")
    try:
        ticket = flight.Ticket(json.dumps({"frames": frames, "size": size}).encode())
        reader = c.do_get(ticket)
        while True:
            try:
                yield reader.read_chunk().data
            except StopIteration:
                return
    finally:
        c.close()


class _Part(InputPartition):
    def __init__(self, count: int) -> None:
        self.count = count


class BareFlightReader(DataSourceReader):
    def __init__(self, opts: dict[str, str]) -> None:
        self.port = int(opts["port"])
        self.frames = int(opts["frames"])
        self.size = int(opts["size"])

    def partitions(self) -> list[Any]:
        return [_Part(n) for n in _split(self.frames, 2)]

    def read(self, partition: Any) -> Iterator[Any]:
        yield from _bare_get(self.port, partition.count, self.size)


class BareFlightSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "bareflight"

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema: Any) -> Any:
        return BareFlightReader(self.options)


# --- helpers --------------------------------------------------------------------------------------
def _line(proc: subprocess.Popen[str], what: str) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"{what} did not start")
    return line


def best_and_median(fns: dict[str, Callable[[], object]], repeat: int) -> dict[str, list[float]]:
    """Warm each, then ``repeat`` rounds interleaving the sources; seconds per run."""
    for fn in fns.values():
        fn()
    out: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            out[k].append(timed(fn))
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "--bare-server":
        bare_server(int(args[1]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="half the frames")
    ap.add_argument("--repeat", type=int, default=3, help="measured runs per source")
    ap.add_argument("--size", choices=("4k", "1m", "both"), default="both", help="frame sizes")
    a = ap.parse_args(argv)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH", "")) if p
    )
    import logging

    import numpy as np

    logging.basicConfig(level=logging.WARNING)
    from pyspark.sql import SparkSession

    import bench.bench_flight as me
    import tensorpool.spark_source as tps
    from tensorpool.spark_source.options import FlightAccess
    from tensorpool.spark_source.rings import flight_protocol as protocol
    from tensorpool.spark_source.rings import remote
    from tensorpool.transport.mediadriver import MediaDriverProcess
    from tensorpool.transport.process import stop_process

    scale = 2 if a.quick else 1
    sizes = [(4 * KIB, 8192 // scale), (MIB, 256 // scale)]
    sizes = [x for x in sizes if a.size == "both" or (x[0] == MIB) == (a.size == "1m")]
    shm = tempfile.mkdtemp(prefix="tp-bench-flight-", dir="/dev/shm")
    procs: list[subprocess.Popen[str]] = []
    results: list[dict[str, Any]] = []
    loads = [os.getloadavg()]
    try:
        with MediaDriverProcess() as md:
            spark = (
                SparkSession.builder.master("local[2]")
                .config("spark.ui.enabled", "false")
                .config("spark.ui.showConsoleProgress", "false")
                .config("spark.driver.memory", "2g")
                .getOrCreate()
            )
            spark.sparkContext.setLogLevel("ERROR")
            tps.register(spark)
            spark.dataSource.register(me.BareFlightSource)
            bare_port = free_ports()[0]
            bare = subprocess.Popen(
                [sys.executable, "-m", "bench.bench_flight", "--bare-server", str(bare_port)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                cwd=ROOT,
            )
            procs.append(bare)
            _line(bare, "the bare Flight server")
            for size, frames in sizes:
                sid = STREAM + size.bit_length()
                prod = ProducerThread(md.dir, shm, sid, frames, size)
                rng = np.random.default_rng(size)
                prod.call("fill", rng.integers(0, 256, (frames, size), np.uint8))
                port = free_ports()[0]
                serve = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "tensorpool",
                        "serve",
                        "--stream-id",
                        str(sid),
                        "--port",
                        str(port),
                        "--aeron-dir",
                        md.dir,
                        "--shm-base-dir",
                        shm,
                        "--attach-timeout",
                        "20",
                    ],
                    stdout=subprocess.PIPE,
                    text=True,
                )
                procs.append(serve)
                _line(serve, "tensorpool serve")
                address = f"127.0.0.1:{port}"
                access = FlightAccess(retry_s=0)
                snap = remote.scan_host(address, [sid], access)[sid]
                assert snap is not None and snap.state.head - snap.state.oldest == frames
                ticket = protocol.Ticket(sid, snap.spec.epoch, snap.state.oldest, snap.state.head)

                def get_serve(
                    address: str = address,
                    access: Any = access,
                    ticket: Any = ticket,
                    frames: int = frames,
                ) -> None:
                    n = sum(b.num_rows for b in remote.fetch(address, access, ticket, print))
                    assert n == frames, n

                def get_bare(size: int = size, frames: int = frames) -> None:
                    assert sum(b.num_rows for b in _bare_get(bare_port, frames, size)) == frames

                def spark_read(fmt: str, **opts: object) -> Callable[[], None]:
                    def go() -> None:
                        (
                            spark.read.format(fmt)
                            .options(**{k: str(v) for k, v in opts.items()})
                            .load()
                            .write.format("noop")
                            .mode("overwrite")
                            .save()
                        )

                    return go

                hosts = {"hosts": address, "streams": f"{address}/{sid}", "minPartitions": 2}
                runs = {
                    ("do_get", "tensorpool serve"): get_serve,
                    ("do_get", "(a) bare Flight server"): get_bare,
                    ("Spark", "tensorpool serve (Flight)"): spark_read(
                        "tensorpool", preferLocalReads="false", **hosts
                    ),
                    ("Spark", "(a) bare Flight server"): spark_read(
                        "bareflight", port=bare_port, frames=frames, size=size
                    ),
                    ("Spark", "(b) hosts, task reads SHM locally"): spark_read(
                        "tensorpool", **hosts
                    ),
                    ("Spark", "(b) local SHM source"): spark_read(
                        "tensorpool",
                        streams=sid,
                        aeronDir=md.dir,
                        shmBaseDir=shm,
                        minPartitions=2,
                    ),
                }
                secs = best_and_median(runs, a.repeat)  # type: ignore[arg-type]
                for (mode, source), s in secs.items():
                    results.append(
                        {
                            "size": size,
                            "frames": frames,
                            "mode": mode,
                            "source": source,
                            "best": min(s),
                            "median": statistics.median(s),
                        }
                    )
                loads.append(os.getloadavg())
                stop_process(serve)
                prod.stop()
            spark.stop()
    finally:
        for p in procs:
            if p.stdin is not None:
                p.stdin.close()
            stop_process(p)
        shutil.rmtree(shm, ignore_errors=True)
    print()
    print(
        "| frame | mode | source | frames | best s | MB/s (best) | MB/s (median) | serve / this |"
    )
    print("| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    checks = []
    for r in results:
        ours_name = "tensorpool serve" if r["mode"] == "do_get" else "tensorpool serve (Flight)"
        ours = next(
            x
            for x in results
            if x["size"] == r["size"] and x["mode"] == r["mode"] and x["source"] == ours_name
        )
        ratio = r["best"] / ours["best"]  # = serve's throughput / this one's
        mb = r["size"] * r["frames"] / 1e6
        label = "4 KiB" if r["size"] == 4 * KIB else "1 MiB"
        print(
            f"| {label} | {r['mode']} | {r['source']} | {r['frames']} | {r['best']:.3f} | "
            f"{mb / r['best']:,.0f} | {mb / r['median']:,.0f} | "
            f"{'—' if r is ours else f'{ratio:.2f}'} |"
        )
        if r["source"].startswith("(a)"):
            checks.append((f"{label} {r['mode']}: serve / bare Flight", ratio))
    print()
    for what, ratio in checks:
        goal = " (goal >= 0.8)" if what.startswith("1 MiB Spark") else ""
        print(f"- {what} = {ratio:.2f}{goal}")
    shown = [tuple(round(x, 2) for x in avg) for avg in loads]
    print(f"- load average (1, 5, 15 min) during the runs: {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
