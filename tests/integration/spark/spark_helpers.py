"""Helpers shared by the Spark tests (imported as a plain module, like driver_fixtures)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from jsonlines_proc import JsonLinesProcess

from tensorpool.transport.mediadriver import MediaDriverProcess

SPARK_ROLES = str(Path(__file__).with_name("spark_roles.py"))
SHM_ROOT = "/dev/shm" if os.path.isdir("/dev/shm") else None


def check_payload(payload: bytes, seq: int) -> bool:
    """The spark_roles / roles.py checksum pattern for frame ``seq``."""
    u8 = np.frombuffer(payload, np.uint8)
    if int.from_bytes(u8[:8].tobytes(), "little") != seq:
        return False
    if int.from_bytes(u8[-8:].tobytes(), "little") != seq:
        return False
    mid = u8[8:-8]
    return bool(mid.size == 0 or (mid.min() == mid.max() == seq % 251))


class ProducerProc(JsonLinesProcess):
    """A spark_roles.py producer: ``produce(n)`` publishes n frames and waits for them."""

    def __init__(self, aeron_dir: str, shm_base: str, *args: str) -> None:
        dirs = ["--aeron-dir", aeron_dir, "--shm-base-dir", shm_base]
        super().__init__([sys.executable, SPARK_ROLES, *dirs, *args])
        self.epoch: int = self.next_event("ready")["epoch"]

    def produce(self, n: int) -> int:
        self.send(f"produce {n}")
        return int(self.next_event("produced")["next_seq"])

    def produce_at(self, n: int, hz: float) -> None:
        self.send(f"rate {n} {hz}")

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send("exit")
                self.proc.wait(15)
            except (BrokenPipeError, subprocess.TimeoutExpired, OSError):
                self.proc.kill()
                self.proc.wait()


def source_options(md: MediaDriverProcess, shm: str, **extra: object) -> dict[str, str]:
    opts = {"aeronDir": md.dir, "shmBaseDir": shm, "attachTimeoutMs": "20000"}
    opts.update({k: str(v) for k, v in extra.items()})
    return opts


# --- streaming queries -------------------------------------------------------------------------
class BatchLog:
    """An idempotent foreachBatch sink: results keyed by batchId (a replay overwrites)."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.batches: dict[int, list[tuple[int, int]]] = {}
        self.attempts: list[tuple[int, list[tuple[int, int]]]] = []
        self.bad: list[tuple[int, int]] = []
        self.fail_on = fail_on

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = df.select("epoch", "seq", "payload").collect()
        got = sorted((r.epoch, r.seq) for r in rows)
        self.bad += [(r.epoch, r.seq) for r in rows if not check_payload(r.payload, r.seq)]
        self.attempts.append((batch_id, got))
        if self.fail_on is not None and batch_id == self.fail_on and got:
            self.fail_on = None
            raise RuntimeError(f"simulated crash in batch {batch_id}")
        self.batches[batch_id] = got

    def frames(self) -> list[tuple[int, int]]:
        return [f for b in sorted(self.batches) for f in self.batches[b]]


def start_query(spark: Any, opts: dict[str, str], sink: BatchLog, ckpt: str, **trigger: Any) -> Any:
    return (
        spark.readStream.format("tensorpool")
        .options(**opts)
        .load()
        .writeStream.foreachBatch(sink)
        .trigger(**(trigger or {"processingTime": "200 milliseconds"}))
        .option("checkpointLocation", ckpt)
        .start()
    )


def wait_query(cond: Callable[[], bool], q: Any, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if q.exception() is not None:
            raise AssertionError(f"query failed: {q.exception()}")
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError("timed out waiting for the query")


def end_offsets(q: Any) -> dict[str, dict[str, int]]:
    progress = q.lastProgress
    if not progress or not progress["sources"]:
        return {}
    return json.loads(progress["sources"][0]["endOffset"] or "{}")


def publish_sparse(p: Any, n: int, step: int) -> list[int]:
    """Publish ``n`` frames with seqs ``next, next+step, ...``; return their seqs."""
    first = int(p.events[-1].get("next_seq", 0)) if p.events[-1]["event"] == "produced" else 0
    p.send(f"sparse {n} {step}")
    p.next_event("produced")
    return [first + i * step for i in range(n)]


def process_alive(pid: int) -> bool:
    """Running (a zombie counts as gone: who reaps it is up to the host's init)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pid: int, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while process_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not process_alive(pid)
