"""TensorHeader ⇄ numpy: dtype registry (§15.8) and layout rules (§8.2)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorpool.counters import Reason
from tensorpool.shm import NUMPY_TO_WIRE, WIRE_TO_NUMPY, TensorLayout, TensorLayoutError
from tensorpool.shm.layout import MAX_DIMS, TENSOR_BLOB_READ, Dtype, MajorOrder, ProgressUnit

ROW, COL = MajorOrder.ROW, MajorOrder.COLUMN
F32 = Dtype.FLOAT32


def _reason(fn, *args, **kw) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(TensorLayoutError) as info:
        fn(*args, **kw)
    return info.value.reason


# --- §15.8 registry ----------------------------------------------------------------------------
def test_s15_8_normative_enum_values() -> None:
    assert {m.name: int(m) for m in Dtype} == {
        "UNKNOWN": 0,
        "UINT8": 1,
        "INT8": 2,
        "UINT16": 3,
        "INT16": 4,
        "UINT32": 5,
        "INT32": 6,
        "UINT64": 7,
        "INT64": 8,
        "FLOAT32": 9,
        "FLOAT64": 10,
        "BOOLEAN": 11,
        "BYTES": 13,
        "BIT": 14,
    }
    assert {m.name: int(m) for m in MajorOrder} == {"UNKNOWN": 0, "ROW": 1, "COLUMN": 2}
    assert MAX_DIMS == 8


@pytest.mark.parametrize(
    ("wire", "np_dtype"),
    [
        (Dtype.UINT8, "u1"),
        (Dtype.INT8, "i1"),
        (Dtype.UINT16, "<u2"),
        (Dtype.INT16, "<i2"),
        (Dtype.UINT32, "<u4"),
        (Dtype.INT32, "<i4"),
        (Dtype.UINT64, "<u8"),
        (Dtype.INT64, "<i8"),
        (Dtype.FLOAT32, "<f4"),
        (Dtype.FLOAT64, "<f8"),
        (Dtype.BOOLEAN, "?"),
        (Dtype.BYTES, "u1"),
        (Dtype.BIT, "u1"),
    ],
)
def test_s15_8_dtype_table(wire: Dtype, np_dtype: str) -> None:
    assert WIRE_TO_NUMPY[wire] == np.dtype(np_dtype)
    layout = TensorLayout(wire, ROW, (3,))
    assert layout.np_dtype == np.dtype(np_dtype) and layout.extent_bytes == 3 * layout.itemsize


def test_s15_8_numpy_to_wire_is_inverse_for_numeric_types() -> None:
    for np_dtype, wire in NUMPY_TO_WIRE.items():
        assert WIRE_TO_NUMPY[wire] == np_dtype


@pytest.mark.parametrize("raw", [0, 12, 15, -1, 255, 32767])
def test_s15_8_unknown_dtype_rejected(raw: int) -> None:
    assert _reason(TensorLayout, raw, ROW, (2,)) == Reason.DTYPE_UNKNOWN


@pytest.mark.parametrize("raw", [0, 3, -1])
def test_s15_8_unknown_major_order_rejected(raw: int) -> None:
    assert _reason(TensorLayout, F32, raw, (2,)) == Reason.MAJOR_ORDER_UNKNOWN


@pytest.mark.parametrize("raw", [3, 255])
def test_s15_8_unknown_progress_unit_rejected(raw: int) -> None:
    assert _reason(TensorLayout, F32, ROW, (2,), None, raw, 4) == Reason.PROGRESS_UNIT_UNKNOWN


@pytest.mark.parametrize("dt", ["<f2", ">f4", ">i8", "c8", "U3", "O", "M8[ns]"])
def test_s15_8_numpy_dtypes_without_wire_type_rejected(dt: str) -> None:
    assert _reason(TensorLayout.from_array, np.zeros(2, dt)) == Reason.DTYPE_UNKNOWN


def test_s15_8_bytes_and_bit_are_explicit_labels_for_uint8() -> None:
    a = np.zeros(4, np.uint8)
    assert TensorLayout.from_array(a).dtype == Dtype.UINT8
    assert TensorLayout.from_array(a, wire_dtype=Dtype.BYTES).dtype == Dtype.BYTES
    assert TensorLayout.from_array(a, wire_dtype=Dtype.BIT).dtype == Dtype.BIT
    assert _reason(TensorLayout.from_array, np.zeros(2, "<f4"), wire_dtype=Dtype.BYTES) == (
        Reason.DTYPE_UNKNOWN
    )
    assert _reason(TensorLayout.from_array, a, wire_dtype=Dtype.UNKNOWN) == Reason.DTYPE_UNKNOWN


# --- §8.2 ndims, dims, strides -----------------------------------------------------------------
@pytest.mark.parametrize("ndims", [0, 9])
def test_s8_2_ndims_outside_1_to_max_dims_rejected(ndims: int) -> None:
    assert _reason(TensorLayout, F32, ROW, (1,) * ndims) == Reason.NDIMS_OUT_OF_RANGE
    fields = list(TENSOR_BLOB_READ.unpack(TensorLayout(F32, ROW, (2,)).blob[:87]))
    fields[7] = ndims
    assert _reason(TensorLayout.from_blob_fields, tuple(fields)) == Reason.NDIMS_OUT_OF_RANGE


def test_s8_2_max_dims_accepted() -> None:
    layout = TensorLayout(Dtype.UINT8, ROW, (2,) * 8)
    assert layout.strides == tuple(2**k for k in range(7, -1, -1))


def test_s8_2_unused_dims_and_strides_zero_filled_on_write() -> None:
    blob = TensorLayout(F32, ROW, (3, 4)).blob
    fields = TENSOR_BLOB_READ.unpack(blob[:87])
    assert fields[11:19] == (3, 4, 0, 0, 0, 0, 0, 0)
    assert fields[19:27] == (16, 4, 0, 0, 0, 0, 0, 0)
    assert blob[87:] == bytes(196 - 87), "TensorHeader pad is zero-filled"


def test_s8_2_unused_dims_and_strides_ignored_on_read() -> None:
    fields = list(TENSOR_BLOB_READ.unpack(TensorLayout(F32, ROW, (3, 4)).blob[:87]))
    fields[13:19] = [-7, 99, 1, 2, 3, 4]  # garbage beyond ndims
    fields[21:27] = [-1, -1, 5, 6, 7, 8]
    layout = TensorLayout.from_blob_fields(tuple(fields))
    assert layout.dims == (3, 4) and layout.strides == (16, 4)


def test_s8_2_zero_strides_mean_contiguous_row_major() -> None:
    layout = TensorLayout(F32, ROW, (2, 3, 5))
    assert layout.strides == (60, 20, 4) and layout.extent_bytes == 120


def test_s8_2_zero_strides_mean_contiguous_column_major() -> None:
    layout = TensorLayout(F32, COL, (2, 3, 5))
    assert layout.strides == (4, 8, 24) and layout.extent_bytes == 120


def test_s8_2_partial_zero_strides_filled_from_neighbours() -> None:
    # padded rows: explicit row pitch, inferred element stride
    layout = TensorLayout(Dtype.UINT8, ROW, (4, 3), (8, 0))
    assert layout.strides == (8, 1) and layout.extent_bytes == 3 * 8 + 3
    layout = TensorLayout(Dtype.UINT8, ROW, (4, 3), (0, 2))
    assert layout.strides == (6, 2)


def test_s8_2_explicit_padded_strides_accepted() -> None:
    layout = TensorLayout(Dtype.UINT16, ROW, (480, 640), (1536, 2))
    assert layout.extent_bytes == 479 * 1536 + 639 * 2 + 2


def test_s8_2_negative_strides_rejected() -> None:
    assert _reason(TensorLayout, F32, ROW, (2, 3), (-12, 4)) == Reason.STRIDES_NEGATIVE
    assert _reason(TensorLayout, F32, ROW, (2, 3), (12, -4)) == Reason.STRIDES_NEGATIVE


def test_s8_2_negative_dims_rejected() -> None:
    assert _reason(TensorLayout, F32, ROW, (2, -3)) == Reason.DIMS_NEGATIVE


@pytest.mark.parametrize(
    ("order", "dims", "strides"),
    [
        (ROW, (2, 3), (4, 4)),  # rows overlap
        (ROW, (2, 3), (8, 4)),  # row stride < row extent
        (ROW, (3,), (2,)),  # element stride < itemsize
        (COL, (2, 3), (4, 4)),  # columns overlap
        (ROW, (2, 3), (4, 8)),  # column-major strides declared as ROW
        (COL, (2, 3), (12, 4)),  # row-major strides declared as COLUMN
    ],
)
def test_s8_2_overlapping_or_order_contradicting_strides_rejected(
    order: MajorOrder, dims: tuple[int, ...], strides: tuple[int, ...]
) -> None:
    assert _reason(TensorLayout, F32, order, dims, strides) == Reason.STRIDES_INCONSISTENT


def test_s8_2_empty_tensor_has_zero_extent() -> None:
    layout = TensorLayout(F32, ROW, (0, 5))
    assert layout.extent_bytes == 0 and layout.strides == (20, 4)


# --- §8.2 progress -----------------------------------------------------------------------------
def test_s8_2_progress_rows_must_equal_row_stride() -> None:
    ok = TensorLayout(Dtype.UINT16, ROW, (480, 640), None, ProgressUnit.ROWS, 1280)
    assert ok.progress_unit == ProgressUnit.ROWS and ok.progress_stride_bytes == 1280
    padded = TensorLayout(Dtype.UINT16, ROW, (480, 640), (1536, 2), ProgressUnit.ROWS, 1536)
    assert padded.progress_stride_bytes == 1536
    for bad in (0, 1279, 1536):
        assert (
            _reason(TensorLayout, Dtype.UINT16, ROW, (480, 640), None, ProgressUnit.ROWS, bad)
            == Reason.PROGRESS_STRIDE_INVALID
        )


def test_s8_2_progress_columns_must_equal_column_stride() -> None:
    ok = TensorLayout(Dtype.UINT8, COL, (480, 640), None, ProgressUnit.COLUMNS, 480)
    assert ok.strides == (1, 480)
    assert (
        _reason(TensorLayout, Dtype.UINT8, COL, (480, 640), None, ProgressUnit.COLUMNS, 1)
        == Reason.PROGRESS_STRIDE_INVALID
    )
    assert (
        _reason(TensorLayout, Dtype.UINT8, COL, (480,), None, ProgressUnit.COLUMNS, 1)
        == Reason.PROGRESS_STRIDE_INVALID
    ), "COLUMNS needs a second dimension"


def test_s8_2_progress_none_ignores_progress_stride() -> None:
    assert TensorLayout(F32, ROW, (2,), None, ProgressUnit.NONE, 12345).extent_bytes == 8


# --- numpy → layout ----------------------------------------------------------------------------
def test_from_array_c_and_f_contiguous() -> None:
    a = np.zeros((3, 4, 5), np.int32)
    assert TensorLayout.from_array(a).key() == (
        Dtype.INT32,
        ROW,
        (3, 4, 5),
        (80, 20, 4),
        ProgressUnit.NONE,
    )
    f = np.asfortranarray(a)
    assert TensorLayout.from_array(f).key() == (
        Dtype.INT32,
        COL,
        (3, 4, 5),
        (4, 12, 48),
        ProgressUnit.NONE,
    )


def test_from_array_zero_dim_is_shape_1() -> None:
    layout = TensorLayout.from_array(np.float64(2.5) * np.ones(()))
    assert layout.dims == (1,) and layout.extent_bytes == 8


def test_from_array_more_than_8_dims_rejected() -> None:
    assert _reason(TensorLayout.from_array, np.zeros((1,) * 9)) == Reason.NDIMS_OUT_OF_RANGE


def test_from_array_negative_strides_rejected() -> None:
    assert _reason(TensorLayout.from_array, np.zeros((4, 4))[::-1]) == Reason.STRIDES_NEGATIVE


def test_from_array_axis_permutation_rejected() -> None:
    a = np.zeros((2, 3, 4), np.uint8).transpose(1, 0, 2)
    assert _reason(TensorLayout.from_array, a) == Reason.STRIDES_INCONSISTENT


def test_from_array_broadcast_overlap_rejected() -> None:
    """A broadcast (zero-stride) axis overlaps elements; on the wire 0 would mean contiguous,
    so describing it would misstate the memory."""
    a = np.broadcast_to(np.zeros(4, np.float32), (3, 4))
    assert _reason(TensorLayout.from_array, a) == Reason.STRIDES_INCONSISTENT


def test_layout_equality_and_hash() -> None:
    a = TensorLayout(F32, ROW, (2, 3))
    b = TensorLayout(F32, ROW, (2, 3), (12, 4))
    assert a == b and hash(a) == hash(b)
    assert a != TensorLayout(F32, COL, (2, 3))
    assert "FLOAT32" in repr(a)


_DTYPES = st.sampled_from(["u1", "i1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8", "<f4", "<f8", "?"])


@st.composite
def _arrays(draw: st.DrawFn) -> np.ndarray:
    ndim = draw(st.integers(1, 4))
    shape = tuple(draw(st.integers(0, 5)) for _ in range(ndim))
    steps = tuple(draw(st.integers(1, 3)) for _ in range(ndim))
    dt = np.dtype(draw(_DTYPES))
    base_shape = tuple(max(n * s, 1) for n, s in zip(shape, steps, strict=True))
    base = np.arange(int(np.prod(base_shape)), dtype=np.int64).astype(dt).reshape(base_shape)
    if draw(st.booleans()):
        base = np.asfortranarray(base)
    return base[tuple(slice(0, n * s, s) for n, s in zip(shape, steps, strict=True))]


@settings(max_examples=200, deadline=None)
@given(_arrays())
def test_s8_2_from_array_describes_the_array_memory_exactly(arr: np.ndarray) -> None:
    """Property: for any positive-step slice of a C or F array, the layout read back over the
    same memory reproduces the array, and its extent covers exactly the bytes it spans."""
    layout = TensorLayout.from_array(arr)
    assert layout.dims == arr.shape
    base = arr
    while isinstance(base.base, np.ndarray):
        base = base.base
    raw = base.reshape(-1, order="A").view(np.uint8)
    offset = arr.ctypes.data - base.ctypes.data if arr.size else 0
    view = layout.view(raw, offset)
    np.testing.assert_array_equal(view, arr)
    if arr.size:
        assert offset + layout.extent_bytes <= raw.nbytes
        assert layout.extent_bytes >= arr.itemsize
