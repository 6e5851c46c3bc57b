"""Cross-process torn-read stress (§8.3, §15.13 "commit-word stability under overwrite").

A separate writer process rewrites an 8-slot ring as fast as it can, stamping a checksum into
every payload. This process reads frames that are about to be overwritten and checks every
*accepted* frame's checksum. The guard must fire (late/torn drops observed) and must never let
a wrong payload through. The run is extended in steps until the guard has fired, so the
assertion is about behaviour, not timing.
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

HERE = os.path.dirname(os.path.abspath(__file__))
NSLOTS, STRIDE, STREAM_ID, EPOCH = 8, 4096, 4242, 1
MASK64 = (1 << 64) - 1
MAX_SECONDS = 20.0


def stamp(seq: int) -> int:
    return (seq * 0x9E3779B97F4A7C15 + 0x5BD1E995) & MASK64


@pytest.mark.slow
def test_s8_3_s15_13_no_torn_payload_accepted_across_processes(shm_base: str) -> None:
    lay = EpochLayout(shm_base, "stress", "w", EPOCH)
    create_region(
        lay.header_path,
        SuperblockFields.header_ring(epoch=EPOCH, stream_id=STREAM_ID, nslots=NSLOTS, now_ns=1),
    ).close()
    create_region(
        lay.pool_path(1),
        SuperblockFields.payload_pool(
            epoch=EPOCH,
            stream_id=STREAM_ID,
            pool_id=1,
            nslots=NSLOTS,
            stride_bytes=STRIDE,
            now_ns=1,
        ),
    ).close()
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
    proc = subprocess.Popen(
        [
            sys.executable,
            os.path.join(HERE, "_stress_writer.py"),
            shm_base,
            lay.header_path,
            lay.pool_path(1),
            control,
            str(MAX_SECONDS),
        ],
    )
    accepted = accepted_copy = wrong_accepted = caught = reads = 0
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
            # Cycle through ring ages: the oldest slots are about to be overwritten (races),
            # the newest are usually stable (acceptances).
            seq = latest - (i & 7)
            i += 1
            if seq < 0:
                continue
            reads += 1
            want = stamp(seq)
            if i & 1:
                got = reader.read(seq & 7, seq)
                if got is None:
                    continue
                a = got.array
                ok = bool((a[:-1] == seq).all()) and int(a[-1]) == want
                if reader.is_current(got):
                    accepted += 1
                    wrong_accepted += not ok
                else:
                    caught += not ok
            else:
                got = reader.read_copy(seq & 7, seq)
                if got is None:
                    continue
                a = got.array
                ok = bool((a[:-1] == seq).all()) and int(a[-1]) == want
                accepted_copy += 1
                wrong_accepted += not ok
            if not i & 255 and time.monotonic() > phase_end:
                late = reader.counters.sum_of(LATE_REASONS)
                enough = late > 0 and accepted > 100 and accepted_copy > 100
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
    reader.close()
    header.close()
    pool.close()
    ctl.release()
    ctl_map.close()
    summary = (
        f"reads={reads} accepted={accepted} accepted_copy={accepted_copy} "
        f"caught_torn_payloads={caught} written={written} drops={counts}"
    )
    print(summary)
    assert proc.returncode == 0, summary
    assert wrong_accepted == 0, summary
    assert accepted > 100 and accepted_copy > 100, summary
    assert reader_late(counts) > 0, summary
    assert set(counts) <= {Reason.NOT_COMMITTED, Reason.SEQ_MISMATCH, Reason.TORN_READ}, summary


def reader_late(counts: dict[str, int]) -> int:
    return sum(v for k, v in counts.items() if k in LATE_REASONS)


def test_stamp_is_not_trivially_constant() -> None:
    assert len({stamp(s) for s in range(1000)}) == 1000
    assert np.uint64(stamp(1)) != np.uint64(1)
