"""Rate limiter configuration (RateLimiter Spec §8): required keys, defaults, fail-fast rules,
topology checks, driver profile checks, environment overrides and the command's exit codes."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest

from tensorpool import cli
from tensorpool.driver.config import load_driver_config
from tensorpool.ratelimiter.config import (
    DEFAULT_FORWARD_CHANNEL,
    ConfigError,
    MappingConfig,
    RateLimiterConfig,
    load_ratelimiter_config,
    parse_ratelimiter_config,
)

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "config" / "ratelimiter.example.toml"

MINIMAL: dict[str, Any] = {
    "rate_limiter": {
        "instance_id": "rl-1",
        "descriptor_channel": "aeron:ipc",
        "descriptor_stream_id": 2100,
    },
    "mappings": [{"source_stream_id": 10000, "dest_stream_id": 20000, "profile": "camera"}],
}


def doc(**rl: Any) -> dict[str, Any]:
    d = copy.deepcopy(MINIMAL)
    d["rate_limiter"].update(rl)
    return d


def parse(d: dict[str, Any], env: dict[str, str] | None = None) -> RateLimiterConfig:
    return parse_ratelimiter_config(
        d, source="rl.toml", env=env or {}, load_driver=load_driver_config
    )


def fails(d: dict[str, Any], key: str, env: dict[str, str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse(d, env)
    assert info.value.key == key, str(info.value)
    assert info.value.file == "rl.toml"
    return info.value


def test_s8_example_config_loads() -> None:
    """§8: the shipped example is valid and says what it looks like it says."""
    cfg = load_ratelimiter_config(EXAMPLE, env={})
    assert cfg.instance_id == "gui-ratelimiter"
    assert cfg.descriptor_stream_id == 2100
    assert cfg.max_rate_hz == 30
    (m,) = cfg.mappings
    assert (m.source_stream_id, m.dest_stream_id, m.profile) == (10000, 20000, "view")
    assert m.max_rate_hz == 30 and m.metadata_stream_id == 20000


def test_s8_defaults() -> None:
    """§8 optional keys and their defaults."""
    cfg = parse(MINIMAL)
    assert cfg.forward_metadata is True
    assert cfg.forward_progress is False
    assert cfg.forward_qos is False
    assert cfg.max_rate_hz == 0
    assert cfg.control_channel == cfg.qos_channel == DEFAULT_FORWARD_CHANNEL
    assert DEFAULT_FORWARD_CHANNEL == "aeron:ipc?term-length=16m"
    assert (
        cfg.source_control_stream_id,
        cfg.dest_control_stream_id,
        cfg.source_qos_stream_id,
        cfg.dest_qos_stream_id,
    ) == (0, 0, 0, 0)
    (m,) = cfg.mappings
    assert m.max_rate_hz == 0  # inherits rate_limiter.max_rate_hz
    assert m.metadata_stream_id == m.dest_stream_id


def test_s8_mapping_rate_inherits_global_unless_set() -> None:
    """§8: mapping max_rate_hz defaults to rate_limiter.max_rate_hz; a set value wins."""
    d = doc(max_rate_hz=25)
    d["mappings"].append(
        {"source_stream_id": 10001, "dest_stream_id": 20001, "profile": "p", "max_rate_hz": 5}
    )
    cfg = parse(d)
    assert [m.max_rate_hz for m in cfg.mappings] == [25, 5]


@pytest.mark.parametrize("key", ["instance_id", "descriptor_channel", "descriptor_stream_id"])
def test_s8_required_rate_limiter_keys(key: str) -> None:
    """§8 required keys: a missing one is an error naming it."""
    d = doc()
    del d["rate_limiter"][key]
    err = fails(d, f"rate_limiter.{key}")
    assert "required" in err.reason


@pytest.mark.parametrize("key", ["source_stream_id", "dest_stream_id", "profile"])
def test_s8_required_mapping_keys(key: str) -> None:
    d = doc()
    del d["mappings"][0][key]
    fails(d, f"mappings[0].{key}")


def test_s8_mappings_required() -> None:
    d = doc()
    del d["mappings"]
    fails(d, "mappings")
    d["mappings"] = []
    fails(d, "mappings")


def test_s8_rate_limiter_table_required() -> None:
    fails({"mappings": MINIMAL["mappings"]}, "rate_limiter")


@pytest.mark.parametrize(
    ("flags", "key"),
    [
        ({"forward_progress": True, "dest_control_stream_id": 2101}, "source_control_stream_id"),
        ({"forward_progress": True, "source_control_stream_id": 1000}, "dest_control_stream_id"),
        ({"forward_progress": True}, "source_control_stream_id"),
        ({"forward_qos": True, "dest_qos_stream_id": 2200}, "source_qos_stream_id"),
        ({"forward_qos": True, "source_qos_stream_id": 1200}, "dest_qos_stream_id"),
    ],
)
def test_s8_forwarding_with_zero_stream_id_fails_fast(flags: dict[str, Any], key: str) -> None:
    """§8 MUST: forward_progress / forward_qos with a zero stream id fails fast, naming the key."""
    err = fails(doc(**flags), f"rate_limiter.{key}")
    assert "nonzero" in err.reason


def test_s8_forwarding_zero_id_fails_on_every_construction_path() -> None:
    """§8 "forwarding MUST NOT start": even a config built in code cannot hold a zero id."""
    m = (MappingConfig(1, 2, "p"),)
    base = {"instance_id": "x", "descriptor_channel": "aeron:ipc", "descriptor_stream_id": 1}
    with pytest.raises(ValueError, match="dest_qos_stream_id: must be nonzero"):
        RateLimiterConfig(**base, mappings=m, forward_qos=True, source_qos_stream_id=5)
    with pytest.raises(ValueError, match="source_control_stream_id: must be nonzero"):
        RateLimiterConfig(**base, mappings=m, forward_progress=True, dest_control_stream_id=5)


def test_s8_forwarding_with_nonzero_ids_is_accepted() -> None:
    cfg = parse(
        doc(
            forward_progress=True,
            source_control_stream_id=1000,
            dest_control_stream_id=2101,
            forward_qos=True,
            source_qos_stream_id=1200,
            dest_qos_stream_id=2200,
        )
    )
    assert cfg.forward_progress and cfg.forward_qos
    assert (cfg.source_control_stream_id, cfg.dest_qos_stream_id) == (1000, 2200)


def test_s8_zero_ids_are_fine_while_forwarding_is_off() -> None:
    cfg = parse(doc(forward_progress=False, forward_qos=False))
    assert cfg.source_control_stream_id == 0


@pytest.mark.parametrize(
    ("rl", "key"),
    [
        ({"descriptor_stream_id": 0}, "rate_limiter.descriptor_stream_id"),
        ({"descriptor_stream_id": "2100"}, "rate_limiter.descriptor_stream_id"),
        ({"descriptor_channel": "udp://host:1"}, "rate_limiter.descriptor_channel"),
        ({"control_channel": "aeron:tcp"}, "rate_limiter.control_channel"),
        ({"max_rate_hz": -1}, "rate_limiter.max_rate_hz"),
        ({"max_rate_hz": 2**32}, "rate_limiter.max_rate_hz"),
        ({"forward_metadata": "yes"}, "rate_limiter.forward_metadata"),
        ({"instance_id": ""}, "rate_limiter.instance_id"),
        ({"hold": "sometimes"}, "rate_limiter.hold"),
        ({"max_rate": 30}, "rate_limiter.max_rate"),
    ],
)
def test_s8_bad_values_name_the_key(rl: dict[str, Any], key: str) -> None:
    fails(doc(**rl), key)


def test_s8_unknown_key_suggests_the_right_one() -> None:
    err = fails(doc(forward_metdata=True), "rate_limiter.forward_metdata")
    assert "forward_metadata" in err.reason


def test_s8_bad_mapping_values() -> None:
    d = doc()
    d["mappings"][0]["source_stream_id"] = 0
    fails(d, "mappings[0].source_stream_id")
    d = doc()
    d["mappings"][0]["profile"] = " "
    fails(d, "mappings[0].profile")
    d = doc()
    d["mappings"][0]["extra"] = 1
    fails(d, "mappings[0].extra")


def test_s3_source_and_destination_must_differ() -> None:
    """§3: the rate limiter never publishes on its source stream."""
    d = doc()
    d["mappings"][0]["dest_stream_id"] = 10000
    fails(d, "mappings[0].dest_stream_id")


def test_s3_destination_may_not_be_another_mappings_source() -> None:
    """§3: a destination that is another mapping's source would publish on a source stream."""
    d = doc()
    d["mappings"].append({"source_stream_id": 20000, "dest_stream_id": 20001, "profile": "p"})
    fails(d, "mappings[0].dest_stream_id")
    d = doc()
    d["mappings"][0]["metadata_stream_id"] = 10000
    fails(d, "mappings[0].metadata_stream_id")


def test_s3_one_producer_per_destination() -> None:
    d = doc()
    d["mappings"].append({"source_stream_id": 10001, "dest_stream_id": 20000, "profile": "p"})
    fails(d, "mappings[1].dest_stream_id")


def test_s4_one_policy_per_instance_one_mapping_per_source() -> None:
    """§4: distinct policies for one source are distinct instances."""
    d = doc()
    d["mappings"].append({"source_stream_id": 10000, "dest_stream_id": 20001, "profile": "p"})
    err = fails(d, "mappings[1].source_stream_id")
    assert "another rate limiter" in err.reason


def test_s8_environment_overrides() -> None:
    cfg = parse(doc(), env={"RATE_LIMITER_MAX_RATE_HZ": "12", "DRIVER_AERON_DIR": "/x/aeron"})
    assert cfg.max_rate_hz == 12 and cfg.mappings[0].max_rate_hz == 12
    assert cfg.driver.aeron_dir == "/x/aeron"
    cfg = parse(
        doc(),
        env={"RATE_LIMITER_MAX_RATE_HZ": "12", "TENSORPOOL_RATE_LIMITER_MAX_RATE_HZ": "7"},
    )
    assert cfg.max_rate_hz == 7
    err = fails(doc(), "rate_limiter.max_rate_hz", env={"RATE_LIMITER_MAX_RATE_HZ": "fast"})
    assert "RATE_LIMITER_MAX_RATE_HZ" in err.reason


def test_driver_tables_mirror_the_driver_config() -> None:
    d = doc()
    d["driver"] = {"control_stream_id": 1500, "metadata_stream_id": 1600, "aeron_dir": "/a"}
    d["shm"] = {"base_dir": "/dev/shm/x/", "allowed_base_dirs": ["/dev/shm/x", "/dev/shm/y"]}
    d["policies"] = {"announce_period_ms": 200, "lease_keepalive_interval_ms": 100}
    cfg = parse(d)
    assert cfg.driver.control_stream_id == 1500 and cfg.driver.metadata_stream_id == 1600
    assert cfg.driver.shm_base_dir == "/dev/shm/x"
    assert cfg.driver.allowed_base_dirs == ("/dev/shm/x", "/dev/shm/y")
    assert cfg.driver.announce_period_ms == 200
    d["driver"] = {"aeron_dir": "relative"}
    fails(d, "driver.aeron_dir")
    d["driver"] = {"typo": 1}
    fails(d, "driver.typo")


DRIVER_TOML = """
[driver]
stream_id_range = "20000-20099"
[shm]
base_dir = "/dev/shm/tp-rl-unit"
[policies]
allow_dynamic_streams = {dynamic}
default_profile = "small"
[profiles.small]
payload_pools = [{{ pool_id = 1, stride_bytes = 65536 }}]
[profiles.camera]
payload_pools = [{{ pool_id = 1, stride_bytes = 1048576 }}]
[streams.cam]
stream_id = 30000
profile = "camera"
"""


def with_driver(tmp_path: Path, dest: int, profile: str, *, dynamic: bool = True) -> dict:
    path = tmp_path / "driver.toml"
    path.write_text(DRIVER_TOML.format(dynamic="true" if dynamic else "false"))
    d = doc()
    d["mappings"][0].update(dest_stream_id=dest, profile=profile)
    d["driver"] = {"config": str(path)}
    return d


def test_s8_profile_checked_against_driver_config(tmp_path: Path) -> None:
    """§8 `profile`: with driver.config the destination must really get that profile."""
    assert parse(with_driver(tmp_path, 30000, "camera")).mappings[0].profile == "camera"
    assert parse(with_driver(tmp_path, 20005, "small")).mappings[0].dest_stream_id == 20005
    err = fails(with_driver(tmp_path, 30000, "small"), "mappings[0].profile")
    assert "camera" in err.reason
    fails(with_driver(tmp_path, 20005, "camera"), "mappings[0].profile")
    fails(with_driver(tmp_path, 20005, "nope"), "mappings[0].profile")
    err = fails(with_driver(tmp_path, 40000, "small"), "mappings[0].dest_stream_id")
    assert "stream_id_range" in err.reason
    fails(with_driver(tmp_path, 20005, "small", dynamic=False), "mappings[0].dest_stream_id")


def test_s8_broken_driver_config_is_reported(tmp_path: Path) -> None:
    bad = tmp_path / "driver.toml"
    bad.write_text("[driver\n")
    d = doc()
    d["driver"] = {"config": str(bad)}
    err = fails(d, "driver.config")
    assert "invalid" in err.reason


# --- the command ----------------------------------------------------------------------------


def run_cli(tmp_path: Path, text: str, *args: str) -> int:
    path = tmp_path / "rl.toml"
    path.write_text(text)
    return cli.main(["ratelimiter", "--config", str(path), *args])


BASE = """
[rate_limiter]
instance_id = "rl"
descriptor_channel = "aeron:ipc"
descriptor_stream_id = 2100
{extra}
[[mappings]]
source_stream_id = 1
dest_stream_id = 2
profile = "p"
"""


def test_s8_cli_invalid_config_clear_error_nonzero_exit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """§8 + issue: an invalid config is one clear line naming file and key, exit status 2."""
    rc = run_cli(tmp_path, BASE.format(extra="forward_qos = true\nsource_qos_stream_id = 1200"))
    err = capsys.readouterr().err
    assert rc == 2
    assert "rl.toml: rate_limiter.dest_qos_stream_id" in err and "nonzero" in err
    assert "Traceback" not in err


def test_cli_syntax_error_and_missing_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(tmp_path, "[rate_limiter\n") == 2
    assert "line 1" in capsys.readouterr().err
    assert cli.main(["ratelimiter", "--config", str(tmp_path / "missing.toml")]) == 2
    assert "cannot read" in capsys.readouterr().err
    env = os.environ.pop("TENSORPOOL_RATELIMITER_CONFIG", None)
    try:
        assert cli.main(["ratelimiter"]) == 2
    finally:
        if env is not None:
            os.environ["TENSORPOOL_RATELIMITER_CONFIG"] = env
    assert "--config" in capsys.readouterr().err


def test_cli_check_prints_the_resolved_config(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["ratelimiter", "--config", str(EXAMPLE), "--check"]) == 0
    out = capsys.readouterr().out
    assert '"descriptor_stream_id": 2100' in out and '"max_rate_hz": 30' in out
