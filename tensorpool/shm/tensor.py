"""TensorHeader ⇄ numpy: the dtype registry (§15.8) and layout rules (§8.2).

A :class:`TensorLayout` is the validated, *resolved* meaning of a TensorHeader: numpy dtype,
shape, byte strides with every ``0`` ("contiguous, infer") replaced by the real stride, the byte
extent the tensor spans, and the progress hint. Readers build it once per distinct header and
reuse it; writers build it once per distinct array shape and reuse its pre-packed header bytes.

Rules enforced (each failure is a :class:`TensorLayoutError` with a stable reason):

* ``ndims`` in ``1..MAX_DIMS``; entries ``i >= ndims`` are written as zero and ignored on read.
* ``dtype``/``major_order``/``progress_unit`` must be known values; ``UNKNOWN`` is rejected (§15.8).
* dims and strides must be non-negative (v1.1 has no negative strides).
* Stride ``0`` means contiguous: the innermost dimension (last for ROW, first for COLUMN) gets the
  element size, each outer one the next-inner stride times that dimension (at least 1).
* Explicit strides must be consistent with ``major_order`` and non-overlapping: for ROW,
  ``strides[i] >= strides[i+1] * max(dims[i+1], 1)`` and ``strides[-1] >= itemsize``; mirrored for
  COLUMN. This is the same rule the reference implementations apply.
* ``progress_unit != NONE`` needs ``progress_stride_bytes > 0`` equal to the true row stride
  (``strides[0]``, ROWS) or column stride (``strides[1]``, COLUMNS; needs ``ndims >= 2``).
* ``values_len_bytes`` must cover the extent ``sum((dims[i]-1)*strides[i]) + itemsize`` (0 for an
  empty tensor) and fit the pool stride; that part is checked per frame by the slot reader.

dtype decisions: ``BOOLEAN`` → ``numpy.bool_`` (one byte per element); ``BYTES`` → ``uint8``;
``BIT`` → ``uint8`` as well: both reference implementations size BIT elements as one byte and the
spec defines no bit order, so the view exposes the raw packed bytes and ``layout.dtype`` tells the
caller they are bits (``numpy.unpackbits`` is the caller's choice). Only little-endian (or
single-byte) numpy dtypes are accepted from arrays: the wire is little-endian (§6).
"""

from __future__ import annotations

from typing import Final

import numpy as np

from tensorpool.counters import Reason
from tensorpool.shm.errors import TensorLayoutError
from tensorpool.shm.layout import (
    EMBEDDED_HEADER_LENGTH,
    MAX_DIMS,
    TENSOR_BLOB,
    TENSOR_BLOB_READ,
    TENSOR_BLOCK_LENGTH,
    TENSOR_SCHEMA_ID,
    TENSOR_SCHEMA_VERSION,
    TENSOR_TEMPLATE_ID,
    Dtype,
    MajorOrder,
    ProgressUnit,
)

_INT32_MAX: Final = 2**31 - 1

#: Wire dtype → numpy dtype used for views (§15.8). UNKNOWN is deliberately absent.
WIRE_TO_NUMPY: Final[dict[int, np.dtype]] = {
    Dtype.UINT8: np.dtype("u1"),
    Dtype.INT8: np.dtype("i1"),
    Dtype.UINT16: np.dtype("<u2"),
    Dtype.INT16: np.dtype("<i2"),
    Dtype.UINT32: np.dtype("<u4"),
    Dtype.INT32: np.dtype("<i4"),
    Dtype.UINT64: np.dtype("<u8"),
    Dtype.INT64: np.dtype("<i8"),
    Dtype.FLOAT32: np.dtype("<f4"),
    Dtype.FLOAT64: np.dtype("<f8"),
    Dtype.BOOLEAN: np.dtype("?"),
    Dtype.BYTES: np.dtype("u1"),
    Dtype.BIT: np.dtype("u1"),
}

#: numpy dtype → wire dtype for arrays handed to a writer. uint8 maps to UINT8; pass
#: ``wire_dtype=Dtype.BYTES`` (or BIT) explicitly to label opaque bytes.
NUMPY_TO_WIRE: Final[dict[np.dtype, Dtype]] = {
    np.dtype("u1"): Dtype.UINT8,
    np.dtype("i1"): Dtype.INT8,
    np.dtype("<u2"): Dtype.UINT16,
    np.dtype("<i2"): Dtype.INT16,
    np.dtype("<u4"): Dtype.UINT32,
    np.dtype("<i4"): Dtype.INT32,
    np.dtype("<u8"): Dtype.UINT64,
    np.dtype("<i8"): Dtype.INT64,
    np.dtype("<f4"): Dtype.FLOAT32,
    np.dtype("<f8"): Dtype.FLOAT64,
    np.dtype("?"): Dtype.BOOLEAN,
}

_MAJOR_ORDERS: Final = frozenset({int(MajorOrder.ROW), int(MajorOrder.COLUMN)})
_PROGRESS_UNITS: Final = frozenset(int(u) for u in ProgressUnit if u.name != "NULL_VALUE")
# Plain dict lookups instead of IntEnum calls: a first-sight header is validated per frame when
# shapes vary, so the ~1 µs of each ``Enum(value)`` call matters.
_DTYPE_MEMBER: Final = {int(m): m for m in Dtype}
_MAJOR_MEMBER: Final = {int(m): m for m in MajorOrder}
_UNIT_MEMBER: Final = {int(m): m for m in ProgressUnit}
_ROW: Final = int(MajorOrder.ROW)
_UNIT_NONE: Final = int(ProgressUnit.NONE)
_UNIT_ROWS: Final = int(ProgressUnit.ROWS)


def _resolve(
    dims: tuple[int, ...], strides: tuple[int, ...], itemsize: int, major_order: int
) -> tuple[tuple[int, ...], int]:
    """Check dims/strides, fill ``0`` strides, check the major-order chain; return the resolved
    strides and the byte extent. One pass, because a first-sight header is validated per frame
    when shapes vary."""
    n = len(dims)
    out = list(strides)
    required = itemsize
    extent = itemsize
    empty = False
    for i in range(n - 1, -1, -1) if major_order == _ROW else range(n):
        d = dims[i]
        s = out[i]
        if d <= 0 or d > _INT32_MAX:
            if d < 0 or d > _INT32_MAX:
                raise TensorLayoutError(Reason.DIMS_NEGATIVE, f"dims={dims} (int32, >= 0)")
            empty = True
        if s == 0:
            out[i] = s = required
            if s > _INT32_MAX:
                raise TensorLayoutError(Reason.STRIDES_INCONSISTENT, "stride exceeds int32")
        elif s < required:
            if s < 0:
                raise TensorLayoutError(Reason.STRIDES_NEGATIVE, f"strides={strides}")
            raise TensorLayoutError(
                Reason.STRIDES_INCONSISTENT,
                f"stride[{i}]={s} < {required} for {MajorOrder(major_order).name} order",
            )
        elif s > _INT32_MAX:
            raise TensorLayoutError(Reason.STRIDES_INCONSISTENT, "stride exceeds int32")
        if d > 1:
            required = s * d
            extent += (d - 1) * s
        else:
            required = s
    return tuple(out), 0 if empty else extent


class TensorLayout:
    """Validated tensor description shared by all frames with the same header bytes.

    Immutable by convention (``__slots__``, no setters). ``blob`` is the packed slot bytes
    [60, 256) — headerBytes length, embedded message header, TensorHeader block, zero pad — so a
    writer can emit the whole embedded header with one slice assignment.
    """

    __slots__ = (
        "_blob",
        "dims",
        "dtype",
        "extent_bytes",
        "itemsize",
        "major_order",
        "ndims",
        "np_dtype",
        "progress_stride_bytes",
        "progress_unit",
        "strides",
    )

    dtype: Dtype
    major_order: MajorOrder
    ndims: int
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    progress_unit: ProgressUnit
    progress_stride_bytes: int
    np_dtype: np.dtype
    itemsize: int
    extent_bytes: int

    def __init__(
        self,
        dtype: int,
        major_order: int,
        dims: tuple[int, ...] | list[int],
        strides: tuple[int, ...] | list[int] | None = None,
        progress_unit: int = ProgressUnit.NONE,
        progress_stride_bytes: int = 0,
    ) -> None:
        if type(dims) is not tuple:
            dims = tuple(map(int, dims))
        ndims = len(dims)
        if not 1 <= ndims <= MAX_DIMS:
            raise TensorLayoutError(Reason.NDIMS_OUT_OF_RANGE, f"ndims={ndims}")
        np_dtype = WIRE_TO_NUMPY.get(dtype)
        if np_dtype is None:
            raise TensorLayoutError(Reason.DTYPE_UNKNOWN, f"dtype={dtype}")
        if major_order not in _MAJOR_ORDERS:
            raise TensorLayoutError(Reason.MAJOR_ORDER_UNKNOWN, f"major_order={major_order}")
        if progress_unit not in _PROGRESS_UNITS:
            raise TensorLayoutError(Reason.PROGRESS_UNIT_UNKNOWN, f"progress_unit={progress_unit}")
        if strides is None:
            strides = (0,) * ndims
        elif type(strides) is not tuple:
            strides = tuple(map(int, strides))
        if len(strides) != ndims:
            raise TensorLayoutError(Reason.STRIDES_INCONSISTENT, "len(strides) != ndims")
        itemsize = np_dtype.itemsize
        resolved, extent = _resolve(dims, strides, itemsize, major_order)
        if progress_unit != _UNIT_NONE:
            axis = 0 if progress_unit == _UNIT_ROWS else 1
            if (
                progress_stride_bytes <= 0
                or axis >= ndims
                or progress_stride_bytes != resolved[axis]
            ):
                raise TensorLayoutError(
                    Reason.PROGRESS_STRIDE_INVALID,
                    f"{ProgressUnit(progress_unit).name} progress_stride_bytes="
                    f"{progress_stride_bytes}, layout strides {resolved}",
                )
        self.dtype = _DTYPE_MEMBER[dtype]
        self.major_order = _MAJOR_MEMBER[major_order]
        self.ndims = ndims
        self.dims = dims
        self.strides = resolved
        self.progress_unit = _UNIT_MEMBER[progress_unit]
        self.progress_stride_bytes = progress_stride_bytes
        self.np_dtype = np_dtype
        self.itemsize = itemsize
        self.extent_bytes = extent
        self._blob: bytes | None = None

    @property
    def blob(self) -> bytes:
        """Slot bytes [60, 256) for this layout, packed on first use (writers only need it)."""
        blob = self._blob
        if blob is None:
            pad = (0,) * (MAX_DIMS - self.ndims)
            blob = self._blob = TENSOR_BLOB.pack(
                EMBEDDED_HEADER_LENGTH,
                TENSOR_BLOCK_LENGTH,
                TENSOR_TEMPLATE_ID,
                TENSOR_SCHEMA_ID,
                TENSOR_SCHEMA_VERSION,
                int(self.dtype),
                int(self.major_order),
                self.ndims,
                0,  # pad_align
                int(self.progress_unit),
                self.progress_stride_bytes,
                *self.dims,
                *pad,
                *self.strides,
                *pad,
            )
        return blob

    # --- constructors ----------------------------------------------------------------------------
    @classmethod
    def contiguous(
        cls,
        shape: tuple[int, ...] | list[int],
        dtype: np.dtype | type | str,
        *,
        order: str = "C",
        wire_dtype: int | None = None,
    ) -> TensorLayout:
        """Layout of a dense C-order (ROW) or F-order (COLUMN) array."""
        wd = _wire_dtype(np.dtype(dtype), wire_dtype)
        major = MajorOrder.ROW if order == "C" else MajorOrder.COLUMN
        return cls(wd, major, tuple(shape) or (1,))

    @classmethod
    def from_array(cls, array: np.ndarray, *, wire_dtype: int | None = None) -> TensorLayout:
        """Describe ``array`` exactly as it lies in memory (for claim/commit producers).

        C-contiguous → ROW, F-contiguous → COLUMN; otherwise positive, non-overlapping strides
        consistent with ROW (tried first) or COLUMN order. A 0-d array is described as shape (1,).
        Strides of length-1 axes carry no information in numpy, so they are normalised.
        """
        wd = _wire_dtype(array.dtype, wire_dtype)
        shape = array.shape or (1,)
        if len(shape) > MAX_DIMS:
            raise TensorLayoutError(Reason.NDIMS_OUT_OF_RANGE, f"ndim={array.ndim}")
        if array.flags.c_contiguous:
            return cls(wd, MajorOrder.ROW, shape)
        if array.flags.f_contiguous:
            return cls(wd, MajorOrder.COLUMN, shape)
        strides = array.strides
        if any(s < 0 for s in strides):
            raise TensorLayoutError(Reason.STRIDES_NEGATIVE, f"strides={strides}")
        if any(s == 0 and d > 1 for d, s in zip(shape, strides, strict=True)):
            # numpy broadcasting: elements overlap, and a 0 on the wire would mean "contiguous".
            raise TensorLayoutError(Reason.STRIDES_INCONSISTENT, f"zero stride in {strides}")
        # Zero out strides of length-1 axes so resolution fills a consistent value.
        norm = tuple(0 if d == 1 else s for d, s in zip(shape, strides, strict=True))
        try:
            return cls(wd, MajorOrder.ROW, shape, norm)
        except TensorLayoutError as row_err:
            try:
                return cls(wd, MajorOrder.COLUMN, shape, norm)
            except TensorLayoutError:
                raise row_err from None

    @classmethod
    def from_blob_fields(cls, fields: tuple[int, ...]) -> TensorLayout:
        """Validate the unpacked ``TENSOR_BLOB_READ`` fields of a slot (§8.3 step 5)."""
        (hdr_len, block_len, template_id, schema_id, version) = fields[:5]
        if hdr_len != EMBEDDED_HEADER_LENGTH:
            raise TensorLayoutError(Reason.HEADER_BYTES_LENGTH_INVALID, f"length={hdr_len}")
        if block_len != TENSOR_BLOCK_LENGTH:
            raise TensorLayoutError(Reason.EMBEDDED_BLOCK_LENGTH_INVALID, f"{block_len}")
        if template_id != TENSOR_TEMPLATE_ID:
            raise TensorLayoutError(Reason.EMBEDDED_TEMPLATE_ID_INVALID, f"{template_id}")
        if schema_id != TENSOR_SCHEMA_ID:
            raise TensorLayoutError(Reason.EMBEDDED_SCHEMA_ID_INVALID, f"{schema_id}")
        if version != TENSOR_SCHEMA_VERSION:
            raise TensorLayoutError(Reason.EMBEDDED_VERSION_INVALID, f"{version}")
        dtype, major, ndims, _pad_align, unit, progress_stride = fields[5:11]
        if not 1 <= ndims <= MAX_DIMS:
            raise TensorLayoutError(Reason.NDIMS_OUT_OF_RANGE, f"ndims={ndims}")
        dims = fields[11 : 11 + ndims]
        strides = fields[11 + MAX_DIMS : 11 + MAX_DIMS + ndims]
        return cls(dtype, major, dims, strides, unit, progress_stride)

    @classmethod
    def from_blob(cls, blob: bytes) -> TensorLayout:
        return cls.from_blob_fields(TENSOR_BLOB_READ.unpack_from(blob, 0))

    # --- use ---------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self.dims

    def view(self, buffer: object, offset: int) -> np.ndarray:
        """Zero-copy ndarray over ``buffer`` at ``offset`` (bounds are checked by numpy)."""
        return np.ndarray(self.dims, self.np_dtype, buffer, offset, self.strides)  # type: ignore[call-overload]

    def key(self) -> tuple[object, ...]:
        return (self.dtype, self.major_order, self.dims, self.strides, self.progress_unit)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TensorLayout) and self.blob == other.blob

    def __hash__(self) -> int:
        return hash(self.blob)

    def __repr__(self) -> str:
        return (
            f"TensorLayout({self.dtype.name}, {self.major_order.name}, dims={self.dims}, "
            f"strides={self.strides}, progress={self.progress_unit.name}"
            f"/{self.progress_stride_bytes})"
        )


def _wire_dtype(np_dtype: np.dtype, override: int | None) -> int:
    if override is not None:
        want = WIRE_TO_NUMPY.get(override)
        if want is None:
            raise TensorLayoutError(Reason.DTYPE_UNKNOWN, f"wire dtype {override}")
        if want.itemsize != np_dtype.itemsize or np_dtype.byteorder == ">":
            raise TensorLayoutError(
                Reason.DTYPE_UNKNOWN, f"{np_dtype} cannot be sent as {Dtype(override).name}"
            )
        return int(override)
    wd = NUMPY_TO_WIRE.get(np_dtype)
    if wd is None:
        raise TensorLayoutError(
            Reason.DTYPE_UNKNOWN,
            f"numpy dtype {np_dtype.str} has no v1.1 wire dtype (little-endian numeric or bool)",
        )
    return int(wd)
