"""Cross-process torn-read stress of the batch path (issue #15.4; §8.3, §15.13).

Like ``test_shm_seqlock_stress.py``, with both sides vectorized: a writer process commits frames
three at a time through ``BatchWriter`` (one store pass per seqlock step, claims crossing the
ring's wrap) as fast as it can; this process reads runs of four frames through ``BatchReader``
(a quarter of the reads take a single frame through ``read_one``: a paced consumer's batch),
alternating zero-copy runs (checked, then ``confirm``) and copied runs, and verifies every
*accepted* row's checksum. The guard must fire and must never accept a wrong payload. The run
is extended in steps until enough of both kinds were accepted and late drops were seen, bounded
by the writer's ``MAX_SECONDS``.
"""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from tensorpool.counters import LATE_REASONS, Reason
from tensorpool.shm import (
    EpochLayout,
    ExpectedRegion,
    PathPolicy,
    SlotReader,
    SuperblockFields,
    create_region,
    format_shm_uri,
    map_region,
)
from tensorpool.shm.batch import BatchReader

HERE = os.path.dirname(os.path.abspath(__file__))
NSLOTS, STRIDE, STREAM_ID, EPOCH = 8, 4096, 4242, 1  # what _stress_writer.py maps
MAX_SECONDS = 20.0
RUN = 4
_MUL = np.uint64(0x9E3779B97F4A7C15)
_ADD = np.uint64(0x5BD1E995)


def _rows_ok(array: np.ndarray, seqs: np.ndarray) -> np.ndarray:
    """Per row: every word is the seq, the last is its stamp."""
    s = seqs.astype(np.uint64)
    return (array[:, :-1] == s[:, None]).all(axis=1) & (array[:, -1] == s * _MUL + _ADD)


@pytest.mark.slow
def test_s8_3_s15_13_batch_path_accepts_no_torn_frame_across_processes(shm_base: str) -> None:
    lay = EpochLayout(shm_base, "stress", "w", EPOCH)
    create_region(
        lay.header_path,
        SuperblockFields.header_ring(epoch=EPOCH, stream_id=STREAM_ID, nslots=NSLOTS, now_ns=1),
    ).close()
    create_region(
        lay.pool_path(1),
        SuperblockFields.payload_pool(
            epoch=EPOCH, stream_id=STREAM_ID, pool_id=1, nslots=NSLOTS, stride_bytes=STRIDE,
            now_ns=1,
        ),
    ).close()  # fmt: skip
    control = os.path.join(shm_base, "control")
    with open(control, "wb") as f:
        f.write(bytes(64))
    with open(control, "r+b") as f:
        ctl_map = mmap.mmap(f.fileno(), 64)
    ctl = memoryview(ctl_map).cast("Q")
    policy = PathPolicy([shm_base])
    header = map_region(
        format_shm_uri(lay.header_path),
        ExpectedRegion.header_ring(epoch=EPOCH, stream_id=STREAM_ID, nslots=NSLOTS),
        policy,
    )
    pool = map_region(
        format_shm_uri(lay.pool_path(1)),
        ExpectedRegion.payload_pool(
            epoch=EPOCH, stream_id=STREAM_ID, pool_id=1, nslots=NSLOTS, stride_bytes=STRIDE
        ),
        policy,
    )
    reader = SlotReader(header, [pool])
    batches = BatchReader(reader)
    writer_args = [lay.header_path, lay.pool_path(1), control, str(MAX_SECONDS), "batch"]
    proc = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "_stress_writer.py"), shm_base, *writer_args]
    )
    accepted = accepted_copy = accepted_one = wrong_accepted = caught = reads = 0
    try:
        start = time.monotonic()
        while ctl[0] == 0:
            assert proc.poll() is None, "writer process died during startup"
            assert time.monotonic() - start < 30, "writer did not start"
            time.sleep(0.01)
        phase_end = time.monotonic() + 1.0
        i = 0
        while True:
            latest = ctl[0] - 1
            first = latest - RUN + 1 - (i % 9)  # from the newest runs to ones being overwritten
            i += 1
            if first < 0:
                continue
            reads += 1
            copy = bool(i & 1)
            one = (i & 7) < 2  # a zero-copy and a copied one-row read every eight
            if one:
                batch = batches.read_one(first, first & (NSLOTS - 1), copy)
            else:
                batch = batches.read_run(first, RUN, copy)
            if batch.array is None:
                continue  # nothing accepted (all rows late)
            ok = _rows_ok(batch.array, batch.seqs)
            if copy:
                accepted_copy += int(batch.valid.sum())
                wrong_accepted += int((batch.valid & ~ok).sum())
            else:
                before = batch.valid.copy()
                batch.confirm()
                accepted += int(batch.valid.sum())
                wrong_accepted += int((batch.valid & ~ok).sum())
                caught += int((before & ~batch.valid & ~ok).sum())
            if one:
                accepted_one += int(batch.valid.sum())
            if not i & 63 and time.monotonic() > phase_end:
                late = reader.counters.sum_of(LATE_REASONS)
                enough = late > 0 and accepted > 100 and accepted_copy > 100 and accepted_one > 50
                if enough or proc.poll() is not None:
                    break
                phase_end = time.monotonic() + 1.0  # extend the run until the guard fired
    finally:
        ctl[1] = 1
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    counts = reader.counters.snapshot()
    written = ctl[2]
    batches.close()
    reader.close()
    header.close()
    pool.close()
    ctl.release()
    ctl_map.close()
    summary = (
        f"reads={reads} accepted={accepted} accepted_copy={accepted_copy} "
        f"accepted_one={accepted_one} "
        f"caught_torn_payloads={caught} written={written} drops={counts}"
    )
    print(summary)
    assert proc.returncode == 0, summary
    assert wrong_accepted == 0, summary
    assert accepted > 100 and accepted_copy > 100 and accepted_one > 50, summary
    assert sum(v for k, v in counts.items() if k in LATE_REASONS) > 0, summary
    assert set(counts) <= {Reason.NOT_COMMITTED, Reason.SEQ_MISMATCH, Reason.TORN_READ}, summary
