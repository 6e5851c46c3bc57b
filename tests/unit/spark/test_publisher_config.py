"""#14.1 the sink publisher's config embeds the one endpoints type instead of flat copies."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

from tensorpool.endpoints import Endpoints
from tensorpool.spark_source.options import parse_sink_options
from tensorpool.spark_source.spark.publisher import MUST_MATCH, PublisherConfig, config_value
from tensorpool.spark_source.spark.sink import publisher_config


def _opts(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"stream": "7", "shmBaseDir": str(tmp_path), **extra}


def test_14_1_publisher_gets_the_options_endpoints_through_json(tmp_path: Path) -> None:
    """#14.1: the publisher process receives the endpoints the Spark options resolved (QoS and
    metadata included), as an ``Endpoints``, across its ``--config`` JSON."""
    opts = parse_sink_options(
        _opts(
            tmp_path,
            controlChannel="aeron:ipc?term-length=1m",
            controlStreamId="4242",
            descriptorStreamId="4243",
        )
    )
    cfg = publisher_config(opts)
    back = PublisherConfig.from_json(cfg.to_json())
    assert back == cfg
    assert type(back.endpoints) is Endpoints
    assert back.endpoints == opts.connection.endpoints
    assert back.endpoints.qos_channel == "aeron:ipc?term-length=1m"


def test_14_1_a_second_writer_differing_in_one_endpoint_is_named(tmp_path: Path) -> None:
    """#14.1: the two-writers check still names the one option that differs, now that the
    endpoints are nested in the publisher's config."""
    cfg = publisher_config(parse_sink_options(_opts(tmp_path)))
    other = replace(cfg, endpoints=replace(cfg.endpoints, descriptor_stream_id=4999))
    running, wanted = asdict(cfg), asdict(other)
    differing = [
        option
        for path, option in MUST_MATCH.items()
        if config_value(running, path) != config_value(wanted, path)
    ]
    assert differing == ["descriptorStreamId"]
    assert config_value(wanted, "endpoints.descriptor_stream_id") == 4999
    assert config_value({}, "endpoints.control_channel") is None  # an older publisher's JSON
