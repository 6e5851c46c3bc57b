"""shm/epochs.py: epoch directories and the last-epoch marker, one rule set for the standalone
producer and the driver (#14.1; Wire §15.2: a restart never reuses an epoch)."""

from __future__ import annotations

import os
import tempfile

from tensorpool.shm.epochs import (
    LAST_EPOCH_FILE,
    epochs_in,
    gc_epoch_dirs,
    next_epoch,
    parse_epoch_dirname,
    read_last_epoch,
    record_last_epoch,
)


def test_14_1_one_epoch_dirname_rule() -> None:
    assert parse_epoch_dirname("epoch-7") == 7
    for bad in ("epoch-0", "epoch-007", "epoch-", "epoch-x", "Epoch-1", "epoch-1/", "epoch-1\n",
                "stream-1", f"epoch-{2**64}"):  # fmt: skip
        assert parse_epoch_dirname(bad) is None, bad


def test_s15_2_next_epoch_is_above_dirs_and_marker() -> None:
    with tempfile.TemporaryDirectory() as d:
        assert next_epoch(d) == 1
        assert next_epoch(os.path.join(d, "missing")) == 1
        for e in (2, 5):
            os.mkdir(os.path.join(d, f"epoch-{e}"))
        os.symlink(os.path.join(d, "epoch-5"), os.path.join(d, "epoch-9"))  # not ours
        assert epochs_in(d) == [2, 5] and next_epoch(d) == 6
        record_last_epoch(d, 8)
        assert read_last_epoch(d) == 8 and next_epoch(d) == 9
        assert oct(os.stat(os.path.join(d, LAST_EPOCH_FILE)).st_mode & 0o777) == "0o600"


def test_s15_2_gc_keeps_the_newest_and_the_marker() -> None:
    with tempfile.TemporaryDirectory() as d:
        for e in (1, 2, 3):
            os.mkdir(os.path.join(d, f"epoch-{e}"))
        os.mkdir(os.path.join(d, "epoch-01"))  # not a name we create: left alone
        record_last_epoch(d, 3)
        assert gc_epoch_dirs(d, keep=1) == [1, 2]
        assert sorted(os.listdir(d)) == ["epoch-01", "epoch-3", LAST_EPOCH_FILE]
        assert next_epoch(d) == 4
