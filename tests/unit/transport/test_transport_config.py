"""TransportConfig validation names the offending field."""

from __future__ import annotations

import dataclasses

import pytest

from tensorpool.transport import TransportConfig, TransportConfigError


def test_defaults_mean_embedded_shared_driver() -> None:
    cfg = TransportConfig()
    assert cfg.embedded
    assert cfg.threading_mode == "shared"
    assert not TransportConfig(aeron_dir="").embedded
    assert not TransportConfig(aeron_dir="/dev/shm/x").embedded
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.aeron_dir = "x"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"threading_mode": "many"}, "threading_mode"),
        ({"ipc_term_buffer_length": 1000}, "ipc_term_buffer_length"),
        ({"term_buffer_length": 3 * 65536}, "term_buffer_length"),
        ({"mtu_length": 1000}, "mtu_length"),
        ({"driver_timeout_ms": 0}, "driver_timeout_ms"),
        ({"keepalive_interval_ns": -5}, "keepalive_interval_ns"),
        ({"resource_linger_duration_ns": 0}, "resource_linger_duration_ns"),
        ({"idle_sleep_duration_ns": 0}, "idle_sleep_duration_ns"),
    ],
)
def test_invalid_settings_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(TransportConfigError, match=field):
        TransportConfig(**kwargs)  # type: ignore[arg-type]


def test_valid_driver_options_accepted() -> None:
    cfg = TransportConfig(
        ipc_term_buffer_length=1024 * 1024,
        term_buffer_length=64 * 1024,
        mtu_length=8192,
        threading_mode="dedicated",
    )
    assert cfg.ipc_term_buffer_length == 1024 * 1024
