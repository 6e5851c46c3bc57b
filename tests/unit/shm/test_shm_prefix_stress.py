"""Prefix reads under overwrite, across processes (Wire §10.2.2 prefix safety, §8.3).

The torn-read stress writer (``_stress_writer.py``) rewrites an 8-slot ring flat out; this
process reads the full prefix of frames that are about to be overwritten with
``SlotReader.read_prefix`` and checks every accepted copy's checksum. The seqlock rule for
prefix reads (the commit word names the frame before *and after* the copy) must catch every
slot reused mid-copy: no wrong prefix accepted, and ``prefix_slot_reused`` observed. The run is
extended until both accepted and refused reads were seen (behaviour, not timing).
"""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import time

import numpy as np
import pytest

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
from tensorpool.shm.seqlock import PREFIX_SLOT_REUSED

HERE = os.path.dirname(os.path.abspath(__file__))
NSLOTS, STRIDE, STREAM_ID, EPOCH = 8, 4096, 4242, 1
MASK64 = (1 << 64) - 1
MAX_SECONDS = 20.0


def stamp(seq: int) -> int:
    return (seq * 0x9E3779B97F4A7C15 + 0x5BD1E995) & MASK64


@pytest.mark.slow
def test_s10_2_2_s8_3_no_torn_prefix_accepted_across_processes(shm_base: str) -> None:
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
    writer = [sys.executable, os.path.join(HERE, "_stress_writer.py"), shm_base]
    proc = subprocess.Popen([*writer, lay.header_path, lay.pool_path(1), control, str(MAX_SECONDS)])
    accepted = wrong = reused = 0
    try:
        start = time.monotonic()
        while ctl[0] == 0:
            assert proc.poll() is None, "writer process died during startup"
            assert time.monotonic() - start < 30, "writer did not start"
            time.sleep(0.01)
        phase_end = time.monotonic() + 1.0
        i = 0
        while True:
            # a published (committed) frame, oldest first: about to be overwritten (races)
            seq = ctl[0] - 1 - (i & 7)
            i += 1
            if seq < 0:
                continue
            got = reader.read_prefix(seq & 7, seq, STRIDE)
            if isinstance(got, str):
                reused += got == PREFIX_SLOT_REUSED
            else:
                words = got.data.view(np.uint64)
                accepted += 1
                wrong += not (bool((words[:-1] == seq).all()) and int(words[-1]) == stamp(seq))
            if not i & 255 and time.monotonic() > phase_end:
                if (accepted > 100 and reused > 0) or proc.poll() is not None:
                    break
                phase_end = time.monotonic() + 1.0
    finally:
        ctl[1] = 1
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    reader.close()
    header.close()
    pool.close()
    ctl.release()
    ctl_map.close()
    summary = f"accepted={accepted} wrong={wrong} reused={reused}"
    assert proc.returncode == 0, summary
    assert wrong == 0, summary
    assert accepted > 100 and reused > 0, summary
