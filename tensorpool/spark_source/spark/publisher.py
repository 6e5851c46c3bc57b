"""The sink's publisher: the single writer of a stream that Spark writes to.

A tensorpool stream has exactly one writer, while Spark writes from many tasks in many
processes and commits from a short-lived process per job or micro-batch. So Spark never writes
the ring itself. Tasks stage their rows as Arrow IPC files; the commit (on the Spark driver,
only after every task succeeded -- Spark's commit protocol) hands the list of files, in
partition order, to this long-lived publisher process, which owns a
:class:`~tensorpool.client.producer.Producer` (standalone regions, or a producer lease from
the SHM driver with ``driver=true``) and publishes the rows as frames, in order.

State lives in ``<shmBaseDir>/.spark-sink/<instanceId>/`` (same host as Spark, like the SHM):

* ``publisher.lock`` -- held (``flock``) by the live publisher; ``publisher.json`` -- its pid,
  epoch and configuration;
* ``queue/`` -- commit requests (``*.json``), processed in name order; ``done/`` -- replies;
* ``staging/`` -- the tasks' Arrow files (deleted once published or aborted);
* ``committed.json`` -- per sink id (a streaming query's checkpoint), the last published
  ``batchId``: a replayed micro-batch is acknowledged without publishing it again. The record is
  written after publishing, so a publisher killed in between republishes once on replay
  (at-least-once in that window).

The publisher exits after ``publisherIdleTimeoutMs`` without requests, on SIGTERM, when its
state directory disappears, or on a ``stop`` request; closing the producer removes its regions.

Run as ``python -m tensorpool.spark_source.spark.publisher --state-dir DIR --config JSON``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any, Final

import numpy as np

from tensorpool.endpoints import Endpoints
from tensorpool.spark_source.options import Opt

LOCK: Final = "publisher.lock"
INFO: Final = "publisher.json"
COMMITTED: Final = "committed.json"
QUEUE: Final = "queue"
DONE: Final = "done"
STAGING: Final = "staging"

log = logging.getLogger("tensorpool.spark_source.spark.publisher")


@dataclass(frozen=True, slots=True)
class PublisherConfig:
    """What a publisher was started with; a second writer must ask for the same."""

    stream: int
    header_nslots: int
    stride_bytes: int
    instance_id: str
    aeron_dir: str | None
    endpoints: Endpoints
    """The sink's endpoints as the Spark options resolved them (#14.1: the one endpoints type,
    so QoS and metadata travel where the options say, not where a second copy guesses)."""
    shm_base_dir: str
    driver: bool
    announce_period_ms: int
    idle_timeout_ms: int

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> PublisherConfig:
        d = json.loads(text)
        d["endpoints"] = Endpoints(**d["endpoints"])
        return cls(**d)


#: fields two writers of one stream must agree on (dotted path into the config's JSON -> option
#: name, for error messages)
MUST_MATCH: Final = {
    "stream": Opt.stream.name,
    "header_nslots": Opt.headerNslots.name,
    "stride_bytes": Opt.maxFrameBytes.name,
    "aeron_dir": Opt.aeronDir.name,
    "endpoints.control_channel": Opt.controlChannel.name,
    "endpoints.control_stream_id": Opt.controlStreamId.name,
    "endpoints.descriptor_channel": Opt.descriptorChannel.name,
    "endpoints.descriptor_stream_id": Opt.descriptorStreamId.name,
    "driver": Opt.driver.name,
}


def config_value(config: dict[str, Any], path: str) -> Any:
    """The value at a dotted ``path`` of a config's JSON form (None where it is missing)."""
    value: Any = config
    for key in path.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


def atomic_write(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def read_json(path: str) -> Any:
    with open(path) as f:
        return json.load(f)


def lock_is_held(state_dir: str) -> bool:
    """True if a live publisher holds the lock (a dead one's lock is released by the kernel)."""
    path = os.path.join(state_dir, LOCK)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)


# --- publishing --------------------------------------------------------------------------------
class _Layouts:
    """(dtype, shape, strides) -> validated TensorLayout, cached (rows usually repeat one)."""

    def __init__(self) -> None:
        self._cache: dict[tuple[object, ...], Any] = {}

    def get(self, dtype: str, shape: tuple[int, ...], strides: tuple[int, ...] | None) -> Any:
        key = (dtype, shape, strides)
        hit = self._cache.get(key)
        if hit is None:
            from tensorpool.shm.layout import MajorOrder
            from tensorpool.shm.tensor import TensorLayout
            from tensorpool.spark_source.convert import WIRE_DTYPES

            if len(self._cache) > 1024:
                self._cache.clear()
            hit = TensorLayout(WIRE_DTYPES[dtype], int(MajorOrder.ROW), shape, strides)
            self._cache[key] = hit
        return hit


def iter_rows(path: str) -> Iterator[tuple[memoryview, str, tuple[int, ...], Any, Any]]:
    """Rows of a staged Arrow file: (payload view, dtype, shape, strides|None, ts|None)."""
    import pyarrow as pa

    with pa.memory_map(path) as source:
        reader = pa.ipc.open_file(source)
        for i in range(reader.num_record_batches):
            batch = reader.get_batch(i)
            payload = batch.column("payload")
            data = payload.buffers()[2]
            offs = np.frombuffer(payload.buffers()[1], np.int32)[payload.offset :]
            mv = memoryview(data) if data is not None else memoryview(b"")
            dtypes = batch.column("dtype").to_pylist()
            shapes = batch.column("shape").to_pylist()
            strides = batch.column("strides").to_pylist()
            stamps = batch.column("timestamp_ns").to_pylist()
            for r in range(batch.num_rows):
                st = strides[r]
                yield (
                    mv[offs[r] : offs[r + 1]],
                    dtypes[r],
                    tuple(shapes[r]),
                    None if st is None else tuple(st),
                    stamps[r],
                )


class SinkPublisher:
    """The publisher's core loop (one process, one stream, one writer)."""

    def __init__(self, state_dir: str, cfg: PublisherConfig) -> None:
        from tensorpool.client.producer import PoolConfig, Producer, StreamConfig
        from tensorpool.client.settings import ClientSettings
        from tensorpool.transport.config import TransportConfig
        from tensorpool.transport.context import release_shared_context, shared_context

        self.state_dir = state_dir
        self.cfg = cfg
        self.layouts = _Layouts()
        settings = ClientSettings(
            transport=TransportConfig(aeron_dir=cfg.aeron_dir),
            channels=cfg.endpoints,
            shm_base_dir=cfg.shm_base_dir,
            announce_period_ns=cfg.announce_period_ms * 1_000_000,
        )
        self.ctx = shared_context(settings.transport)  # the process's one client (#28.1)
        try:
            stream = StreamConfig(
                cfg.stream,
                header_nslots=cfg.header_nslots,
                pools=(PoolConfig(1, cfg.stride_bytes),),
                name=f"spark sink {cfg.instance_id}",
            )
            self.producer = Producer(
                self.ctx, stream, settings, instance_id=cfg.instance_id, driver=cfg.driver
            )
            try:
                self.producer.wait_until_attached()  # #14.1: the constructor does not block
            except BaseException:
                self.producer.close()
                raise
        except BaseException:
            release_shared_context(self.ctx)
            raise
        self.producer.do_work()
        path = os.path.join(state_dir, COMMITTED)
        self.committed: dict[str, int] = read_json(path) if os.path.exists(path) else {}

    def publish_file(self, path: str) -> int:
        p = self.producer
        n = 0
        for payload, dtype, shape, strides, ts in iter_rows(path):
            layout = self.layouts.get(dtype, shape, strides)
            claim = p.claim(layout=layout)
            if claim is None:
                raise RuntimeError(
                    f"frame of {layout.extent_bytes} bytes does not fit the stream's pool "
                    f"({self.cfg.stride_bytes} bytes): raise maxFrameBytes"
                )
            if layout.extent_bytes:
                src = np.ndarray(
                    layout.dims, layout.np_dtype, buffer=payload, strides=layout.strides
                )
                np.copyto(claim.array, src)
            p.commit(claim, timestamp_ns=ts)
            n += 1
            if n & 255 == 0:
                p.do_work()
        return n

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        sink_id = request.get("sink_id")
        batch_id = request.get("batch_id")
        files = list(request.get("files", []))
        p = self.producer
        first = p.next_seq
        try:
            if (
                sink_id is not None
                and batch_id is not None
                and batch_id <= self.committed.get(sink_id, -1)
            ):
                return {"ok": True, "skipped": True, "published": 0, "epoch": p.epoch}
            published = 0
            for f in files:
                published += self.publish_file(f)
            if sink_id is not None and batch_id is not None:
                self.committed[sink_id] = batch_id
                atomic_write(os.path.join(self.state_dir, COMMITTED), json.dumps(self.committed))
            return {
                "ok": True,
                "skipped": False,
                "published": published,
                "first_seq": first,
                "next_seq": p.next_seq,
                "epoch": p.epoch,
            }
        except Exception as exc:
            log.exception("publishing %s failed", files)
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "epoch": p.epoch}
        finally:
            for f in files:
                with contextlib.suppress(OSError):
                    os.unlink(f)

    def close(self) -> None:
        from tensorpool.transport.context import release_shared_context

        with contextlib.suppress(Exception):
            self.producer.close()
        release_shared_context(self.ctx)


def serve(state_dir: str, cfg: PublisherConfig) -> int:
    """Run until idle timeout / SIGTERM / stop request / state dir removed."""
    lock_fd = os.open(os.path.join(state_dir, LOCK), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log.error("another publisher holds %s", state_dir)
        return 3
    from tensorpool.transport.agent import AgentRunner
    from tensorpool.transport.idle import SleepingIdleStrategy
    from tensorpool.transport.process import StopSignals

    signals = StopSignals().install()
    for sub in (QUEUE, DONE, STAGING):
        os.makedirs(os.path.join(state_dir, sub), mode=0o700, exist_ok=True)
    pub = SinkPublisher(state_dir, cfg)
    atomic_write(
        os.path.join(state_dir, INFO),
        json.dumps({"pid": os.getpid(), "epoch": pub.producer.epoch, "config": asdict(cfg)}),
    )
    log.info("publisher for stream %d epoch %d ready", cfg.stream, pub.producer.epoch)
    try:  # #26.1: the runner keeps the media driver, idles 2 ms, stops on SIGTERM
        AgentRunner(
            _QueueAgent(state_dir, cfg, pub),
            SleepingIdleStrategy(2_000_000),
            context=pub.ctx,
            stop_signals=signals,
        ).run()
    finally:
        pub.close()
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(state_dir, INFO))
        os.close(lock_fd)
    return 0


class _QueueAgent:
    """Answers the requests queued in the state directory; ends on a stop request, when the
    directory is removed, or after ``idle_timeout_ms`` without one."""

    role_name = "tensorpool-sink-publisher"

    def __init__(self, state_dir: str, cfg: PublisherConfig, pub: SinkPublisher) -> None:
        self.queue = os.path.join(state_dir, QUEUE)
        self.done = os.path.join(state_dir, DONE)
        self.state_dir = state_dir
        self.cfg = cfg
        self.pub = pub
        self.last_work = time.monotonic()

    def on_start(self) -> None:
        pass

    def on_close(self) -> None:
        pass

    def do_work(self) -> int:
        from tensorpool.transport.agent import AgentTermination

        self.pub.producer.do_work()
        try:
            names = sorted(n for n in os.listdir(self.queue) if n.endswith(".json"))
        except FileNotFoundError:
            log.info("state directory %s removed: exiting", self.state_dir)
            raise AgentTermination from None
        stop = False
        for name in names:
            path = os.path.join(self.queue, name)
            try:
                request = read_json(path)
            except (OSError, ValueError):
                continue
            with contextlib.suppress(OSError):
                os.unlink(path)
            if request.get("stop"):
                stop = True
                reply: dict[str, Any] = {"ok": True, "stopped": True}
            else:
                reply = self.pub.handle(request)
            with contextlib.suppress(OSError):
                atomic_write(os.path.join(self.done, name), json.dumps(reply))
            self.last_work = time.monotonic()
        if stop:
            raise AgentTermination
        idle = self.cfg.idle_timeout_ms
        if not names and idle and (time.monotonic() - self.last_work) * 1000 > idle:
            log.info("publisher idle for %d ms: exiting", idle)
            raise AgentTermination
        return len(names)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--state-dir", required=True)
    ap.add_argument("--config", required=True, help="PublisherConfig as JSON")
    a = ap.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    return serve(a.state_dir, PublisherConfig.from_json(a.config))


if __name__ == "__main__":
    sys.exit(main())
