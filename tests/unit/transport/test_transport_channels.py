"""Aeron channel URI building, parsing and limits."""

from __future__ import annotations

import pytest

from tensorpool.transport.channels import (
    ChannelError,
    channel_mtu,
    channel_params,
    channel_term_length,
    ipc_channel,
    max_message_length,
    parse_size,
    udp_channel,
)


def test_ipc_channel_shapes() -> None:
    assert ipc_channel() == "aeron:ipc"
    assert ipc_channel(term_length=4 * 1024 * 1024) == "aeron:ipc?term-length=4194304"
    assert (
        ipc_channel(term_length=65536, mtu=8192, sparse=True, alias="desc")
        == "aeron:ipc?term-length=65536|mtu=8192|sparse=true|alias=desc"
    )
    assert ipc_channel(extra={"linger": "0"}) == "aeron:ipc?linger=0"


def test_udp_channel_shapes() -> None:
    assert udp_channel("localhost:40123") == "aeron:udp?endpoint=localhost:40123"
    assert (
        udp_channel("239.1.1.1:40456", interface="10.0.0.0/8", ttl=4, mtu=1408)
        == "aeron:udp?endpoint=239.1.1.1:40456|interface=10.0.0.0/8|ttl=4|mtu=1408"
    )


@pytest.mark.parametrize("endpoint", ["localhost", ":40123", "host:0", "host:70000", "host:x"])
def test_udp_channel_rejects_bad_endpoints(endpoint: str) -> None:
    with pytest.raises(ChannelError, match="endpoint"):
        udp_channel(endpoint)


@pytest.mark.parametrize("term_length", [0, 1000, 32 * 1024, 3 * 1024 * 1024, 2 * 1024**3])
def test_term_length_must_be_power_of_two_in_range(term_length: int) -> None:
    with pytest.raises(ChannelError, match="term length"):
        ipc_channel(term_length=term_length)


@pytest.mark.parametrize("mtu", [0, 31, 1400, 65536])
def test_mtu_must_be_aligned_and_in_range(mtu: int) -> None:
    with pytest.raises(ChannelError, match="mtu"):
        ipc_channel(mtu=mtu)


def test_bad_or_duplicate_parameters_rejected() -> None:
    with pytest.raises(ChannelError, match="twice"):
        ipc_channel(term_length=65536, extra={"term-length": "65536"})
    with pytest.raises(ChannelError):
        ipc_channel(extra={"a|b": "1"})
    with pytest.raises(ChannelError):
        udp_channel("h:1", ttl=300)


def test_parse_back_sizes() -> None:
    assert parse_size("65536") == 65536
    assert parse_size("64k") == 65536
    assert parse_size("4M") == 4 * 1024 * 1024
    assert parse_size("1g") == 1024**3
    for bad in ("", "k", "4x", "-1", "1.5m"):
        with pytest.raises(ChannelError):
            parse_size(bad)
    assert channel_term_length("aeron:ipc?term-length=4m") == 4 * 1024 * 1024
    assert channel_term_length("aeron:ipc") is None
    assert channel_mtu("aeron:udp?endpoint=h:1|mtu=8k") == 8192
    assert channel_params("aeron:udp?endpoint=h:1|ttl=2") == {"endpoint": "h:1", "ttl": "2"}
    with pytest.raises(ChannelError):
        channel_params("udp://h:1")
    with pytest.raises(ChannelError):
        channel_params("aeron:ipc?novalue")


def test_max_message_length_rule() -> None:
    assert max_message_length(64 * 1024) == 8 * 1024
    assert max_message_length(1024**3) == 16 * 1024 * 1024


def test_28_1_ipc_spellings_that_differ_in_publication_params_share_one_subscription() -> None:
    """#28.1: one subscription per stream in a process. A subscription on ``aeron:ipc``
    receives from every IPC publication of the stream whatever its ``term-length``, so the
    conductor's lane for ``aeron:ipc?term-length=1m`` is the one for ``aeron:ipc``; a
    parameter that selects what is received (``session-id``) and other media are kept."""
    from tensorpool.transport.channels import subscription_channel

    assert subscription_channel("aeron:ipc?term-length=1m") == "aeron:ipc"
    assert subscription_channel("aeron:ipc?mtu=8k|term-length=16m|alias=x") == "aeron:ipc"
    assert subscription_channel("aeron:ipc") == "aeron:ipc"
    assert subscription_channel("aeron:ipc?term-length=1m|session-id=7") == "aeron:ipc?session-id=7"
    udp = "aeron:udp?endpoint=127.0.0.1:40123|term-length=1m"
    assert subscription_channel(udp) == udp
