"""#30 (the 30-minute run with Spark): the soak's query rides out the outages the soak causes.

The first 30-minute run with the Spark query counted it as crashed when stream 108 had no live
producer for 30 s (``staleStreamTimeoutMs``) and when ``serve`` did not answer for 15 s
(``flightRetryMs``), the sources' production defaults; the soak judges the query's recovery
itself. Its options must parse as the sources parse them (a misspelt option would fail the
query at ``load()``, a crash in every run) and keep the query up over such outages.
"""

from __future__ import annotations

import pytest

from tensorpool.commands.soak import RECOVERY_TIMEOUT_S
from tensorpool.commands.soak_spark import FLIGHT_OPTIONS, SOURCE_OPTIONS
from tensorpool.spark_source.options import parse_source_options


@pytest.mark.parametrize(
    "where",
    [
        {"streams": "105", "aeronDir": "/a", "shmBaseDir": "/s", "driver": "true"},
        {"streams": "127.0.0.1:1/108", "hosts": "127.0.0.1:1", "preferLocalReads": "false"},
    ],
    ids=["shm", "flight"],
)
def test_30_spark_query_survives_a_stale_stream_and_an_unanswering_serve(where: dict) -> None:
    given = FLIGHT_OPTIONS if "hosts" in where else SOURCE_OPTIONS
    opts = parse_source_options({**where, **given}, streaming=True)
    assert opts.on_stale_stream == "warn"  # a producer's outage does not fail the query
    if "hosts" in where:
        assert opts.remote is not None
        assert opts.remote.access.retry_s > RECOVERY_TIMEOUT_S  # nor a serve restart
