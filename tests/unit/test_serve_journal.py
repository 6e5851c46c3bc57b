"""#30.3: the loss ledger's journal -- what keeps a query's read-time loss across a serve
restart (replay rules of :class:`LossLedger`, and the journal file of
:mod:`tensorpool.serve.journal` on real files)."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest

from tensorpool.serve.core import LossLedger, journal_record, journal_take
from tensorpool.serve.journal import JOURNAL, MARKER, TMP, LedgerJournal, StateDirError

K1, K2 = "a" * 32, "b" * 32


def test_30_3_replay_applies_records_and_takes_in_order() -> None:
    """A take removes what was recorded before it, not what came after (exactly once)."""
    j = journal_record(K1, 5, 2, 10, 1) + journal_record(K2, 5, 2, 7, 2)
    j += journal_take(K1, 3) + journal_record(K1, 5, 2, 4, 4) + journal_record(K1, 6, 1, 3, 5)
    led = LossLedger()
    got = led.replay(j, 10)
    assert got == Counter(loss_journal_replayed_records=4, loss_journal_replayed_takes=1)
    assert sorted(led.take(K1, 11)) == [(5, 2, 4), (6, 1, 3)]
    assert led.take(K2, 11) == [(5, 2, 7)]
    # replay did not count the old process's frames again
    assert led.counters["loss_ledger_frames"] == 0


def test_30_3_replay_skips_a_truncated_last_line_and_bad_lines() -> None:
    """kill -9 mid-write leaves an unfinished last line: skipped and counted, never fatal;
    so is any line that is not a record or a take."""
    good = journal_record(K1, 1, 1, 5, 1)
    bad = [b"garbage\n", b"r " + b"z" * 32 + b" 1 1 5 1\n", b"r " + K1.encode() + b" 1 1 0 1\n"]
    bad += [b"t " + K1.encode() + b" -1\n", b"\n", b"r " + K1.encode() + b" 1 1 5 1 9\n"]
    led = LossLedger()
    got = led.replay(good + b"".join(bad) + journal_record(K1, 1, 1, 3, 2)[:-4], 10)
    assert got["loss_journal_truncated"] == 1
    assert got["loss_journal_bad_line"] == len(bad)
    assert got["loss_journal_replayed_records"] == 1
    assert led.take(K1, 11) == [(1, 1, 5)]


def test_30_3_bounds_hold_after_replay() -> None:
    """The ledger's bound and TTL apply to a replayed ledger as to a live one."""
    led = LossLedger(max_entries=2, ttl_ns=100)
    j = b"".join(journal_record(K1, 1, ep, 1, ep) for ep in range(1, 5))
    led.replay(j + journal_record(K2, 1, 1, 9, 60), 104)
    assert len(led) == 1 and led.counters["loss_ledger_expired"] == 1  # K1/4 (at 4) expired
    assert led.take(K2, 105) == [(1, 1, 9)]


def test_30_3_journal_survives_a_restart_and_is_compacted(tmp_path: Path) -> None:
    """What one process appended, the next replays; at load the journal is rewritten as the
    live entries only (takes and taken records gone), through a temp file renamed over it."""
    d = str(tmp_path / "state")
    c: Counter[str] = Counter()
    led, j = LossLedger(), LedgerJournal(d)
    j.load(led, 0, c)
    for line, t in (
        (journal_record(K1, 1, 1, 5, 1), 1),
        (journal_record(K2, 1, 1, 6, 2), 2),
        (journal_take(K1, 3), 3),
        (journal_record(K1, 2, 1, 7, 4), 4),
    ):
        led.replay(line, t)  # as the server does: the ledger, then its journal line
        j.append(line, led)
    with open(os.path.join(d, JOURNAL), "ab") as f:  # a line cut short by kill -9
        f.write(b"r " + K1.encode() + b" 3")
    j.close()

    led2, j2 = LossLedger(), LedgerJournal(d)
    c2: Counter[str] = Counter()
    j2.load(led2, 10, c2)
    assert c2["loss_journal_truncated"] == 1 and c2["loss_journal_replayed_takes"] == 1
    body = Path(d, JOURNAL).read_bytes()
    assert body == journal_record(K2, 1, 1, 6, 2) + journal_record(K1, 2, 1, 7, 4)
    assert sorted(os.listdir(d)) == [JOURNAL, MARKER]  # the temp file was renamed
    assert led2.take(K1, 11) == [(2, 1, 7)]
    j2.append(journal_take(K1, 11), led2)
    j2.close()
    led3, j3 = LossLedger(), LedgerJournal(d)
    j3.load(led3, 12, Counter())
    assert led3.take(K1, 13) == [] and led3.take(K2, 13) == [(1, 1, 6)]  # taken once
    j3.close()


def test_30_3_journal_grows_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long-running serve compacts once the journal holds many more lines than entries."""
    monkeypatch.setattr("tensorpool.serve.journal.COMPACT_AFTER_LINES", 8)
    led, j = LossLedger(), LedgerJournal(str(tmp_path))
    j.load(led, 0, Counter())
    for t in range(1, 40):
        led.record(K1, 1, 1, 1, t)
        j.append(journal_record(K1, 1, 1, 1, t), led)
    j.close()
    assert len(Path(tmp_path, JOURNAL).read_bytes().splitlines()) <= 9
    led2, j2 = LossLedger(), LedgerJournal(str(tmp_path))
    j2.load(led2, 50, Counter())
    assert led2.take(K1, 51) == [(1, 1, 39)]
    j2.close()


def test_30_3_two_serves_never_share_a_journal(tmp_path: Path) -> None:
    j = LedgerJournal(str(tmp_path))
    try:
        with pytest.raises(StateDirError, match=f"another tensorpool serve \\(pid {os.getpid()}"):
            LedgerJournal(str(tmp_path))
    finally:
        j.close()
    LedgerJournal(str(tmp_path)).close()  # released with the holder


def test_30_3_a_foreign_directory_is_not_adopted(tmp_path: Path) -> None:
    """Serve writes only in a directory it created or marked: a non-empty unmarked one is
    refused and left as it was; in its own directory it leaves foreign files alone."""
    Path(tmp_path, "notes.txt").write_text("mine")
    with pytest.raises(StateDirError, match="not a tensorpool serve state directory"):
        LedgerJournal(str(tmp_path))
    assert os.listdir(tmp_path) == ["notes.txt"]
    own = tmp_path / "own"
    j, owed = LedgerJournal(str(own)), LossLedger()
    j.load(owed, 0, Counter())
    owed.replay(journal_record(K1, 1, 1, 1, 1), 1)  # owing a count: the directory stays
    j.append(journal_record(K1, 1, 1, 1, 1), owed)
    j.close()
    Path(own, "notes.txt").write_text("mine")
    Path(own, TMP).write_bytes(b"left by a serve killed mid-compaction\n")
    j = LedgerJournal(str(own))
    j.load(LossLedger(), 0, Counter())
    j.close()
    assert sorted(os.listdir(own)) == sorted([JOURNAL, MARKER, "notes.txt"])
    assert (own.stat().st_mode & 0o777) == 0o700


def test_30_3_a_serve_owing_nothing_leaves_nothing_behind(tmp_path: Path) -> None:
    """Leave nothing behind: a clean stop with an empty ledger removes the journal, the marker
    and the directory serve created; owing a count keeps them; a directory that was there
    before (configured) is emptied of serve's files only, never removed."""
    d = str(tmp_path / "made")
    led, j = LossLedger(), LedgerJournal(d)
    j.load(led, 0, Counter())
    line = journal_record(K1, 1, 1, 5, 1)
    led.replay(line, 1)
    j.append(line, led)
    j.close()
    assert sorted(os.listdir(d)) == [JOURNAL, MARKER]  # owed: kept for the next serve

    led2, j2 = LossLedger(), LedgerJournal(d)
    j2.load(led2, 2, Counter())
    assert led2.take(K1, 3) == [(1, 1, 5)]
    j2.append(journal_take(K1, 3), led2)
    j2.close()
    assert not os.path.exists(d)  # created by a serve (the marker said so), nothing owed

    given = tmp_path / "given"
    given.mkdir()
    led3, j3 = LossLedger(), LedgerJournal(str(given))
    j3.load(led3, 4, Counter())
    j3.close()
    assert given.is_dir() and os.listdir(given) == []
