"""AnnounceTracker: Wire Spec §10.1.1 announce acceptance and §15.21 epoch mapping."""

from tensorpool.client.announce import (
    CLOCK_MONOTONIC,
    CLOCK_REALTIME_SYNCED,
    AnnounceTracker,
    Verdict,
)

SEC = 1_000_000_000


def _tracker(**kw: object) -> AnnounceTracker:
    kw.setdefault("realtime_clock", lambda: 1_000 * SEC)  # the fake clock
    return AnnounceTracker(stream_id=7, freshness_ns=3 * SEC, **kw)  # type: ignore[arg-type]


def _announce(
    t: AnnounceTracker,
    *,
    epoch=1,
    ts=10 * SEC,
    clock=CLOCK_MONOTONIC,
    slot=256,
    join=None,
    now=10 * SEC,
    stream=7,
):
    return t.on_announce(stream, epoch, ts, clock, slot, join, now)


def test_s10_1_1_first_fresh_announce_maps() -> None:
    t = _tracker()
    assert _announce(t).verdict is Verdict.MAP
    assert t.epoch is None  # not until the mapping succeeded
    t.on_mapped(1, 10 * SEC)
    assert t.epoch == 1


def test_s10_1_1_other_stream_ignored() -> None:
    d = _announce(_tracker(), stream=8)
    assert (d.verdict, d.reason) == (Verdict.IGNORE, "other_stream")


def test_s8_1_header_slot_bytes_must_be_256() -> None:
    d = _announce(_tracker(), slot=128)
    assert (d.verdict, d.reason) == (Verdict.IGNORE, "announce_bad_header_slot_bytes")


def test_s10_1_1_stale_announce_outside_freshness_window_ignored() -> None:
    d = _announce(_tracker(), ts=1 * SEC, now=10 * SEC)
    assert (d.verdict, d.reason) == (Verdict.IGNORE, "announce_stale")


def test_s10_1_1_monotonic_announce_before_join_time_ignored() -> None:
    t = _tracker()
    d = _announce(t, ts=9 * SEC, join=10 * SEC, now=10 * SEC)
    assert (d.verdict, d.reason) == (Verdict.IGNORE, "announce_before_join")
    # the same timestamp on an image that joined earlier is fine
    assert _announce(t, ts=9 * SEC, join=8 * SEC, now=10 * SEC).verdict is Verdict.MAP


def test_s10_1_1_realtime_synced_skips_join_rule_and_uses_realtime_freshness() -> None:
    t = _tracker(realtime_clock=lambda: 1_000 * SEC)
    # stamped "before join" in monotonic terms but REALTIME_SYNCED: join rule must not apply
    d = _announce(t, ts=999 * SEC, clock=CLOCK_REALTIME_SYNCED, join=10 * SEC, now=10 * SEC)
    assert d.verdict is Verdict.MAP
    stale = _announce(t, ts=990 * SEC, clock=CLOCK_REALTIME_SYNCED, join=10 * SEC, now=10 * SEC)
    assert stale.reason == "announce_stale"


def test_s10_1_1_unknown_clock_domain_ignored() -> None:
    assert _announce(_tracker(), clock=9).reason == "announce_unknown_clock_domain"


def test_s10_1_1_highest_epoch_wins_and_older_epoch_ignored() -> None:
    t = _tracker()
    assert _announce(t, epoch=3).verdict is Verdict.MAP
    t.on_mapped(3, 10 * SEC)
    assert _announce(t, epoch=3).verdict is Verdict.REFRESH
    assert _announce(t, epoch=2).reason == "announce_old_epoch"
    assert _announce(t, epoch=4).verdict is Verdict.MAP
    t.on_mapped(4, 10 * SEC)
    assert t.epoch == 4


def test_s15_21_unmappable_announce_does_not_raise_the_epoch_floor() -> None:
    t = _tracker()
    assert _announce(t, epoch=99).verdict is Verdict.MAP  # mapping then fails: no on_mapped
    assert _announce(t, epoch=1).verdict is Verdict.MAP  # the real producer is still eligible


def test_s15_21_refresh_keeps_mapping_alive_and_silence_unmaps() -> None:
    t = _tracker()
    _announce(t, epoch=1, ts=10 * SEC, now=10 * SEC)
    t.on_mapped(1, 10 * SEC)
    assert t.tick(12 * SEC) is None
    _announce(t, epoch=1, ts=12 * SEC, now=12 * SEC)
    assert t.tick(15 * SEC) is None  # 3 s since the last fresh announce: still inside
    d = t.tick(15 * SEC + 1)
    assert d is not None and d.verdict is Verdict.UNMAP and d.reason == "announce_timeout"
    assert not t.mapped
    # after a stale-unmap a restarted producer with a lower epoch can be mapped
    assert _announce(t, epoch=1, ts=20 * SEC, now=20 * SEC).verdict is Verdict.MAP
