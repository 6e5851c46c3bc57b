"""#13.1 "Nothing deletes what it did not create": the directory-safety rules (tensorpool.fsafety)
and every config or option that names a directory the project creates files in."""

from __future__ import annotations

import os
from pathlib import Path

import pyaeron
import pytest

from tensorpool.bridge.config import load_bridge_config
from tensorpool.client.settings import ClientSettings
from tensorpool.config_util import ConfigError
from tensorpool.driver.config import load_driver_config, parse_driver_config
from tensorpool.fsafety import (
    CNC_METADATA,
    DirState,
    UnsafeDirectory,
    check_media_driver_dir,
    classify_media_driver_dir,
    is_aeron_cnc,
    remove_aeron_files,
    unsafe_root_reason,
)
from tensorpool.ratelimiter.config import parse_ratelimiter_config
from tensorpool.spark_source.options import TensorPoolOptionError, parse_source_options
from tensorpool.transport.config import TransportConfig, TransportConfigError

HOME = os.path.expanduser("~")
REFUSED = [
    *("/", "/etc", "/etc/tensorpool", "/usr", "/usr/lib/x", "/var", "/home", "/root", "/tmp"),
    *("/dev/shm", "/dev", "/dev/null", "/proc/self", "/sys/fs", "/boot", "/lib64", "/opt"),
    *("/home/alice", "/run/user/1000", "/dev/shm/../../etc", "/tmp/../usr", HOME),
]
ACCEPTED = [
    *("/dev/shm/tensorpool", "/dev/shm/a/b", "/tmp/tensorpool-x", "/var/lib/tensorpool"),
    *("/dev/hugepages", "/dev/hugepages/tp", "/srv/tensorpool", "/opt/tp/shm"),
]


@pytest.mark.parametrize("path", REFUSED)
def test_system_and_shared_roots_are_refused(path: str) -> None:
    """#13.1: /, /etc, /usr, /var, /home, $HOME, /tmp and /dev/shm themselves, and anything
    inside a system tree, are never a directory tensorpool creates files in."""
    reason = unsafe_root_reason(path)
    assert reason is not None and path in reason


@pytest.mark.parametrize("path", ACCEPTED)
def test_dedicated_subdirectories_are_accepted(path: str) -> None:
    assert unsafe_root_reason(path) is None


def test_symlinks_and_dotdot_are_resolved_before_comparing(tmp_path: Path) -> None:
    """#13.1: a link to /etc is /etc; the message shows what it resolves to."""
    (tmp_path / "link").symlink_to("/etc")
    reason = unsafe_root_reason(str(tmp_path / "link" / "aeron"))
    assert reason is not None and "resolves to /etc/aeron" in reason
    home_link = tmp_path / "home-link"
    home_link.symlink_to(HOME)
    assert unsafe_root_reason(str(home_link)) is not None


def test_home_comes_from_the_environment(tmp_path: Path) -> None:
    home = tmp_path / "me"
    home.mkdir()
    assert unsafe_root_reason(str(home), env={"HOME": str(home)}) is not None
    assert unsafe_root_reason(str(home), env={"HOME": "/nowhere"}) is None
    assert unsafe_root_reason(str(home / "tp"), env={"HOME": str(home)}) is None


# --------------------------------------------------------------------------- classifier


def real_aeron_layout(path: Path) -> None:
    """What a C media driver leaves when it is not allowed to delete its directory (a killed
    driver leaves the same), with one publication's log buffer inside."""
    driver = pyaeron.MediaDriver(
        dir=str(path), threading="shared", dir_delete_on_shutdown=False, dir_warn_if_exists=False
    )
    try:
        client = pyaeron.Aeron(context=pyaeron.Context(dir=str(path)))
        pub = client.add_publication("aeron:ipc?term-length=65536", 7)
        assert any((path / "publications").iterdir())
        pub.close()
        client.close()
    finally:
        driver.close()


def test_classifier_absent_empty_aeron_foreign(tmp_path: Path) -> None:
    """#13.1: absent, empty and an Aeron layout are usable; one extra file makes it FOREIGN."""
    d = tmp_path / "aeron"
    assert classify_media_driver_dir(str(d)) == (DirState.ABSENT, None)
    d.mkdir()
    assert classify_media_driver_dir(str(d)) == (DirState.EMPTY, None)
    real_aeron_layout(d)
    assert {p.name for p in d.iterdir()} == {"cnc.dat", "loss-report.dat", "publications", "images"}
    assert classify_media_driver_dir(str(d)) == (DirState.AERON, None)
    (d / "publications" / "notes.txt").write_text("mine")
    assert classify_media_driver_dir(str(d)) == (
        DirState.FOREIGN,
        str(d / "publications" / "notes.txt"),
    )
    (d / "publications" / "notes.txt").unlink()
    (d / "sentinel").write_text("keep me")
    assert classify_media_driver_dir(str(d)) == (DirState.FOREIGN, str(d / "sentinel"))


def test_classifier_refuses_files_links_and_impostors(tmp_path: Path) -> None:
    """#13.1: a regular file, a symlink, or a *directory* named cnc.dat is not Aeron's."""
    f = tmp_path / "file"
    f.write_text("x")
    assert classify_media_driver_dir(str(f))[0] is DirState.FOREIGN
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    assert classify_media_driver_dir(str(tmp_path / "link"))[0] is DirState.FOREIGN
    odd = tmp_path / "odd"
    (odd / "cnc.dat").mkdir(parents=True)
    assert classify_media_driver_dir(str(odd))[0] is DirState.FOREIGN


def test_30_aeron_is_recognised_by_the_cnc_files_content(tmp_path: Path) -> None:
    """#30: a directory is Aeron's only with an Aeron CnC file in it (major version 0,
    non-zero, buffer lengths that fit the file); a user's files named like Aeron's are
    FOREIGN, and so is a log buffer too small to be one beside a real CnC file."""
    d = tmp_path / "mine"
    d.mkdir()
    (d / "cnc.dat").write_text("precious\n")
    assert classify_media_driver_dir(str(d)) == (DirState.FOREIGN, str(d / "cnc.dat"))
    with pytest.raises(UnsafeDirectory, match=r"cnc\.dat, which is not an Aeron CnC file"):
        check_media_driver_dir(str(d), "--dir")
    assert (d / "cnc.dat").read_text() == "precious\n"
    (d / "cnc.dat").unlink()
    (d / "publications").mkdir()
    (d / "publications" / "notes.logbuffer").write_text("precious")
    assert classify_media_driver_dir(str(d)) == (DirState.FOREIGN, str(d / "publications"))
    (d / "loss-report.dat").write_text("x")
    (d / "publications").rename(tmp_path / "pubs")
    assert classify_media_driver_dir(str(d)) == (DirState.FOREIGN, str(d / "loss-report.dat"))

    real = tmp_path / "real"
    real.mkdir()
    real_aeron_layout(real)
    cnc = (real / "cnc.dat").read_bytes()
    assert is_aeron_cnc(str(real / "cnc.dat"))
    small = real / "publications" / "notes.logbuffer"
    small.write_text("precious")
    assert classify_media_driver_dir(str(real)) == (DirState.FOREIGN, str(small))
    small.unlink()
    for bad in (
        (0x10200).to_bytes(4, "little") + cnc[4:],  # CnC major version 1
        bytes(4) + cnc[4:],  # version not written yet
        cnc[:4] + (0).to_bytes(4, "little") + cnc[8:],  # a buffer of no length
        cnc[: CNC_METADATA.size + 100],  # buffers that do not fit the file
    ):
        (real / "cnc.dat").write_bytes(bad)
        assert classify_media_driver_dir(str(real)) == (DirState.FOREIGN, str(real / "cnc.dat"))
    (real / "cnc.dat").write_bytes(cnc)
    assert classify_media_driver_dir(str(real)) == (DirState.AERON, None)


def test_check_media_driver_dir_names_the_option_and_path(tmp_path: Path) -> None:
    (tmp_path / "sentinel").write_text("x")
    with pytest.raises(UnsafeDirectory) as info:
        check_media_driver_dir(str(tmp_path), "--dir")
    msg = str(info.value)
    assert msg.startswith("--dir: refusing ") and str(tmp_path / "sentinel") in msg
    assert "\n" not in msg
    with pytest.raises(UnsafeDirectory, match="--dir: refusing /etc"):
        check_media_driver_dir("/etc", "--dir")
    assert (tmp_path / "sentinel").read_text() == "x"


def test_remove_aeron_files_removes_only_aerons_files(tmp_path: Path) -> None:
    """#13.1: cleanup removes cnc.dat, loss-report.dat and log buffers, nothing else."""
    real_aeron_layout(tmp_path)
    assert remove_aeron_files(str(tmp_path)) is True
    assert list(tmp_path.iterdir()) == []
    real_aeron_layout(tmp_path)
    (tmp_path / "sentinel").write_text("keep")
    (tmp_path / "images" / "mine.txt").write_text("keep too")
    assert remove_aeron_files(str(tmp_path)) is False
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "images",
        "images/mine.txt",
        "sentinel",
    ]


# --------------------------------------------------------------------------- configs

DRIVER_MINIMAL = """
[profiles.p]
payload_pools = [{ pool_id = 1, stride_bytes = 4096 }]

[streams.s]
stream_id = 10000
profile = "p"
"""


def driver_error(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> ConfigError:
    path = tmp_path / "driver.toml"
    path.write_text(text + DRIVER_MINIMAL)
    with pytest.raises(ConfigError) as info:
        load_driver_config(path, env=env or {})
    assert info.value.file == str(path)
    return info.value


@pytest.mark.parametrize("bad", ["/", "/etc", HOME, "/tmp", "/dev/shm"])
def test_driver_config_refuses_roots_as_aeron_dir_and_base_dir(tmp_path: Path, bad: str) -> None:
    """#13.1: driver.aeron_dir and shm.base_dir (file or env) refuse system/shared roots."""
    err = driver_error(tmp_path, f'[driver]\naeron_dir = "{bad}"\n')
    assert err.key == "driver.aeron_dir" and bad in err.reason
    err = driver_error(tmp_path, f'[shm]\nbase_dir = "{bad}"\nallowed_base_dirs = ["{bad}"]\n')
    assert err.key == "shm.base_dir" and bad.rstrip("/") in str(err)
    err = driver_error(tmp_path, "", env={"DRIVER_AERON_DIR": bad})
    assert err.key == "driver.aeron_dir" and "DRIVER_AERON_DIR" in str(err)


@pytest.mark.parametrize("mode", ["666", "777", "0662", "606"])
def test_driver_config_refuses_world_writable_modes_unless_allowed(
    tmp_path: Path, mode: str
) -> None:
    """#13.1: permissions_mode with o+w needs shm.allow_world_writable = true."""
    err = driver_error(tmp_path, f'[shm]\npermissions_mode = "{mode}"\n')
    assert err.key == "shm.permissions_mode" and "shm.allow_world_writable" in err.reason
    path = tmp_path / "ok.toml"
    path.write_text(
        f'[shm]\npermissions_mode = "{mode}"\nallow_world_writable = true\n' + DRIVER_MINIMAL
    )
    cfg = load_driver_config(path, env={})
    assert cfg.shm.permissions_mode == int(mode, 8) and cfg.shm.allow_world_writable
    env = {"SHM_PERMISSIONS_MODE": mode}
    assert "SHM_PERMISSIONS_MODE" in str(driver_error(tmp_path, "", env=env))


def test_driver_config_default_mode_and_example_still_load() -> None:
    """The default mode and the shipped example (which documents the key) pass the rule."""
    cfg = parse_driver_config(
        {"profiles": {"p": {"payload_pools": [{"pool_id": 1, "stride_bytes": 4096}]}},
         "streams": {"s": {"stream_id": 1, "profile": "p"}}},
        env={},
    )  # fmt: skip
    assert not cfg.shm.permissions_mode & 0o002 and not cfg.shm.allow_world_writable
    example = Path(__file__).resolve().parents[2] / "config" / "driver.example.toml"
    assert "allow_world_writable" in example.read_text()
    assert not load_driver_config(example, env={}).shm.allow_world_writable


RL_MINIMAL: dict[str, object] = {
    "rate_limiter": {
        "instance_id": "rl-1",
        "descriptor_channel": "aeron:ipc",
        "descriptor_stream_id": 2100,
    },
    "mappings": [{"source_stream_id": 10000, "dest_stream_id": 20000, "profile": "camera"}],
}


@pytest.mark.parametrize(("section", "key"), [("driver", "aeron_dir"), ("shm", "base_dir")])
def test_ratelimiter_config_refuses_roots(section: str, key: str) -> None:
    """#13.1: the rate limiter's driver.aeron_dir and shm.base_dir."""
    for bad in ("/", "/etc", HOME):
        doc = {**RL_MINIMAL, section: {key: bad}}
        with pytest.raises(ConfigError) as info:
            parse_ratelimiter_config(doc, source="rl.toml", env={})
        assert info.value.key == f"{section}.{key}" and info.value.file == "rl.toml"


@pytest.mark.parametrize("key", ["aeron_dir", "shm_base_dir"])
def test_bridge_config_refuses_roots(tmp_path: Path, key: str) -> None:
    """#13.1: the bridge's [local] aeron_dir and shm_base_dir."""
    path = tmp_path / "bridge.toml"
    path.write_text(
        "[bridge]\ninstance_id = 'b1'\n"
        "payload_channel = 'aeron:udp?endpoint=127.0.0.1:40456'\npayload_stream_id = 3000\n"
        "control_channel = 'aeron:udp?endpoint=127.0.0.1:40457'\ncontrol_stream_id = 3001\n"
        f"[local]\n{key} = '/etc'\n"
        "[[mappings]]\nsource_stream_id = 10000\ndest_stream_id = 20000\nprofile = 'p'\n"
        "role = 'receiver'\n"
    )
    with pytest.raises(ConfigError) as info:
        load_bridge_config(path, env={})
    assert info.value.key == f"local.{key}" and "/etc" in info.value.reason


@pytest.mark.parametrize("option", ["aeronDir", "shmBaseDir"])
def test_spark_options_refuse_roots(option: str) -> None:
    """#13.1: Spark's aeronDir and shmBaseDir options (parsed before any SparkSession work)."""
    for bad in ("/", "/etc", HOME):
        with pytest.raises(TensorPoolOptionError, match=f"^{option}: refusing "):
            parse_source_options({"streams": "1", option: bad})
    parse_source_options({"streams": "1", option: "/dev/shm/tp-spark"})


def test_client_settings_and_transport_config_refuse_roots() -> None:
    """#13.1: the Python API refuses the same roots (standalone producers create regions in
    shm_base_dir; a media driver may serve aeron_dir)."""
    for bad in ("/", "/etc", HOME):
        with pytest.raises(ValueError, match="shm_base_dir: refusing"):
            ClientSettings(shm_base_dir=bad)
        with pytest.raises(TransportConfigError, match="aeron_dir: refusing"):
            TransportConfig(aeron_dir=bad)
    assert TransportConfig(aeron_dir="").aeron_dir == ""  # Aeron's default stays allowed
