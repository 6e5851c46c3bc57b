"""`tensorpool bridge`: status lines, rates, and configuration errors (Bridge Spec §10)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorpool.bridge.app import RateMeter, format_status_line
from tensorpool.cli import main

SENDER = {
    "instance_id": "b1", "role": "sender", "mapping": "10000->20000", "frames": 0, "bytes": 0,
    "source_epoch": 3, "drops": {"back_pressured": 2}, "source_drops_gap": 1,
    "source_drops_late": 0,
}  # fmt: skip
RECEIVER = {
    "instance_id": "b2", "role": "receiver", "mapping": "10000->20000", "frames": 0, "bytes": 0,
    "dest_stream_id": 20000, "local_epoch": 5, "source_epoch": 3, "assembly_timeouts": 4,
    "chunk_drops": {"no_announce": 7, "duplicate_chunk": 2}, "frame_drops": {"superseded": 1},
}  # fmt: skip


def test_rates_between_snapshots() -> None:
    meter = RateMeter()
    first = meter.update([dict(RECEIVER)], 0)[0]
    assert first["fps"] == 0.0
    later = meter.update([{**RECEIVER, "frames": 100, "bytes": 65_536_000}], 2_000_000_000)[0]
    assert later["fps"] == 50.0 and later["mb_s"] == 32.77


def test_status_line_names_rates_drops_and_timeouts() -> None:
    rx = format_status_line({**RECEIVER, "fps": 12.5, "mb_s": 8.19})
    assert "12.5 frames/s" in rx and "8.19 MB/s" in rx
    assert "assembly timeouts 4" in rx and "local epoch 5" in rx
    assert "no_announce=7" in rx and "superseded=1" in rx
    assert "duplicate_chunk" not in rx  # ignored duplicates are not drops
    assert "dest 20000 local" in rx
    attaching = {**RECEIVER, "destination": "attaching", "local_epoch": None}
    assert "dest 20000 (attaching) local epoch None" in format_status_line(attaching)
    tx = format_status_line({**SENDER, "fps": 1.0, "mb_s": 0.66})
    assert "back_pressured=2" in tx and "source_gap=1" in tx and "epoch 3" in tx


def test_s10_invalid_config_exits_2_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "bridge.toml"
    cfg.write_text(
        '[bridge]\ninstance_id = "x"\n\n[[mappings]]\nsource_stream_id = 1\n'
        'dest_stream_id = 2\nprofile = "p"\nrole = "receiver"\n'
    )
    assert main(["bridge", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "bridge.payload_channel" in err and str(cfg) in err


def test_config_is_required(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TENSORPOOL_BRIDGE_CONFIG", raising=False)
    assert main(["bridge"]) == 2
    assert "--config" in capsys.readouterr().err
