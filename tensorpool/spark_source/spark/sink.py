"""``df.write`` / ``df.writeStream`` ``.format("tensorpool")``: rows become frames.

Input columns: ``payload`` (binary, the tensor's bytes), ``dtype`` (a tensorpool dtype name:
``float32``, ``uint8``, ...; numpy spellings such as ``float32``/``f4``/``bool`` are accepted),
``shape`` (array<int>), optionally ``strides`` (array<int>, bytes; null/absent = C order) and
``timestamp_ns`` (long; absent = publish time). Other columns are ignored, so a DataFrame read
from the ``tensorpool`` source can be written back as is (a relay).

Flow (see :mod:`.publisher` for why): each task validates its rows (a bad row fails the job
with the row's position and the offending column or option) and stages them as an Arrow IPC
file next to the SHM; the commit on the driver starts the stream's publisher process if none is
running, hands it the staged files in partition order and waits until they are published.
Nothing is published for a failed job (``abort`` deletes the staged files).

Idempotency: for ``writeStream`` the publisher remembers the last ``batchId`` per sink id
(default: the query's ``checkpointLocation``) and acknowledges a replayed micro-batch without
publishing it again. Batch ``df.write`` has no batch id: running the same job twice publishes
twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Final

import numpy as np
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from tensorpool.spark_source.convert import NUMPY_DTYPES, WIRE_DTYPES
from tensorpool.spark_source.options import SinkOptions, parse_sink_options, reject
from tensorpool.spark_source.spark.publisher import (
    DONE,
    INFO,
    MUST_MATCH,
    QUEUE,
    STAGING,
    PublisherConfig,
    atomic_write,
    config_value,
    lock_is_held,
    read_json,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

_ALIASES: Final = {"bool": "boolean", "bool_": "boolean"}


class TensorPoolSinkError(RuntimeError):
    """Rows could not be published (bad row, publisher failure or timeout)."""


def normalise_dtype(value: str) -> str | None:
    if value in WIRE_DTYPES:
        return value
    if value in _ALIASES:
        return _ALIASES[value]
    try:
        dt = np.dtype(value)
    except TypeError:
        return None
    for name, npdt in NUMPY_DTYPES.items():
        if npdt == dt and name not in ("bytes", "bit"):
            return "boolean" if dt == np.bool_ else name
    return None


def state_dir(opts: SinkOptions) -> str:
    return os.path.join(opts.connection.shm_base_dir, ".spark-sink", opts.instance_id)


def publisher_config(opts: SinkOptions) -> PublisherConfig:
    page = os.sysconf("SC_PAGE_SIZE")
    stride = max(page, 1 << max(opts.max_frame_bytes - 1, 1).bit_length())
    c = opts.connection
    return PublisherConfig(
        stream=opts.stream,
        header_nslots=opts.header_nslots,
        stride_bytes=stride,
        instance_id=opts.instance_id,
        aeron_dir=c.aeron_dir,
        endpoints=c.endpoints,
        shm_base_dir=c.shm_base_dir,
        driver=c.driver,
        announce_period_ms=opts.announce_period_ms,
        idle_timeout_ms=opts.publisher_idle_timeout_ms,
    )


# --- tasks: validate and stage -------------------------------------------------------------------
@dataclass
class StagedFile(WriterCommitMessage):
    path: str
    rows: int
    nbytes: int


def _column(batch: pa.RecordBatch, name: str) -> pa.Array | None:
    idx = batch.schema.get_field_index(name)
    return None if idx < 0 else batch.column(idx)


def _row_dtypes(
    dts: list[Any],
    shapes: list[Any],
    strs: list[Any],
    lens: list[Any],
    rows: int,
    checked: dict[tuple[object, ...], int],
    max_bytes: int,
) -> list[str]:
    """Each row's wire dtype, after checking its payload, dtype, shape and strides (``rows``:
    how many rows came before, for messages; ``checked``: extents of layouts seen so far)."""
    from tensorpool.shm.errors import TensorLayoutError
    from tensorpool.shm.tensor import TensorLayout

    norm: list[str] = []
    for r in range(len(lens)):
        where = f"row {rows + r}"
        if lens[r] is None:
            raise TensorPoolSinkError(f"payload: {where} is null")
        d = dts[r]
        nd = None if d is None else normalise_dtype(d)
        if nd is None:
            raise TensorPoolSinkError(
                f"dtype: {where} has dtype {d!r}; use one of {sorted(WIRE_DTYPES)}"
            )
        shp = shapes[r]
        if not shp:
            raise TensorPoolSinkError(f"shape: {where} has no shape")
        st = strs[r]
        key = (nd, tuple(shp), None if st is None else tuple(st))
        extent = checked.get(key)
        if extent is None:
            try:
                layout = TensorLayout(WIRE_DTYPES[nd], 1, key[1], key[2])
            except (TensorLayoutError, OverflowError, ValueError) as exc:
                raise TensorPoolSinkError(
                    f"shape: {where}: dtype {nd} shape {shp} strides {st}: {exc}"
                ) from None
            extent = checked[key] = layout.extent_bytes
        if lens[r] < extent:
            raise TensorPoolSinkError(
                f"payload: {where} has {lens[r]} bytes; dtype {nd} shape {shp} needs {extent}"
            )
        if extent > max_bytes:
            raise TensorPoolSinkError(
                f"maxFrameBytes: {where} is a {extent}-byte frame, larger than the "
                f"stream's {max_bytes}-byte pool; raise maxFrameBytes"
            )
        norm.append(nd)
    return norm


def stage_batches(
    batches: Iterator[pa.RecordBatch], opts: SinkOptions, max_bytes: int
) -> StagedFile:
    """Validate rows and write them to one staged Arrow file (what a task does)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    out_schema = pa.schema(
        [
            ("payload", pa.binary()),
            ("dtype", pa.string()),
            ("shape", pa.list_(pa.int32())),
            ("strides", pa.list_(pa.int32())),
            ("timestamp_ns", pa.int64()),
        ]
    )
    base = opts.connection.shm_base_dir
    if not os.path.isdir(base):
        # A straggling task of a failed or finished job must not re-create a base directory
        # that its owner has removed meanwhile (#13.6: nothing is left behind).
        raise TensorPoolSinkError(f"shmBaseDir: {base} does not exist (removed meanwhile?)")
    staging = os.path.join(state_dir(opts), STAGING)
    os.makedirs(staging, mode=0o700, exist_ok=True)
    path = os.path.join(staging, f"{os.getpid()}-{uuid.uuid4().hex}.arrow")
    rows = 0
    nbytes = 0
    checked: dict[tuple[object, ...], int] = {}
    writer: pa.ipc.RecordBatchFileWriter | None = None
    try:
        writer = pa.ipc.new_file(path, out_schema)
        for batch in batches:
            payload = _column(batch, "payload")
            dtype = _column(batch, "dtype")
            shape = _column(batch, "shape")
            if payload is None or dtype is None or shape is None:
                raise TensorPoolSinkError(
                    "schema: the tensorpool sink needs columns payload (binary), dtype (string) "
                    f"and shape (array<int>); got {batch.schema.names}"
                )
            strides = _column(batch, "strides")
            stamps = _column(batch, "timestamp_ns")
            dts = dtype.to_pylist()
            shapes = shape.to_pylist()
            strs = strides.to_pylist() if strides is not None else [None] * batch.num_rows
            lens = pc.binary_length(payload).to_pylist()
            norm = _row_dtypes(dts, shapes, strs, lens, rows, checked, max_bytes)
            n = batch.num_rows
            if stamps is not None and stamps.type != pa.int64():
                stamps = stamps.cast(pa.int64())
            out = pa.RecordBatch.from_arrays(
                [
                    payload.cast(pa.binary()) if payload.type != pa.binary() else payload,
                    pa.array(norm, pa.string()),
                    shape.cast(pa.list_(pa.int32())),
                    strides.cast(pa.list_(pa.int32()))
                    if strides is not None
                    else pa.nulls(n, pa.list_(pa.int32())),
                    stamps if stamps is not None else pa.nulls(n, pa.int64()),
                ],
                schema=out_schema,
            )
            writer.write_batch(out)
            rows += n
            nbytes += sum(lens)
        writer.close()
        writer = None
    except BaseException:
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close()
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise
    return StagedFile(path, rows, nbytes)


# --- driver: publisher management and commit -----------------------------------------------------
def ensure_publisher(opts: SinkOptions, timeout_s: float = 30.0) -> dict[str, Any]:
    """Start the stream's publisher unless one runs with the same configuration."""
    import fcntl

    cfg = publisher_config(opts)
    sdir = state_dir(opts)
    os.makedirs(sdir, mode=0o700, exist_ok=True)
    spawn_fd = os.open(os.path.join(sdir, "spawn.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(spawn_fd, fcntl.LOCK_EX)
        info = _live_info(sdir)
        if info is None:
            log_path = os.path.join(sdir, "publisher.log")
            with open(log_path, "ab") as logf:
                proc = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "tensorpool.spark_source.spark.publisher",
                        "--state-dir",
                        sdir,
                        "--config",
                        cfg.to_json(),
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=logf,
                    stderr=logf,
                    start_new_session=True,  # outlives Spark's short-lived commit process
                    close_fds=True,
                )
            deadline = time.monotonic() + timeout_s
            while info is None:
                if proc.poll() is not None:
                    raise TensorPoolSinkError(
                        f"the publisher for stream {opts.stream} exited with code "
                        f"{proc.returncode}; see {log_path}"
                    )
                if time.monotonic() > deadline:
                    raise TensorPoolSinkError(
                        f"the publisher for stream {opts.stream} did not start within "
                        f"{timeout_s:g} s; see {log_path}"
                    )
                time.sleep(0.01)
                info = _live_info(sdir)
    finally:
        os.close(spawn_fd)
    running = info.get("config", {})
    wanted = asdict(cfg)
    for path, option in MUST_MATCH.items():
        have, want = config_value(running, path), config_value(wanted, path)
        if have != want:
            reject(
                option,
                f"the publisher of stream {opts.stream} (instanceId "
                f"{opts.instance_id}) runs with {have!r}, this write asks "
                f"for {want!r}; use the same value or stop_publisher() it",
            )
    return info


def _live_info(sdir: str) -> dict[str, Any] | None:
    path = os.path.join(sdir, INFO)
    if not lock_is_held(sdir):
        return None
    try:
        info = read_json(path)
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and "pid" in info else None


def submit(opts: SinkOptions, request: dict[str, Any]) -> dict[str, Any]:
    """Queue a request with the publisher and wait for its reply."""
    sdir = state_dir(opts)
    ensure_publisher(opts)
    name = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.json"
    atomic_write(os.path.join(sdir, QUEUE, name), json.dumps(request))
    reply_path = os.path.join(sdir, DONE, name)
    deadline = time.monotonic() + opts.commit_timeout_ms / 1000
    while True:
        try:
            reply = read_json(reply_path)
        except (OSError, ValueError):
            reply = None
        if reply is not None:
            with contextlib.suppress(OSError):
                os.unlink(reply_path)
            if not reply.get("ok"):
                raise TensorPoolSinkError(
                    f"publishing to stream {opts.stream} failed: {reply.get('error')}"
                )
            return reply
        if time.monotonic() > deadline:
            raise TensorPoolSinkError(
                f"commitTimeoutMs: the publisher of stream {opts.stream} did not confirm "
                f"within {opts.commit_timeout_ms} ms (see {sdir}/publisher.log)"
            )
        if _live_info(sdir) is None:
            raise TensorPoolSinkError(
                f"the publisher of stream {opts.stream} died (see {sdir}/publisher.log)"
            )
        time.sleep(0.002)


def _files(messages: list[WriterCommitMessage | None]) -> list[str]:
    return [m.path for m in messages if isinstance(m, StagedFile) and m.rows]


def _discard(messages: list[WriterCommitMessage | None]) -> None:
    for m in messages:
        if isinstance(m, StagedFile):
            with contextlib.suppress(OSError):
                os.unlink(m.path)


def stop_publisher(options: dict[str, str], timeout_s: float = 10.0) -> bool:
    """Stop the publisher a sink with these options uses; True if one was running."""
    opts = parse_sink_options(options)
    sdir = state_dir(opts)
    info = _live_info(sdir)
    if info is None:
        return False
    name = f"{time.time_ns():020d}-stop.json"
    with contextlib.suppress(OSError):
        atomic_write(os.path.join(sdir, QUEUE, name), json.dumps({"stop": True}))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and lock_is_held(sdir):
        time.sleep(0.01)
    if lock_is_held(sdir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(info["pid"]), 15)
    return True


class TensorPoolBatchWriter(DataSourceArrowWriter):
    """``df.write.format("tensorpool")``: publishes every row once per successful job."""

    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        self.opts = opts
        self.max_bytes = publisher_config(opts).stride_bytes
        self.last_reply: dict[str, Any] | None = None

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedFile:
        return stage_batches(iterator, self.opts, self.max_bytes)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self.last_reply = submit(self.opts, {"files": _files(messages)})

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _discard(messages)


class TensorPoolStreamWriter(DataSourceStreamArrowWriter):
    """``writeStream.format("tensorpool")``: one publish per micro-batch, idempotent per batchId."""

    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        self.opts = opts
        self.max_bytes = publisher_config(opts).stride_bytes
        self.last_reply: dict[str, Any] | None = None

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedFile:
        return stage_batches(iterator, self.opts, self.max_bytes)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        self.last_reply = submit(
            self.opts,
            {"files": _files(messages), "sink_id": self.opts.sink_id, "batch_id": batchId},
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _discard(messages)


__all__ = [
    "WIRE_DTYPES",
    "StagedFile",
    "TensorPoolBatchWriter",
    "TensorPoolSinkError",
    "TensorPoolStreamWriter",
    "ensure_publisher",
    "normalise_dtype",
    "stage_batches",
    "stop_publisher",
    "submit",
]
