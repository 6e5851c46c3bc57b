"""Byte layout of header slots and payload slots (§6, §8.1, §8.2, §9).

The hot path uses hand-precompiled ``struct`` formats; these tests prove they put every field
exactly where the generated SBE codecs (the schema's source of truth) do, in both directions.
"""

from __future__ import annotations

import numpy as np

from tensorpool.shm import TensorLayout, header_slot_offset, payload_slot_offset
from tensorpool.shm import layout as L
from tensorpool.shm.layout import Dtype, MajorOrder, ProgressUnit
from tensorpool.specs.generated.wire import (
    MESSAGE_HEADER_LENGTH,
    SlotHeaderDecoder,
    SlotHeaderEncoder,
    TensorHeaderDecoder,
    TensorHeaderEncoder,
)

SLOT_VALUES = dict(
    values_len_bytes=0x0A0B0C0D,
    payload_slot=0x01020304,
    pool_id=0xBEEF,
    payload_offset=0x11223344,
    timestamp_ns=0x5566778899AABBCC,
    meta_version=0x0F0E0D0C,
)


def test_s8_1_header_slot_offsets() -> None:
    assert L.HEADER_SLOT_BYTES == 256
    assert [header_slot_offset(i) for i in (0, 1, 7)] == [64, 320, 64 + 7 * 256]
    assert L.header_region_bytes(8) == 64 + 8 * 256


def test_s9_payload_slot_offsets() -> None:
    assert payload_slot_offset(0, 4096) == 64
    assert payload_slot_offset(3, 1 << 20) == 64 + 3 * (1 << 20)
    assert L.payload_region_bytes(8, 4096) == 64 + 8 * 4096


def test_s8_2_slot_math_60_plus_4_plus_192_is_256() -> None:
    assert SlotHeaderDecoder.BLOCK_LENGTH == 60 == L.SLOT_HEADER_BLOCK_LENGTH
    assert MESSAGE_HEADER_LENGTH + TensorHeaderDecoder.BLOCK_LENGTH == 192
    assert L.EMBEDDED_HEADER_LENGTH == 192
    assert L.HEADER_BYTES_LENGTH_OFFSET == 60 and L.EMBEDDED_HEADER_OFFSET == 64
    assert L.HEADER_SLOT_BYTES == 60 + 4 + 192
    assert L.SEQ_COMMIT_OFFSET == SlotHeaderDecoder.SEQ_COMMIT_OFFSET == 0


def test_s8_2_generated_offsets_match_layout_facts() -> None:
    d = SlotHeaderDecoder
    assert (d.VALUES_LEN_BYTES_OFFSET, d.PAYLOAD_SLOT_OFFSET, d.POOL_ID_OFFSET) == (8, 12, 16)
    assert (d.PAYLOAD_OFFSET_OFFSET, d.TIMESTAMP_NS_OFFSET, d.META_VERSION_OFFSET) == (18, 22, 30)
    assert (d.PAD_OFFSET, d.PAD_LENGTH) == (34, 26)
    t = TensorHeaderDecoder
    assert (t.DTYPE_OFFSET, t.MAJOR_ORDER_OFFSET, t.NDIMS_OFFSET, t.PAD_ALIGN_OFFSET) == (
        0,
        2,
        4,
        5,
    )
    assert (t.PROGRESS_UNIT_OFFSET, t.PROGRESS_STRIDE_BYTES_OFFSET) == (6, 7)
    assert (t.DIMS_OFFSET, t.STRIDES_OFFSET, t.PAD_OFFSET, t.PAD_LENGTH) == (11, 43, 75, 109)
    assert (t.TEMPLATE_ID, t.SCHEMA_ID, t.SCHEMA_VERSION) == (52, 900, 1)


def test_s8_2_precompiled_slot_fields_match_generated_decoder() -> None:
    buf = bytearray(256)
    L.SLOT_FIELDS.pack_into(buf, L.SLOT_FIELDS_OFFSET, *SLOT_VALUES.values())
    buf[60:64] = (0).to_bytes(4, "little")  # empty headerBytes so the decoder can wrap
    dec = SlotHeaderDecoder().wrap_body(buf, 0)
    for name, value in SLOT_VALUES.items():
        assert getattr(dec, name) == value, name
    assert dec.pad == bytes(26)


def test_s8_2_generated_encoder_output_reads_back_through_precompiled_formats() -> None:
    th = bytearray(192)
    TensorHeaderEncoder.encode(
        th,
        0,
        dtype=Dtype.INT16,
        major_order=MajorOrder.COLUMN,
        ndims=3,
        pad_align=0,
        progress_unit=ProgressUnit.COLUMNS,
        progress_stride_bytes=0x01020304,
        dims=[5, 6, 7],
        strides=[2, 10, 60],
    )
    slot = bytearray(256)
    n = SlotHeaderEncoder.encode_body(slot, 0, seq_commit=0, header_bytes=th, **SLOT_VALUES)
    assert n == 256
    assert L.SLOT_FIELDS_READ.unpack_from(slot, L.SLOT_FIELDS_OFFSET) == tuple(SLOT_VALUES.values())
    fields = L.TENSOR_BLOB_READ.unpack_from(slot, L.TENSOR_BLOB_OFFSET)
    assert fields[:5] == (192, 184, 52, 900, 1)
    assert fields[5:11] == (Dtype.INT16, MajorOrder.COLUMN, 3, 0, ProgressUnit.COLUMNS, 0x01020304)
    assert fields[11:19] == (5, 6, 7, 0, 0, 0, 0, 0)
    assert fields[19:27] == (2, 10, 60, 0, 0, 0, 0, 0)


def test_s8_2_layout_blob_equals_generated_embedded_header() -> None:
    """TensorLayout.blob is byte-identical to varData length + TensorHeaderEncoder output."""
    layout = TensorLayout(Dtype.FLOAT32, MajorOrder.ROW, (3, 4, 5))
    th = bytearray(192)
    TensorHeaderEncoder.encode(
        th,
        0,
        dtype=Dtype.FLOAT32,
        major_order=MajorOrder.ROW,
        ndims=3,
        pad_align=0,
        progress_unit=ProgressUnit.NONE,
        progress_stride_bytes=0,
        dims=[3, 4, 5],
        strides=[80, 20, 4],
    )
    assert layout.blob == (192).to_bytes(4, "little") + bytes(th)
    slot = bytearray(256)
    slot[L.TENSOR_BLOB_OFFSET :] = layout.blob
    dec = SlotHeaderDecoder().wrap_body(slot, 0)
    assert dec.header_bytes_length == 192 and dec.header_bytes_offset == 64
    t = TensorHeaderDecoder().wrap(slot, dec.header_bytes_offset)
    assert (t.dtype, t.major_order, t.ndims) == (Dtype.FLOAT32, MajorOrder.ROW, 3)
    assert t.dims == (3, 4, 5, 0, 0, 0, 0, 0) and t.strides == (80, 20, 4, 0, 0, 0, 0, 0)


def test_s8_2_writer_slot_is_byte_identical_to_generated_encoding(stream) -> None:  # type: ignore[no-untyped-def]
    """A whole slot written by SlotWriter equals SlotHeaderEncoder+TensorHeaderEncoder output."""
    arr = np.arange(12, dtype=np.uint16).reshape(3, 4)
    seq = 13
    idx = stream.writer.write(seq, arr, timestamp_ns=777, meta_version=3)
    off = header_slot_offset(idx)
    ours = bytes(stream.header.mmap[off : off + 256])
    th = bytearray(192)
    TensorHeaderEncoder.encode(
        th,
        0,
        dtype=Dtype.UINT16,
        major_order=MajorOrder.ROW,
        ndims=2,
        pad_align=0,
        progress_unit=ProgressUnit.NONE,
        progress_stride_bytes=0,
        dims=[3, 4],
        strides=[8, 2],
    )
    theirs = bytearray(256)
    SlotHeaderEncoder.encode_body(
        theirs,
        0,
        seq_commit=(seq << 1) | 1,
        values_len_bytes=24,
        payload_slot=idx,
        pool_id=1,
        payload_offset=0,
        timestamp_ns=777,
        meta_version=3,
        header_bytes=th,
    )
    assert ours == bytes(theirs)


def test_s8_2_seq_commit_word_is_8_byte_aligned_in_every_slot() -> None:
    for i in range(1024):
        assert (header_slot_offset(i) + L.SEQ_COMMIT_OFFSET) % 8 == 0
        # and inside one 64-byte cache line
        assert (header_slot_offset(i) % 64) + 8 <= 64
    assert L.ACTIVITY_TIMESTAMP_OFFSET == 56
