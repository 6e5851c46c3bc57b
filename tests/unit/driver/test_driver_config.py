"""Driver configuration (Driver Model §17, §11 ranges): parsing, validation, env overrides."""

from __future__ import annotations

import os
import re
import textwrap
from pathlib import Path

import pytest

from tensorpool.config_schema import Table, parse_file, table
from tensorpool.config_util import (
    ConfigError,
    IdRange,
    Positive,
    check_aeron_channel,
    env_names,
    load_toml,
    parse_id_range,
)
from tensorpool.driver.config import (
    DriverConfig,
    load_driver_config,
)
from tensorpool.shm.layout import PoolConfig

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "config" / "driver.example.toml"

MINIMAL = """
[profiles.p]
payload_pools = [{ pool_id = 1, stride_bytes = 4096 }]

[streams.s]
stream_id = 10000
profile = "p"
"""


def write(tmp_path: Path, text: str, name: str = "driver.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def load(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> DriverConfig:
    return load_driver_config(write(tmp_path, text), env={} if env is None else env)


def error_for(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> ConfigError:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_driver_config(path, env={} if env is None else env)
    err = info.value
    assert err.file == str(path)
    assert str(path) in str(err)
    return err


# --------------------------------------------------------------------------- valid files


def test_s17_example_config_parses() -> None:
    cfg = load_driver_config(EXAMPLE, env={})
    assert cfg.source == str(EXAMPLE)
    assert cfg.driver.instance_id == "driver-01"
    assert cfg.driver.control_stream_id == 1000
    assert cfg.driver.announce_stream_id == 1000  # where clients listen for announces
    assert cfg.driver.stream_id_range == IdRange(21000, 29999)
    assert cfg.policies.allow_dynamic_streams
    assert cfg.default_profile is not None and cfg.default_profile.name == "scratch"
    cam = cfg.profiles["camera"]
    assert cam.header_nslots == 256
    assert cam.payload_pools == (PoolConfig(1, 1048576), PoolConfig(2, 8388608))
    front = cfg.stream_by_id(10000)
    assert front is not None and (front.name, front.profile) == ("front_camera", "camera")
    assert cfg.stream_by_id(12345) is None


def test_s17_defaults_match_the_reference(tmp_path: Path) -> None:
    cfg = load(tmp_path, MINIMAL)
    d, shm, pol = cfg.driver, cfg.shm, cfg.policies
    assert d.instance_id == "driver-01"
    assert d.control_channel == "aeron:ipc?term-length=4m"
    assert d.control_stream_id == 1000
    assert (d.announce_channel, d.announce_stream_id) == (d.control_channel, 1000)
    assert (d.qos_channel, d.qos_stream_id) == ("aeron:ipc?term-length=4m", 1200)
    assert d.descriptor_stream_id == 1100
    assert d.metadata_stream_id == 1300
    assert d.aeron_dir == "" and d.embedded_media_driver
    assert d.stream_id_range is None
    assert shm.base_dir == "/dev/shm/tensorpool"
    assert shm.allowed_base_dirs == ("/dev/shm/tensorpool",)
    assert (shm.require_hugepages, shm.page_size_bytes, shm.permissions_mode) == (
        False,
        4096,
        0o640,  # #13.4: not group-writable unless configured
    )
    assert not pol.allow_dynamic_streams
    assert pol.default_profile == "p"  # first defined profile
    assert (pol.announce_period_ms, pol.lease_keepalive_interval_ms) == (1000, 1000)
    assert pol.lease_expiry_grace_intervals == 3
    assert pol.lease_ttl_ns == 3_000_000_000
    assert pol.prefault_shm and not pol.mlock_shm
    assert (pol.epoch_gc_enabled, pol.epoch_gc_keep, pol.epoch_gc_on_startup) == (True, 2, False)
    assert pol.epoch_gc_min_age_ns == 3 * 1000 * 1_000_000
    assert (pol.shutdown_timeout_ms, pol.shutdown_token) == (2000, "")
    assert cfg.profiles["p"].header_nslots == 1024


def test_s17_announce_endpoint_follows_control_endpoint(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        """
        [driver]
        control_channel = "aeron:udp?endpoint=localhost:40123"
        control_stream_id = 4000
        """
        + MINIMAL,
    )
    assert cfg.driver.announce_channel == "aeron:udp?endpoint=localhost:40123"
    assert cfg.driver.announce_stream_id == 4000


def test_s17_gc_min_age_defaults_to_three_announce_periods(tmp_path: Path) -> None:
    cfg = load(tmp_path, "[policies]\nannounce_period_ms = 250\n" + MINIMAL)
    assert cfg.policies.epoch_gc_min_age_ns == 750_000_000


def test_s17_reference_camera_layout_with_dynamic_streams_and_no_range(tmp_path: Path) -> None:
    """Dynamic streams without a range load; attaches are refused later (§11)."""
    cfg = load(
        tmp_path,
        """
        [policies]
        allow_dynamic_streams = true
        default_profile = "raw"

        [profiles.raw]
        header_nslots = 1024
        [[profiles.raw.payload_pools]]
        pool_id = 1
        stride_bytes = 1048576
        [[profiles.raw.payload_pools]]
        pool_id = 2
        stride_bytes = 4194304
        """,
    )
    assert cfg.streams == ()
    assert cfg.driver.stream_id_range is None
    assert [p.pool_id for p in cfg.profiles["raw"].payload_pools] == [1, 2]


def test_loading_has_no_side_effects(tmp_path: Path) -> None:
    base = tmp_path / "shm" / "base"
    load(tmp_path, f'[shm]\nbase_dir = "{base}"\n' + MINIMAL)
    assert not base.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["driver.toml"]


# --------------------------------------------------------------------------- invalid files

INVALID = [
    # (TOML text, dotted key named in the error, fragment of the reason)
    ("[driver]\ncontrol_stream_idd = 5\n" + MINIMAL, "driver.control_stream_idd", "unknown key"),
    ("[drivr]\n" + MINIMAL, "drivr", "unknown key"),
    (
        "[policies]\nannounce_period = 5\n" + MINIMAL,
        "policies.announce_period",
        "did you mean 'announce_period_ms'",
    ),
    ("[driver]\ncontrol_stream_id = true\n" + MINIMAL, "driver.control_stream_id", "integer"),
    ("[driver]\ncontrol_stream_id = 0\n" + MINIMAL, "driver.control_stream_id", "out of range"),
    ("[driver]\nqos_channel = 'udp://x'\n" + MINIMAL, "driver.qos_channel", "Aeron channel"),
    ("[driver]\ninstance_id = 'a/b'\n" + MINIMAL, "driver.instance_id", "directory name"),
    # #26.6: what the kernel or Aeron would refuse only after files exist
    ("[driver]\ninstance_id = '" + "a" * 256 + "'\n" + MINIMAL, "driver.instance_id", "255"),
    ("[driver]\nqos_channel = 'aeron:udp'\n" + MINIMAL, "driver.qos_channel", "endpoint"),
    (
        "[driver]\ncontrol_channel = 'aeron:udp?endpoint='\n" + MINIMAL,
        "driver.control_channel",
        "HOST:PORT",
    ),
    (
        "[driver]\ncontrol_channel = 'aeron:udp?endpoint=host:99999'\n" + MINIMAL,
        "driver.control_channel",
        "HOST:PORT",
    ),
    ("[driver]\naeron_dir = 'rel/dir'\n" + MINIMAL, "driver.aeron_dir", "absolute"),
    ("[driver]\nstream_id_range = '9-3'\n" + MINIMAL, "driver.stream_id_range", "greater"),
    ("[driver]\nstream_id_range = 'abc'\n" + MINIMAL, "driver.stream_id_range", "not a range"),
    (
        "[driver]\nstream_id_range = '900-1100'\n" + MINIMAL,
        "driver.stream_id_range",
        "control_stream_id",
    ),
    (
        "[driver]\nstream_id_range = '9000-10001'\n" + MINIMAL,
        "driver.stream_id_range",
        "streams.s.stream_id",
    ),
    (
        "[driver]\nstream_id_range = [20000, 29999]\n"
        "descriptor_stream_id_range = '29000-31000'\n" + MINIMAL,
        "driver.descriptor_stream_id_range",
        "overlaps",
    ),
    ("[shm]\nbase_dir = 'shm'\n" + MINIMAL, "shm.base_dir", "absolute"),
    ("[shm]\nbase_dir = '/dev/shm/a|b'\n" + MINIMAL, "shm.base_dir", "must not contain '?', '|'"),
    ("[shm]\npermissions_mode = '999'\n" + MINIMAL, "shm.permissions_mode", "octal"),
    ("[shm]\npage_size_bytes = 3000\n" + MINIMAL, "shm.page_size_bytes", "power of two"),
    (
        "[shm]\nbase_dir = '/dev/shm/x'\nallowed_base_dirs = ['/tmp/other']\n" + MINIMAL,
        "shm.allowed_base_dirs",
        "not inside",
    ),
    ("[shm]\nnamespace = '..'\n" + MINIMAL, "shm.namespace", "directory name"),
    ('[shm]\nnamespace = "a\\n"\n' + MINIMAL, "shm.namespace", "directory name"),
    ("[policies]\ndefault_profile = 'nope'\n" + MINIMAL, "policies.default_profile", "nope"),
    ("[policies]\nepoch_gc_keep = 0\n" + MINIMAL, "policies.epoch_gc_keep", "out of range"),
    ("[policies]\nmlock_shm = 'yes'\n" + MINIMAL, "policies.mlock_shm", "boolean"),
    (
        "[policies]\nlease_keepalive_interval_ms = 0\n" + MINIMAL,
        "policies.lease_keepalive_interval_ms",
        "out of range",
    ),
    (
        """
        [profiles.p]
        header_nslots = 100
        payload_pools = [{ pool_id = 1, stride_bytes = 4096 }]
        [streams.s]
        stream_id = 1
        profile = "p"
        """,
        "profiles.p.header_nslots",
        "power of two",
    ),
    (
        """
        [profiles.p]
        payload_pools = [{ pool_id = 1, stride_bytes = 6144 }]
        [streams.s]
        stream_id = 1
        profile = "p"
        """,
        "profiles.p.payload_pools[0].stride_bytes",
        "power of two",
    ),
    (
        """
        [shm]
        page_size_bytes = 65536
        [profiles.p]
        payload_pools = [{ pool_id = 1, stride_bytes = 4096 }]
        [streams.s]
        stream_id = 1
        profile = "p"
        """,
        "profiles.p.payload_pools[0].stride_bytes",
        "multiple of shm.page_size_bytes",
    ),
    (
        """
        [profiles.p]
        header_nslots = 64
        payload_pools = [{ pool_id = 1, stride_bytes = 4096, nslots = 128 }]
        [streams.s]
        stream_id = 1
        profile = "p"
        """,
        "profiles.p.payload_pools[0].nslots",
        "header_nslots",
    ),
    (
        """
        [profiles.p]
        payload_pools = [{ pool_id = 1, stride_bytes = 4096 }, { pool_id = 1, stride_bytes = 8192 }]
        [streams.s]
        stream_id = 1
        profile = "p"
        """,
        "profiles.p.payload_pools[1].pool_id",
        "used twice",
    ),
    (
        """
        [profiles.p]
        payload_pools = [{ pool_id = 1, stride_bytes = 4096, stride = 1 }]
        [streams.s]
        stream_id = 1
        profile = "p"
        """,
        "profiles.p.payload_pools[0].stride",
        "unknown key",
    ),
    (
        """
        [profiles.p]
        payload_pools = []
        [streams.s]
        stream_id = 1
        profile = "p"
        """,
        "profiles.p.payload_pools",
        "at least one pool",
    ),
    (
        """
        [profiles.p]
        header_nslots = 64
        [streams.s]
        stream_id = 1
        profile = "p"
        """,
        "profiles.p.payload_pools",
        "missing",
    ),
    (
        """
        [profiles.p]
        header_slot_bytes = 512
        payload_pools = [{ pool_id = 1, stride_bytes = 4096 }]
        [streams.s]
        stream_id = 1
        profile = "p"
        """,
        "profiles.p.header_slot_bytes",
        "256",
    ),
    (MINIMAL.replace('profile = "p"', 'profile = "q"'), "streams.s.profile", "not defined"),
    (
        MINIMAL + "[streams.t]\nstream_id = 10000\nprofile = 'p'\n",
        "streams.t.stream_id",
        "also used by streams.s",
    ),
    (
        "[profiles.p]\npayload_pools = [{ pool_id = 1, stride_bytes = 4096 }]\n",
        "streams",
        "allow_dynamic_streams = false",
    ),
    ("[policies]\nallow_dynamic_streams = true\n", "profiles", "at least one"),
    (
        MINIMAL.replace("stream_id = 10000", "stream_id = 4294967295"),
        "streams.s.stream_id",
        "out of range",
    ),
]


def _case_id(case: tuple[str, str, str]) -> str:
    return case[1] + "-" + re.sub(r"\W+", "_", case[2]).strip("_")


@pytest.mark.parametrize(("text", "key", "reason"), INVALID, ids=[_case_id(c) for c in INVALID])
def test_s17_invalid_config_names_file_key_and_reason(
    tmp_path: Path, text: str, key: str, reason: str
) -> None:
    err = error_for(tmp_path, text)
    assert err.key == key
    assert reason in err.reason
    assert f": {key}: " in str(err)


def test_toml_syntax_error_names_line(tmp_path: Path) -> None:
    err = error_for(tmp_path, "[driver]\ninstance_id = 'x'\ncontrol_stream_id = = 3\n")
    assert "line 3" in err.reason


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_driver_config(tmp_path / "absent.toml", env={})
    assert "cannot read" in info.value.reason


def test_hugepage_stride_check_names_pool(tmp_path: Path) -> None:
    cfg = load(tmp_path, MINIMAL)
    cfg.check_hugepage_strides(4096)
    with pytest.raises(ConfigError) as info:
        cfg.check_hugepage_strides(2 * 1024 * 1024)
    assert info.value.key == "profiles.p.payload_pools[0].stride_bytes"


# --------------------------------------------------------------------------- environment


def test_s17_env_overrides_toml(tmp_path: Path) -> None:
    env = {
        "DRIVER_INSTANCE_ID": "from-env",
        "DRIVER_CONTROL_STREAM_ID": "2000",
        "SHM_BASE_DIR": "/dev/shm/elsewhere",
        "DRIVER_AERON_DIR": "/tmp/aeron-x",
        "POLICIES_SHUTDOWN_TOKEN": "tok",
        "POLICIES_ALLOW_DYNAMIC_STREAMS": "true",
        "DRIVER_STREAM_ID_RANGE": "20000-20099",
        "POLICIES_LEASE_EXPIRY_GRACE_INTERVALS": "5",
    }
    cfg = load(tmp_path, "[driver]\ninstance_id = 'from-file'\n" + MINIMAL, env=env)
    assert cfg.driver.instance_id == "from-env"
    assert cfg.driver.control_stream_id == 2000
    assert cfg.driver.announce_stream_id == 2000  # follows the overridden control stream
    assert cfg.shm.base_dir == "/dev/shm/elsewhere"
    assert cfg.shm.allowed_base_dirs == ("/dev/shm/elsewhere",)
    assert cfg.driver.aeron_dir == "/tmp/aeron-x"
    assert cfg.policies.shutdown_token == "tok"
    assert cfg.policies.allow_dynamic_streams
    assert cfg.driver.stream_id_range == IdRange(20000, 20099)
    assert cfg.policies.lease_expiry_grace_intervals == 5


def test_env_scoped_name_wins(tmp_path: Path) -> None:
    env = {"SHM_BASE_DIR": "/dev/shm/plain", "TENSORPOOL_SHM_BASE_DIR": "/dev/shm/scoped"}
    assert load(tmp_path, MINIMAL, env=env).shm.base_dir == "/dev/shm/scoped"


def test_env_invalid_value_names_variable_and_key(tmp_path: Path) -> None:
    err = error_for(tmp_path, MINIMAL, env={"DRIVER_CONTROL_STREAM_ID": "ten"})
    assert err.key == "driver.control_stream_id"
    assert "DRIVER_CONTROL_STREAM_ID" in err.reason
    err = error_for(tmp_path, MINIMAL, env={"TENSORPOOL_SHM_REQUIRE_HUGEPAGES": "maybe"})
    assert err.key == "shm.require_hugepages"
    assert "TENSORPOOL_SHM_REQUIRE_HUGEPAGES" in err.reason
    err = error_for(tmp_path, MINIMAL, env={"SHM_BASE_DIR": "relative"})
    assert err.key == "shm.base_dir" and "SHM_BASE_DIR" in err.reason


def test_env_defaults_to_process_environment(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TENSORPOOL_DRIVER_INSTANCE_ID", "proc-env")
    cfg = load_driver_config(write(tmp_path, MINIMAL))
    assert cfg.driver.instance_id == "proc-env"


def test_env_allowed_base_dirs_is_a_path_list(tmp_path: Path) -> None:
    env = {"SHM_ALLOWED_BASE_DIRS": os.pathsep.join(["/dev/shm", "/dev/hugepages"])}
    cfg = load(tmp_path, "[shm]\nbase_dir = '/dev/shm/tp'\n" + MINIMAL, env=env)
    assert cfg.shm.allowed_base_dirs == ("/dev/shm", "/dev/hugepages")


# --------------------------------------------------------------------------- shared helpers


@table
class _BridgeTable(Table):
    mtu_bytes: Positive = 1500


@table
class _BridgeFile(Table):
    bridge: _BridgeTable


def test_26_5_one_schema_mechanism_for_other_services(tmp_path: Path) -> None:
    """#26.5: what other configs (rate limiter, bridge) build on: a declared table, env
    overrides of its scalar keys, and one error naming the file and the dotted key."""
    path = write(tmp_path, "[bridge]\nmtu_bytes = 1408\n", "bridge.toml")
    data = load_toml(path)
    env = {"BRIDGE_MTU_BYTES": "9000"}
    assert parse_file(_BridgeFile, data, str(path), env).bridge.mtu_bytes == 9000
    with pytest.raises(ConfigError) as info:
        parse_file(_BridgeFile, {"bridge": {"mtu_byte": 1}}, str(path), {})
    assert info.value.key == "bridge.mtu_byte"
    assert info.value.reason == "unknown key (did you mean 'mtu_bytes'?)"
    with pytest.raises(ConfigError) as info:
        parse_file(_BridgeFile, {}, str(path), {})
    assert (info.value.key, info.value.reason) == ("bridge", "required key is missing")
    with pytest.raises(ConfigError) as info:
        parse_file(_BridgeFile, data, str(path), {"TENSORPOOL_BRIDGE_MTU_BYTES": "0"})
    assert str(info.value) == (
        f"{path}: bridge.mtu_bytes: (from environment TENSORPOOL_BRIDGE_MTU_BYTES) "
        "0 is out of range 1..4294967295"
    )
    assert env_names("bridge.mtu_bytes") == ("TENSORPOOL_BRIDGE_MTU_BYTES", "BRIDGE_MTU_BYTES")


def test_config_util_range_and_channel_parsing() -> None:
    assert parse_id_range("1-5") == IdRange(1, 5)
    assert parse_id_range("1, 5") == IdRange(1, 5)
    assert parse_id_range([1, 5]) == IdRange(1, 5)
    assert parse_id_range("") is None and parse_id_range([]) is None
    assert isinstance(parse_id_range([1, 2, 3]), str)
    assert isinstance(parse_id_range("5-1"), str)
    assert 3 in IdRange(1, 5) and 6 not in IdRange(1, 5) and len(IdRange(1, 5)) == 5
    assert check_aeron_channel("aeron:ipc") is None
    assert check_aeron_channel("aeron:udp?endpoint=host:1234|mtu=1408") is None
    assert check_aeron_channel("aeron:tcp") is not None
    assert check_aeron_channel("aeron:ipc?term-length") is not None
