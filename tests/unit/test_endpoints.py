"""#14.1 one endpoints type: every config, the CLI and the Spark options reach the control plane
through :class:`tensorpool.endpoints.Endpoints`, with one set of defaults, one validator and one
stream-id bound per kind of id."""

from __future__ import annotations

import argparse
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tensorpool.bridge.config import load_bridge_config
from tensorpool.cli import UserError
from tensorpool.client import settings as client_settings
from tensorpool.client.settings import ClientSettings
from tensorpool.commands import _common
from tensorpool.commands.inspect import add_arguments as add_inspect_arguments
from tensorpool.config_util import ConfigError
from tensorpool.driver.config import DriverSettings, parse_driver_config
from tensorpool.driver.daemon import resolve_aeron_dir
from tensorpool.endpoints import (
    DEFAULT_NAMESPACE,
    IPC_CONTROL,
    IPC_DESCRIPTORS,
    MAX_AERON_STREAM_ID,
    MAX_DATA_STREAM_ID,
    Endpoints,
    channel_problem,
    default_aeron_dir,
    default_shm_base_dir,
)
from tensorpool.ratelimiter.config import DriverAccess, parse_ratelimiter_config
from tensorpool.spark_source.options import (
    MAX_STREAM_ID as SPARK_MAX_STREAM_ID,
)
from tensorpool.spark_source.options import (
    TensorPoolOptionError,
    parse_source_options,
)

DRIVER_MINIMAL: dict[str, Any] = {
    "profiles": {"p": {"payload_pools": [{"pool_id": 1, "stride_bytes": 4096}]}},
    "streams": {"s": {"stream_id": 10000, "profile": "p"}},
}
RL_MINIMAL: dict[str, Any] = {
    "rate_limiter": {
        "instance_id": "rl",
        "descriptor_channel": "aeron:ipc",
        "descriptor_stream_id": 2100,
    },
    "mappings": [{"source_stream_id": 10000, "dest_stream_id": 20000, "profile": "p"}],
}
BRIDGE_MINIMAL = """
[bridge]
instance_id = "b1"
payload_channel = "aeron:udp?endpoint=127.0.0.1:40456"
payload_stream_id = 3000
control_channel = "aeron:udp?endpoint=127.0.0.1:40457"
control_stream_id = 3001
{local}
[[mappings]]
source_stream_id = {source}
dest_stream_id = 20000
profile = "p"
role = "receiver"
"""
BAD_CHANNEL = "aeron:ipc?term-length"  # starts with "aeron:", but has a key without a value


def _driver(driver: dict[str, Any] | None = None, **extra: Any) -> Any:
    doc = {**DRIVER_MINIMAL, **extra}
    if driver is not None:
        doc["driver"] = driver
    return parse_driver_config(doc, source="driver.toml", env={})


def _rl(driver: dict[str, Any] | None = None, source_stream_id: int = 10000) -> Any:
    doc: dict[str, Any] = {
        "rate_limiter": dict(RL_MINIMAL["rate_limiter"]),
        "mappings": [{**RL_MINIMAL["mappings"][0], "source_stream_id": source_stream_id}],
    }
    if driver is not None:
        doc["driver"] = driver
    return parse_ratelimiter_config(doc, source="rl.toml", env={})


def _bridge(tmp_path: Path, local: dict[str, Any] | None = None, source: int = 10000) -> Any:
    lines = "".join(
        f"{k} = {v!r}\n" if isinstance(v, str) else f"{k} = {v}\n" for k, v in (local or {}).items()
    )
    text = BRIDGE_MINIMAL.format(local=f"[local]\n{lines}" if local else "", source=source)
    path = tmp_path / "bridge.toml"
    path.write_text(textwrap.dedent(text).replace("'", '"'))
    return load_bridge_config(path, env={})


def _cli(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    _common.add_channel_args(p)
    return p.parse_args(list(argv))


def test_14_1_defaults_are_identical_everywhere(tmp_path: Path) -> None:
    """#14.1: the client, the driver's [driver] table, the rate limiter's and the bridge's view of
    the local driver, the CLI and the Spark options default to the same endpoints (the driver's
    descriptor channel used to default to a 4 MiB term where everything else used 16 MiB)."""
    expected = Endpoints()
    assert (expected.control_channel, expected.descriptor_channel) == (IPC_CONTROL, IPC_DESCRIPTORS)
    seen = {
        "ClientSettings.channels": ClientSettings().channels,
        "driver [driver]": _driver().driver.endpoints,
        "DriverSettings()": DriverSettings().endpoints,
        "rate limiter [driver]": _rl().driver.endpoints,
        "DriverAccess()": DriverAccess().endpoints,
        "bridge [local]": _bridge(tmp_path).local.channels,
        "spark options": parse_source_options({"streams": "1"}).connection.endpoints,
        "CLI options": _common.endpoints_from_args(_cli()),
    }
    assert {k: v for k, v in seen.items() if v != expected} == {}
    assert type(ClientSettings().channels) is Endpoints  # the same type, not a copy
    assert not hasattr(client_settings, "Channels")  # one name: the old alias is gone


def test_14_1_empty_aeron_dir_means_the_tensorpool_default_everywhere(tmp_path: Path) -> None:
    """#14.1: ``aeron_dir = ""`` meant the tensorpool default in the rate limiter and an embedded
    driver but Aeron's library default in the bridge's ``[local]`` and a driver joining an
    external media driver; now every config means the tensorpool default directory."""
    external = {"aeron_dir": "", "embedded_media_driver": False}
    bridge_local = _bridge(tmp_path, {"aeron_dir": ""}).local
    spark = parse_source_options({"streams": "1", "aeronDir": " "}).connection
    seen = {
        "driver, embedded": resolve_aeron_dir(_driver({"aeron_dir": ""})),
        "driver, external media driver": resolve_aeron_dir(_driver(external)),
        "rate limiter [driver]": _rl({"aeron_dir": ""}).driver.transport_config("t").aeron_dir,
        "bridge [local]": bridge_local.client_settings().transport.aeron_dir,
        "spark aeronDir": spark.client_settings().transport.aeron_dir,
    }
    assert {k: v for k, v in seen.items() if v != default_aeron_dir()} == {}
    named = _bridge(tmp_path, {"aeron_dir": "/tmp/x"}).local.client_settings()
    assert named.transport.aeron_dir == "/tmp/x"  # a named directory is taken as named


def test_14_1_namespace_and_base_dir_defaults_agree(tmp_path: Path) -> None:
    """#14.1: DEFAULT_NAMESPACE was ``default`` for the driver and ``tensorpool`` for clients."""
    inspect_parser = argparse.ArgumentParser()
    add_inspect_arguments(inspect_parser)
    inspect_args = inspect_parser.parse_args(["1"])
    namespaces = {
        "client": ClientSettings().namespace,
        "driver": _driver().shm.namespace,
        "bridge": _bridge(tmp_path).local.namespace,
        "inspect": inspect_args.namespace,
    }
    assert set(namespaces.values()) == {DEFAULT_NAMESPACE}, namespaces
    bases = {
        ClientSettings().shm_base_dir,
        _driver().shm.base_dir,
        _rl().driver.shm_base_dir,
        _bridge(tmp_path).local.shm_base_dir,
        parse_source_options({"streams": "1"}).connection.shm_base_dir,
    }
    assert bases == {default_shm_base_dir()}


def _reason_of(call: Any) -> str:
    with pytest.raises((ConfigError, TensorPoolOptionError, UserError, ValueError)) as info:
        call()
    return str(info.value)


def test_14_1_one_channel_validator(tmp_path: Path) -> None:
    """#14.1: one validator for every channel key; a value that merely starts with ``aeron:``
    (what two of the four old copies checked) is refused by every entry point, naming the key."""
    problem = channel_problem(BAD_CHANNEL)
    assert problem is not None
    cases = {
        "descriptor_channel": lambda: Endpoints(descriptor_channel=BAD_CHANNEL),
        "driver.descriptor_channel": lambda: _driver({"descriptor_channel": BAD_CHANNEL}),
        "driver.announce_channel": lambda: _driver({"announce_channel": BAD_CHANNEL}),
        "rl.toml: driver.descriptor_channel": lambda: _rl({"descriptor_channel": BAD_CHANNEL}),
        "local.descriptor_channel": lambda: _bridge(tmp_path, {"descriptor_channel": BAD_CHANNEL}),
        "descriptorChannel": lambda: parse_source_options(
            {"streams": "1", "descriptorChannel": BAD_CHANNEL}
        ),
        "--descriptor-channel": lambda: _common.endpoints_from_args(
            _cli("--descriptor-channel", BAD_CHANNEL)
        ),
    }
    for key, call in cases.items():
        reason = _reason_of(call)
        assert key in reason and problem in reason, (key, reason)


def test_14_1_env_override_goes_through_the_validator() -> None:
    """#14.1: environment overrides of endpoint keys are validated the same way and named."""
    with pytest.raises(ConfigError) as info:
        parse_driver_config(
            DRIVER_MINIMAL, source="d.toml", env={"DRIVER_QOS_CHANNEL": BAD_CHANNEL}
        )
    assert info.value.key == "driver.qos_channel" and "DRIVER_QOS_CHANNEL" in info.value.reason
    cfg = parse_driver_config(
        DRIVER_MINIMAL, source="d.toml", env={"TENSORPOOL_DRIVER_QOS_STREAM_ID": "1201"}
    )
    assert cfg.driver.qos_stream_id == 1201


def test_14_1_aeron_stream_id_bound_accepts_the_top(tmp_path: Path) -> None:
    """#14.1: an endpoint's stream id is an Aeron (int32) id: 1..2^31-1 everywhere."""
    top = MAX_AERON_STREAM_ID
    assert top == 2**31 - 1
    assert Endpoints(qos_stream_id=top).qos_stream_id == top
    assert _driver({"qos_stream_id": top}).driver.qos_stream_id == top
    assert _rl({"qos_stream_id": top}).driver.qos_stream_id == top
    assert _bridge(tmp_path, {"qos_stream_id": top}).local.channels.qos_stream_id == top
    opts = parse_source_options({"streams": "1", "controlStreamId": str(top)})
    assert opts.connection.control_stream_id == top


@pytest.mark.parametrize("bad", [0, MAX_AERON_STREAM_ID + 1])
def test_14_1_aeron_stream_id_bound_refuses_outside(tmp_path: Path, bad: int) -> None:
    """#14.1: 0 and 2^31 are refused by every entry point, naming the key."""
    for call in (
        lambda: Endpoints(qos_stream_id=bad),
        lambda: _driver({"qos_stream_id": bad}),
        lambda: _rl({"qos_stream_id": bad}),
        lambda: _bridge(tmp_path, {"qos_stream_id": bad}),
        lambda: _common.endpoints_from_args(_cli("--qos-stream-id", str(bad))),
    ):
        assert "qos" in _reason_of(call)
    reason = _reason_of(lambda: parse_source_options({"streams": "1", "controlStreamId": str(bad)}))
    assert reason.startswith("controlStreamId")


def test_14_1_data_stream_id_bound(tmp_path: Path) -> None:
    """#14.1: a data stream id is a wire uint32 with 0xFFFFFFFF as null: 1..2^32-2 in the driver,
    the rate limiter and the bridge (the bridge used int32); Spark keeps the int32 its
    ``stream_id int`` column can hold, and says so."""
    top = MAX_DATA_STREAM_ID
    assert top == 2**32 - 2
    assert _driver(streams={"s": {"stream_id": top, "profile": "p"}}).streams[0].stream_id == top
    assert _rl(source_stream_id=top).mappings[0].source_stream_id == top
    assert _bridge(tmp_path, source=top).mappings[0].source_stream_id == top
    for call in (
        lambda: _driver(streams={"s": {"stream_id": top + 1, "profile": "p"}}),
        lambda: _rl(source_stream_id=top + 1),
        lambda: _bridge(tmp_path, source=top + 1),
    ):
        assert "stream_id" in _reason_of(call)
    assert SPARK_MAX_STREAM_ID == 2**31 - 1
    opts = parse_source_options({"streams": str(SPARK_MAX_STREAM_ID)})
    assert opts.streams == (SPARK_MAX_STREAM_ID,)
    reason = _reason_of(lambda: parse_source_options({"streams": str(SPARK_MAX_STREAM_ID + 1)}))
    assert reason.startswith("streams")
