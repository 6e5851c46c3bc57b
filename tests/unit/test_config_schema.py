"""#26.5: one configuration mechanism; ``aeron_dir`` declared once and checked once."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

import tensorpool
from tensorpool.bridge.config import LocalSettings, parse_bridge_config
from tensorpool.config_schema import EndpointKeys
from tensorpool.config_util import ConfigError
from tensorpool.driver.config import DriverSettings, parse_driver_config
from tensorpool.ratelimiter.config import DriverAccess, parse_ratelimiter_config

ROOT = Path(tensorpool.__file__).resolve().parent
CONFIG_MODULES = (
    "config_schema.py",
    "driver/config.py",
    "ratelimiter/config.py",
    "bridge/config.py",
)

DRIVER = {
    "profiles": {"p": {"payload_pools": [{"pool_id": 1, "stride_bytes": 4096}]}},
    "streams": {"s": {"stream_id": 10000, "profile": "p"}},
}
RATELIMITER = {
    "rate_limiter": {"instance_id": "rl", "descriptor_channel": "aeron:ipc"},
    "mappings": [{"source_stream_id": 1, "dest_stream_id": 2, "profile": "p"}],
}
RATELIMITER["rate_limiter"]["descriptor_stream_id"] = 2100
BRIDGE = {
    "bridge": {
        "instance_id": "b",
        "role": "sender",
        "payload_channel": "aeron:udp?endpoint=127.0.0.1:40456",
        "payload_stream_id": 3000,
        "control_channel": "aeron:udp?endpoint=127.0.0.1:40457",
        "control_stream_id": 3001,
    },
    "mappings": [{"source_stream_id": 1, "dest_stream_id": 2, "profile": "p"}],
}


def _declarations(name: str) -> list[str]:
    """``module:Class`` for every class body in the config modules that declares ``name``."""
    found = []
    for rel in CONFIG_MODULES:
        tree = ast.parse((ROOT / rel).read_text())
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for stmt in cls.body:
                target = stmt.target if isinstance(stmt, ast.AnnAssign) else None
                if isinstance(target, ast.Name) and target.id == name:
                    found.append(f"{rel}:{cls.name}")
    return found


def test_26_5_aeron_dir_is_declared_once_and_embedded() -> None:
    """The driver's [driver], the rate limiter's [driver] and the bridge's [local] all get
    ``aeron_dir`` (and the endpoints) from one table, so they cannot drift apart again."""
    assert _declarations("aeron_dir") == ["config_schema.py:EndpointKeys"]
    for table in (DriverSettings, DriverAccess, LocalSettings):
        assert issubclass(table, EndpointKeys), table


def _error(parse: Any, doc: dict[str, Any], table: str) -> ConfigError:
    data = {**doc, table: {**doc.get(table, {}), "aeron_dir": "/etc"}}
    with pytest.raises(ConfigError) as info:
        parse(data, source="f.toml", env={})
    return info.value


def test_26_5_one_root_check_one_reason_in_every_file() -> None:
    """The same refused directory gets the same reason from every file kind (one check)."""
    errors = [
        _error(parse_driver_config, DRIVER, "driver"),
        _error(parse_ratelimiter_config, RATELIMITER, "driver"),
        _error(parse_bridge_config, BRIDGE, "local"),
    ]
    assert [e.key for e in errors] == ["driver.aeron_dir", "driver.aeron_dir", "local.aeron_dir"]
    assert len({e.reason for e in errors}) == 1, [e.reason for e in errors]
    assert "/etc" in errors[0].reason


def test_26_5_empty_aeron_dir_is_valid_everywhere() -> None:
    assert parse_driver_config(DRIVER, env={}).driver.aeron_dir == ""
    assert parse_ratelimiter_config(RATELIMITER, env={}).driver.aeron_dir == ""
    assert parse_bridge_config(BRIDGE, env={}).local.aeron_dir == ""


def test_26_5_the_python_api_the_cli_and_spark_share_the_one_aeron_dir_check() -> None:
    """Outside the TOML files, an ``aeron_dir`` is checked by the same rule with the same
    reason: ``TransportConfig`` (the Python API), ``--aeron-dir`` and Spark's ``aeronDir``."""
    import argparse

    from tensorpool.cli import UserError
    from tensorpool.commands._common import transport_config
    from tensorpool.config_util import aeron_dir_problem
    from tensorpool.spark_source.options import TensorPoolOptionError, parse_source_options
    from tensorpool.transport.config import TransportConfig, TransportConfigError

    for bad in ("/etc", "relative/aeron"):
        reason = aeron_dir_problem(bad)
        assert reason is not None
        with pytest.raises(TransportConfigError) as api:
            TransportConfig(aeron_dir=bad)
        assert reason in str(api.value)
    reason = aeron_dir_problem("/etc")
    assert reason is not None
    with pytest.raises(UserError) as cli:
        transport_config(argparse.Namespace(embedded=False, aeron_dir="/etc"))
    assert reason in str(cli.value)
    with pytest.raises(TensorPoolOptionError) as spark:
        parse_source_options({"streams": "1", "aeronDir": "/etc"})
    assert reason in str(spark.value)
