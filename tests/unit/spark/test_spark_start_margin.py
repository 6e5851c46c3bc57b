"""#16.1 where ``earliest`` starts on a live ring, and #16.3 the host check of a planned read.

Pure rules: the margin forecast over a scanned ring (stamps as a producer writes them), and
:func:`check_origin` against real files. The foreign host is the one fake here: a second kernel
cannot exist on one machine, so its :class:`HostView` is constructed.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from tensorpool.spark_source.options import parse_source_options
from tensorpool.spark_source.plan.margin import safe_earliest
from tensorpool.spark_source.plan.offsets import (
    OVERWRITTEN,
    REGIONS_GONE,
    Loss,
    RingState,
    loss_message,
)
from tensorpool.spark_source.rings.hosts import (
    BATCH,
    HostView,
    PlanOrigin,
    TensorPoolWrongHostError,
    check_origin,
)
from tensorpool.spark_source.spark.loss_text import batch_loss_message, explicit_start_hint

S = 1_000_000_000


def ring(nslots: int, head: int, hz: float, now: int, idle_s: float = 0.0) -> RingState:
    """A dense ring after ``head`` frames at ``hz``; the newest was stamped ``idle_s`` ago."""
    seqs = np.arange(max(0, head - nslots), head, dtype=np.int64)
    slot_seq = np.full(nslots, -1, np.int64)
    slot_seq[seqs % nslots] = seqs
    stamps = np.zeros(nslots, np.int64)
    newest = now - int(idle_s * S)
    stamps[seqs % nslots] = newest - ((head - 1 - seqs) * S / hz).astype(np.int64)
    committed = slot_seq >= 0
    return RingState.from_slots(3, slot_seq, committed, None, stamps)


def test_full_live_ring_skips_what_the_margin_overwrites() -> None:
    """#16.1: 100 Hz into 1024 slots, 5 s margin: start ~500 frames past the oldest, so the
    planned frames outlive the margin (the oldest would be gone in 10 ms)."""
    now = 1000 * S
    st = ring(1024, 5000, 100.0, now)
    choice = safe_earliest(st, now, 5 * S)
    assert st.oldest == 5000 - 1024
    assert 495 <= choice.skipped <= 505
    assert choice.seq == st.oldest + choice.skipped and not choice.capped
    # frame `seq` is overwritten when the producer reaches seq + 1024: >= 5 s of frames away
    assert (choice.seq + 1024 - st.head) / 100.0 >= 5.0
    assert 95 < choice.rate_hz < 105


def test_idle_or_unfilled_rings_and_zero_margin_start_at_the_oldest() -> None:
    """#16.1: a stopped stream, a burst that filled the ring and stopped, a ring far from
    wrapping, and earliestMarginMs=0 all keep every frame."""
    now = 1000 * S
    assert safe_earliest(ring(16, 30, 100.0, now, idle_s=60), now, 5 * S).seq == 14
    assert safe_earliest(ring(4096, 300, 100.0, now), now, 5 * S).seq == 0
    assert safe_earliest(ring(1024, 5000, 100.0, now), now, 0).seq == 5000 - 1024
    # a burst that filled the ring (64 frames in 64 us) and stopped 0.2 s ago
    assert safe_earliest(ring(64, 64, 1e6, now, idle_s=0.2), now, 5 * S).seq == 0


def test_ring_shorter_than_the_margin_keeps_its_newest_quarter() -> None:
    """#16.1: 1 kHz into 1024 slots holds ~1 s; a 5 s margin cannot be met, so the newest
    quarter is read (and the result is marked capped for the warning)."""
    now = 1000 * S
    st = ring(1024, 50_000, 1000.0, now)
    choice = safe_earliest(st, now, 5 * S)
    assert choice.capped and choice.seq == st.head - 256
    assert choice.ring_span_s is not None and choice.ring_span_s < 1.1


def test_stamps_on_another_clock_use_the_rings_own_rate() -> None:
    """#16.1: stamps far in the future of the stream's clock (event times written through the
    sink) fall back to the rate over the ring's span."""
    now = 1000 * S
    st = ring(1024, 5000, 100.0, now + 10**6 * S)
    choice = safe_earliest(st, now, 5 * S)
    assert 495 <= choice.skipped <= 505


def test_earliest_margin_option_default_and_bounds() -> None:
    """#16.1: earliestMarginMs defaults to 5000, 0 disables it, negatives fail naming it."""
    assert parse_source_options({"streams": "1"}).earliest_margin_ms == 5000
    assert parse_source_options({"streams": "1", "earliestmarginms": "0"}).earliest_margin_ms == 0
    with pytest.raises(ValueError, match=r"^earliestMarginMs"):
        parse_source_options({"streams": "1", "earliestMarginMs": "-1"})


def _origin(tmp_path: os.PathLike[str]) -> PlanOrigin:
    header = os.path.join(tmp_path, "header.ring")
    with open(header, "wb") as f:
        f.write(b"x")
    return PlanOrigin.of(header, os.fspath(tmp_path), BATCH)


def test_a_task_on_another_host_is_told_which_host_and_directory(tmp_path) -> None:
    """#16.3: another kernel (boot id) is the wrong host, named with the planning host, the
    directory and what to do -- even though the files exist here."""
    origin = _origin(tmp_path)
    other = HostView("producer-host", "00000000-0000-0000-0000-000000000000", "mnt:[1]")
    far = dataclasses.replace(origin, view=other)
    with pytest.raises(TensorPoolWrongHostError) as err:
        check_origin(7, far)
    text = str(err.value)
    assert "stream 7" in text and "producer-host" in text and os.fspath(tmp_path) in text
    assert HostView.here().hostname in text and "Run the Spark executors on" in text
    assert "fell behind" not in text
    check_origin(7, origin)  # the planning host itself passes


def test_same_host_other_namespace_fails_only_when_the_files_differ(tmp_path) -> None:
    """#16.3: same kernel, another mount namespace: fine if the header file is the same one;
    the wrong view when it is missing; missing in the *same* namespace is the producer gone
    (loss, reported by the read, not this check)."""
    origin = _origin(tmp_path)
    here = HostView.here()
    elsewhere = dataclasses.replace(origin, view=dataclasses.replace(here, mnt_ns="mnt:[1]"))
    check_origin(1, elsewhere)  # same file: a namespace sharing the directory
    os.unlink(origin.header_path)
    with pytest.raises(TensorPoolWrongHostError, match="another mount namespace"):
        check_origin(1, elsewhere)
    check_origin(1, origin)  # same namespace, file gone: the producer exited


def test_loss_messages_say_why_for_each_kind_of_read(tmp_path) -> None:
    """#16.3: "the query fell behind" only for a streaming query's own loss; batch snapshots,
    explicit old offsets and exited producers get their own explanation."""
    over = [Loss(1, 2, 10, None, OVERWRITTEN, 64)]
    gone = [Loss(1, 2, 10, 5, REGIONS_GONE, 0, 14)]
    assert "fell behind" in loss_message(over)
    batch = batch_loss_message(_origin(tmp_path))(over)
    assert "fell behind" not in batch and ".cache()" in batch and "snapshot" in batch
    assert "fell behind" not in loss_message(gone) and "exited" in loss_message(gone)
    explicit = loss_message(over, explicit_start_hint(1, 10, 50, 64))
    assert "fell behind" not in explicit and "startingOffsets" in explicit
