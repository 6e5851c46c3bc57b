"""#16.4 *OffsetsByTimestamp / includeStreamMetadata option parsing, the metadata tracker and
column, and #16.6 reading a payload layout back from schema metadata (no Spark session: real
codecs, real Arrow arrays)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from tensorpool.spark_source.convert import stack, tensor_layout, to_numpy
from tensorpool.spark_source.options import (
    TensorPoolOptionError,
    parse_source_options,
)
from tensorpool.spark_source.rings import stream_meta
from tensorpool.specs.generated import wire


def _opts(streaming: bool | None = None, **kw: str):
    return parse_source_options({"streams": "1,2", **kw}, streaming=streaming)


def test_timestamp_options_parse_per_stream_with_kafka_sentinels():
    """#16.4: JSON stream -> ms since the epoch, -1 latest, -2 earliest; any spelling of the
    name; streams left out keep startingOffsets; the strategy defaults to error."""
    o = _opts(startingoffsetsbytimestamp='{"2": -2, "1": 1700000000000}')
    assert o.starting_by_timestamp == ((1, 1700000000000), (2, -2))
    assert o.timestamp_strategy == "error" and o.ending_by_timestamp == ()
    o = _opts(
        False,
        startingOffsetsByTimestamp='{"1": 5}',
        startingOffsetsByTimestampStrategy="LATEST",
        endingOffsetsByTimestamp='{"1": -1}',
    )
    assert o.timestamp_strategy == "latest" and o.ending_by_timestamp == ((1, -1),)
    assert not _opts().include_stream_metadata
    assert _opts(includeStreamMetadata="true").include_stream_metadata


@pytest.mark.parametrize(
    ("kw", "streaming", "message"),
    [
        ({"startingOffsetsByTimestamp": "1700000000000"}, None, "must be JSON like"),
        ({"startingOffsetsByTimestamp": "{}"}, None, "must be JSON like"),
        ({"startingOffsetsByTimestamp": '{"3": 1}'}, None, "stream 3 is not in streams"),
        ({"startingOffsetsByTimestamp": '{"x": 1}'}, None, "key 'x' is not a stream id"),
        ({"startingOffsetsByTimestamp": '{"1": -3}'}, None, "expected ms since the epoch"),
        ({"startingOffsetsByTimestamp": '{"1": 1.5}'}, None, "expected ms since the epoch"),
        ({"endingOffsetsByTimestamp": '{"1": -2}'}, False, "expected ms since the epoch"),
        ({"endingOffsetsByTimestamp": '{"1": 5}'}, True, "is for batch queries"),
        ({"startingOffsetsByTimestampStrategy": "latest"}, None, "only applies with"),
        (
            {"startingOffsetsByTimestamp": '{"1": 1}', "startingOffsetsByTimestampStrategy": "x"},
            None,
            "must be 'error' or 'latest'",
        ),
        ({"includeStreamMetadata": "maybe"}, None, "must be true or false"),
        ({"includeStreamMetadata": "true", "batching": "pulse"}, True, "batching=pulse"),
        (
            {"startingOffsetsByTimestamp": '{"1": 1}', "batching": "pulse"},
            True,
            "batching=pulse",
        ),
    ],
)
def test_bad_timestamp_and_metadata_options_name_the_option(kw, streaming, message):
    """#16.4: every invalid value fails with one line that starts with the option's name."""
    with pytest.raises(TensorPoolOptionError) as info:
        _opts(streaming, **kw)
    text = str(info.value)
    assert text.split(":")[0] in kw and message in text and "\n" not in text


def _announce(sid: int, epoch: int, version: int, name: str) -> bytes:
    buf = bytearray(512)
    n = wire.DataSourceAnnounceEncoder.encode(
        buf, 0, stream_id=sid, producer_id=1, epoch=epoch, meta_version=version, name=name,
        summary="",
    )  # fmt: skip
    return bytes(buf[:n])


def _meta(sid: int, version: int, attrs: list[tuple[str, str, bytes]]) -> bytes:
    buf = bytearray(1024)
    n = wire.DataSourceMetaEncoder.encode(
        buf, 0, stream_id=sid, meta_version=version, timestamp_ns=1,
        attributes=[{"key": k, "format": f, "value": v} for k, f, v in attrs],
    )  # fmt: skip
    return bytes(buf[:n])


def test_tracker_keeps_versions_per_stream_epoch():
    """#16.4: name + attributes per (stream, epoch, meta_version); an attribute called name
    wins; binary attributes are base64; another epoch's versions are not mixed in."""
    t = stream_meta.MetaTracker()
    assert not t.known(7)
    t.on_message(_announce(7, 3, 0, "cam"))
    t.on_message(_announce(7, 3, 1, "cam"))
    t.on_message(
        _meta(7, 1, [("site", "text/plain", b"lab"), ("blob", "application/octet-stream", b"\x00")])
    )
    t.on_message(_announce(8, 1, 0, "other"))
    t.on_message(_meta(8, 0, [("name", "text/plain", b"mine")]))
    t.on_message(b"\x00" * 12)  # not a message: ignored
    assert t.known(7) and t.known(8)
    assert t.versions_for(7, 3) == (
        (0, (("name", "cam"),)),
        (1, (("blob", "base64:AA=="), ("name", "cam"), ("site", "lab"))),
    )
    assert t.versions_for(8, 1) == ((0, (("name", "mine"),)),)
    assert t.versions_for(7, 4) == ()


def test_a_kept_tracker_waits_for_the_planned_epoch_not_an_earlier_one():
    """A tracker kept with the shared probe knows a restarted producer's earlier epoch: the plan
    waits (and says hello) until the epoch it plans was announced."""
    t = stream_meta.MetaTracker()
    t.on_message(_announce(7, 3, 0, "cam"))
    assert t.known(7) and t.known(7, 3) and not t.known(7, 4)
    nudged: list[int] = []
    assert t.wait((7,), 0.05, nudged.append, poll=False, epochs={7: 4}) == [7]
    assert nudged and set(nudged) == {7}  # asked for it
    assert t.wait((7,), 0.05, poll=False) == []  # any epoch: known
    t.on_message(_announce(7, 4, 0, "cam"))
    assert t.wait((7,), 0.05, poll=False, epochs={7: 4}) == []


def test_metadata_column_follows_each_frames_meta_version():
    """#16.4: each row gets the map of its frame's meta_version; an unknown version is null;
    the tensor columns a read needed only for this are dropped."""
    out_schema = pa.schema(
        [
            ("seq", pa.int64()),
            ("payload", pa.binary()),
            ("metadata", pa.map_(pa.string(), pa.string())),
        ]
    )
    batch = pa.RecordBatch.from_pydict(
        {
            "seq": pa.array([0, 1, 2], pa.int64()),
            "meta_version": pa.array([0, 1, 5], pa.int32()),
            "payload": pa.array([b"a", b"b", b"c"]),
        }
    )
    versions = ((0, (("name", "cam"),)), (1, (("name", "cam"), ("site", "lab"))))
    (got,) = stream_meta.add_metadata_column(iter([batch]), versions, out_schema, ("meta_version",))
    assert got.schema.equals(out_schema)
    assert got.column("metadata").to_pylist() == [
        [("name", "cam")],
        [("name", "cam"), ("site", "lab")],
        None,
    ]


def test_layout_from_schema_metadata_drives_stack_and_to_numpy():
    """#16.6: dtype/shape from the payload field metadata, in Spark's Arrow form (toArrow keeps
    it as SPARK::metadata::json); without it stack/to_numpy say what they need."""
    frames = [np.arange(6, dtype="<f4").reshape(2, 3) + i for i in range(3)]
    meta = {b"SPARK::metadata::json": json.dumps({"dtype": "float32", "shape": [2, 3]}).encode()}
    field = pa.field("payload", pa.binary(), metadata=meta)
    table = pa.Table.from_arrays(
        [pa.array([f.tobytes() for f in frames])], schema=pa.schema([field])
    )
    assert tensor_layout(table) == ("float32", (2, 3))
    assert np.array_equal(stack(table), np.stack(frames))
    row = {"payload": frames[1].tobytes()}
    assert np.array_equal(to_numpy(row, schema=table.schema), frames[1])
    assert tensor_layout({"dtype": "uint8"}) is None
    plain = pa.table({"payload": [f.tobytes() for f in frames]})
    with pytest.raises(ValueError, match="dtype and shape are needed"):
        stack(plain)
    with pytest.raises(ValueError, match="dtype and shape are needed"):
        to_numpy(row)
    # given explicitly, dtype/shape win over the metadata
    assert stack(table, "uint8", (24,)).shape == (3, 24)
