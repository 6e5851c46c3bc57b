"""Bridge configuration (Bridge Spec §10, §4, §7.1, §9, §2.3): defaults and fail-fast rules."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tensorpool.bridge.config import (
    DEFAULT_MTU_BYTES,
    BridgeConfig,
    ConfigError,
    MappingRole,
    effective_chunk_bytes,
    load_bridge_config,
)

REPO = Path(__file__).resolve().parents[3]
#: The reference example's facts, kept in the checkout (#14.4: no test reads outside it).
REF_EXAMPLE = Path(__file__).resolve().parent / "fixtures" / "bridge_reference_example.toml"

BASE = """
[bridge]
instance_id = "b1"
payload_channel = "aeron:udp?endpoint=127.0.0.1:40456"
payload_stream_id = 3000
control_channel = "aeron:udp?endpoint=127.0.0.1:40457"
control_stream_id = 3001
"""

MAPPING = """
[[mappings]]
source_stream_id = 10000
dest_stream_id = 20000
profile = "p"
role = "receiver"
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "bridge.toml"
    p.write_text(textwrap.dedent(text))
    return p


def load(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> BridgeConfig:
    return load_bridge_config(write(tmp_path, text), env={} if env is None else env)


def error(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> ConfigError:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_bridge_config(path, env={} if env is None else env)
    assert info.value.file == str(path)
    return info.value


def test_s10_defaults(tmp_path: Path) -> None:
    """Optional keys take the spec's defaults; chunk size is mtu - 128 by default."""
    cfg = load(tmp_path, BASE + MAPPING)
    b = cfg.bridge
    assert b.mtu_bytes == DEFAULT_MTU_BYTES == 1408
    assert b.chunk_size == 1408 - 128
    assert b.max_chunk_bytes == 65535
    assert b.max_payload_bytes == 1073741824
    assert b.dest_stream_id_range is None
    assert b.forward_qos is False and b.forward_progress is False
    assert b.assembly_timeout_ms == 250 and b.assembly_timeout_ns == 250_000_000
    # forward_metadata defaults to true but without a metadata channel it is disabled (§7.1)
    assert b.metadata_enabled is False
    assert any("metadata forwarding disabled" in w for w in cfg.warnings)
    m = cfg.mappings[0]
    assert m.metadata_stream_id == 20000  # defaults to dest_stream_id (§10)
    assert m.source_control_stream_id == 0 and m.dest_control_stream_id == 0
    assert m.role is MappingRole.RECEIVER
    assert b.receive_payload_channel == b.payload_channel


@pytest.mark.parametrize(
    ("mtu", "chunk", "cap", "expected"),
    [(1408, 0, 65535, 1280), (1408, 1200, 65535, 1200), (1408, 4000, 65535, 1280),
     (9000, 8192, 65535, 8192), (9000, 0, 4096, 4096)],
)  # fmt: skip
def test_s10_effective_chunk_size(mtu: int, chunk: int, cap: int, expected: int) -> None:
    """min(chunk_bytes, mtu_bytes - 128), mtu_bytes - 128 when unset, capped by max_chunk."""
    assert effective_chunk_bytes(mtu, chunk, cap) == expected


def test_s10_mtu_defaults_to_the_channel_mtu(tmp_path: Path) -> None:
    text = BASE.replace("40456", "40456|mtu=8992") + MAPPING
    cfg = load(tmp_path, text)
    assert cfg.bridge.mtu_bytes == 8992
    assert cfg.bridge.chunk_size == 8992 - 128


def test_s5_2_chunks_that_cannot_fit_the_channel_mtu_fail_fast(tmp_path: Path) -> None:
    text = BASE.replace("40456", "40456|mtu=1408") + "mtu_bytes = 9000\n" + MAPPING
    err = error(tmp_path, text)
    assert err.key == "bridge.chunk_bytes"


def test_reference_example_loads_with_a_role(tmp_path: Path) -> None:
    """The spec's example file is accepted as is, once each mapping has a role (here via the
    environment override BRIDGE_ROLE); without one it fails naming the key (#14.4: the
    fixture is part of the checkout, so this test always runs)."""
    text = REF_EXAMPLE.read_text()
    err = error(tmp_path, text)
    assert err.key == "mappings[0].role"
    cfg = load(tmp_path, text, env={"BRIDGE_ROLE": "sender"})
    assert cfg.bridge.chunk_size == 1200  # min(1200, 1408 - 128)
    assert cfg.bridge.metadata_enabled and cfg.bridge.metadata_stream_id == 3002
    assert [m.source_stream_id for m in cfg.sender_mappings] == [10000, 10001, 20000, 20001]
    assert cfg.receiver_mappings == ()


@pytest.mark.parametrize("name", ["bridge.hostA.example.toml", "bridge.hostB.example.toml"])
def test_shipped_two_host_examples_load(name: str) -> None:
    cfg = load_bridge_config(REPO / "config" / name, env={})
    assert cfg.mappings
    assert cfg.bridge.metadata_enabled


@pytest.mark.parametrize(
    "key", ["instance_id", "payload_channel", "payload_stream_id", "control_channel",
            "control_stream_id"],
)  # fmt: skip
def test_s10_required_keys(tmp_path: Path, key: str) -> None:
    lines = [ln for ln in BASE.splitlines() if not ln.startswith(key + " ")]
    err = error(tmp_path, "\n".join(lines) + MAPPING)
    assert err.key == f"bridge.{key}" and "required" in err.reason


def test_s10_mappings_required(tmp_path: Path) -> None:
    assert error(tmp_path, BASE).key == "mappings"


def test_unknown_key_is_an_error(tmp_path: Path) -> None:
    err = error(tmp_path, BASE + "chunk_byte = 100\n" + MAPPING)
    assert err.key == "bridge.chunk_byte" and "chunk_bytes" in err.reason


def test_s7_1_explicit_forward_metadata_without_channel_fails(tmp_path: Path) -> None:
    err = error(tmp_path, BASE + "forward_metadata = true\n" + MAPPING)
    assert err.key == "bridge.forward_metadata"


def test_s7_1_metadata_channel_without_stream_id_fails(tmp_path: Path) -> None:
    text = BASE + 'metadata_channel = "aeron:udp?endpoint=127.0.0.1:40458"\n' + MAPPING
    assert error(tmp_path, text).key == "bridge.metadata_stream_id"


def test_s7_1_metadata_disabled_explicitly_is_fine(tmp_path: Path) -> None:
    cfg = load(tmp_path, BASE + "forward_metadata = false\n" + MAPPING)
    assert not cfg.bridge.metadata_enabled and not cfg.warnings


@pytest.mark.parametrize("flag", ["forward_progress", "forward_qos"])
def test_s9_forwarding_needs_control_stream_ids(tmp_path: Path, flag: str) -> None:
    err = error(tmp_path, BASE + f"{flag} = true\n" + MAPPING)
    assert err.key == "mappings[0].source_control_stream_id"
    ok = MAPPING + "source_control_stream_id = 1201\ndest_control_stream_id = 2201\n"
    assert getattr(load(tmp_path, BASE + f"{flag} = true\n" + ok).bridge, flag)


def test_s4_dest_zero_needs_a_range(tmp_path: Path) -> None:
    err = error(tmp_path, BASE + MAPPING.replace("20000", "0"))
    assert err.key == "mappings[0].dest_stream_id"


def test_s4_dest_zero_allocates_from_the_range_skipping_used_ids(tmp_path: Path) -> None:
    text = (
        BASE
        + 'dest_stream_id_range = "50000-50009"\n'
        + MAPPING.replace("20000", "0")
        + MAPPING.replace("10000", "10001").replace("20000", "0")
        + MAPPING.replace("10000", "10002").replace("20000", "0")
    )
    cfg = load(tmp_path, text)
    assert [m.dest_stream_id for m in cfg.mappings] == [50000, 50001, 50002]
    assert all(m.dest_allocated for m in cfg.mappings)
    assert {50000, 50001, 50002} <= cfg.reserved_stream_ids


def test_s4_range_exhausted(tmp_path: Path) -> None:
    text = (
        BASE
        + "dest_stream_id_range = [50000, 50000]\n"
        + MAPPING.replace("20000", "0")
        + MAPPING.replace("10000", "10001").replace("20000", "0")
    )
    assert error(tmp_path, text).key == "bridge.dest_stream_id_range"


@pytest.mark.parametrize(
    ("extra", "owner"),
    [
        ('dest_stream_id_range = "2990-3010"\n', "bridge.payload_stream_id"),
        ('dest_stream_id_range = "1000-1000"\n', "local.control_stream_id"),
        ('dest_stream_id_range = "1200-1200"\n', "local.qos_stream_id"),
        ('dest_stream_id_range = "1300-1300"\n', "metadata_stream_id"),
        ('dest_stream_id_range = "19990-20010"\n', "mappings[0].dest_stream_id"),
    ],
)
def test_s10_range_must_not_overlap_control_metadata_qos_or_static_ids(
    tmp_path: Path, extra: str, owner: str
) -> None:
    err = error(tmp_path, BASE + extra + MAPPING)
    assert err.key == "bridge.dest_stream_id_range" and owner in err.reason


def test_s4_one_exclusive_producer_per_destination(tmp_path: Path) -> None:
    err = error(tmp_path, BASE + MAPPING + MAPPING.replace("10000", "10001"))
    assert err.key == "mappings[1].dest_stream_id"


def test_s2_3_feedback_loop_in_one_process_is_refused(tmp_path: Path) -> None:
    text = (
        BASE
        + MAPPING
        + MAPPING.replace("10000", "X")
        .replace("20000", "10000")
        .replace("X", "20000")
        .replace('"receiver"', '"sender"')
    )
    # receives 10000->20000 and sends 20000->10000: frames would loop back
    err = error(tmp_path, text)
    assert "feedback" in err.reason


def test_s2_3_both_directions_in_one_process(tmp_path: Path) -> None:
    """One process may host sender and receiver mappings, with their own receive endpoints."""
    text = (
        BASE
        + 'receive_payload_channel = "aeron:udp?endpoint=127.0.0.1:41456"\n'
        + 'receive_control_channel = "aeron:udp?endpoint=127.0.0.1:41457"\n'
        + MAPPING
        + MAPPING.replace("10000", "10001")
        .replace("20000", "20001")
        .replace('"receiver"', '"sender"')
    )
    cfg = load(tmp_path, text)
    assert [m.source_stream_id for m in cfg.receiver_mappings] == [10000]
    assert [m.source_stream_id for m in cfg.sender_mappings] == [10001]
    assert cfg.bridge.receive_payload_channel.endswith("41456")


def test_standalone_receiver_needs_its_profile(tmp_path: Path) -> None:
    text = BASE + "[local]\ndriver_mode = false\n" + MAPPING
    assert error(tmp_path, text).key == "mappings[0].profile"
    ok = (
        text
        + "[profiles.p]\nheader_nslots = 8\npayload_pools = [{pool_id = 1, stride_bytes = 4096}]\n"
    )
    cfg = load(tmp_path, ok)
    assert cfg.profiles["p"].header_nslots == 8


def test_env_overrides_scalar_keys(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        BASE + MAPPING,
        env={"TENSORPOOL_BRIDGE_ASSEMBLY_TIMEOUT_MS": "100", "LOCAL_AERON_DIR": "/tmp/x"},
    )
    assert cfg.bridge.assembly_timeout_ms == 100
    assert cfg.local.aeron_dir == "/tmp/x"
    err = error(tmp_path, BASE + MAPPING, env={"BRIDGE_PAYLOAD_STREAM_ID": "abc"})
    assert "BRIDGE_PAYLOAD_STREAM_ID" in str(err)


def test_bad_channel_is_rejected(tmp_path: Path) -> None:
    err = error(tmp_path, BASE.replace("aeron:udp?endpoint=127.0.0.1:40457", "udp://x") + MAPPING)
    assert err.key == "bridge.control_channel"
