"""Rows of the ``tensorpool`` format back into numpy arrays, copying at most once.

A row carries the tensor as ``payload`` (the slot's bytes), ``dtype`` (the wire dtype's name:
``float32``, ``uint8``, ``boolean``, ``bytes``, ...), ``shape`` and ``strides`` (bytes, already
resolved -- never 0). :func:`to_numpy` makes a zero-copy view over the payload; for a pandas or
Arrow column, :func:`column_to_numpy` gives one view per row and :func:`stack` one
``(n, *shape)`` array -- zero-copy for an Arrow column of equal-sized frames, one copy for a
pandas column (its ``bytes`` objects are separate allocations). Views over ``bytes`` are
read-only; pass ``copy=True`` when you need to write.

No pyspark import here: the helpers also serve plain Arrow / pandas consumers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np

#: ``dtype`` column value -> numpy dtype (little-endian, as on the wire).
NUMPY_DTYPES: Final[dict[str, np.dtype]] = {
    "uint8": np.dtype("u1"),
    "int8": np.dtype("i1"),
    "uint16": np.dtype("<u2"),
    "int16": np.dtype("<i2"),
    "uint32": np.dtype("<u4"),
    "int32": np.dtype("<i4"),
    "uint64": np.dtype("<u8"),
    "int64": np.dtype("<i8"),
    "float32": np.dtype("<f4"),
    "float64": np.dtype("<f8"),
    "boolean": np.dtype("?"),
    "bytes": np.dtype("u1"),
    "bit": np.dtype("u1"),
}


#: ``dtype`` column value -> wire ``Dtype`` value (Wire Spec §15.8).
WIRE_DTYPES: Final[dict[str, int]] = {
    "uint8": 1,
    "int8": 2,
    "uint16": 3,
    "int16": 4,
    "uint32": 5,
    "int32": 6,
    "uint64": 7,
    "int64": 8,
    "float32": 9,
    "float64": 10,
    "boolean": 11,
    "bytes": 13,
    "bit": 14,
}


def numpy_dtype(name: str) -> np.dtype:
    try:
        return NUMPY_DTYPES[name]
    except KeyError:
        raise ValueError(
            f"unknown tensorpool dtype {name!r}; known: {sorted(NUMPY_DTYPES)}"
        ) from None


def _field(row: Any, name: str) -> Any:
    if isinstance(row, Mapping):
        return row.get(name)
    try:
        return row[name]
    except (KeyError, ValueError, IndexError, TypeError):
        return getattr(row, name, None)


def view(
    payload: bytes | bytearray | memoryview | np.ndarray,
    dtype: str | np.dtype,
    shape: Sequence[int],
    strides: Sequence[int] | None = None,
    *,
    copy: bool = False,
) -> np.ndarray:
    """The tensor inside ``payload`` (zero-copy unless ``copy``); bounds are checked."""
    dt = numpy_dtype(dtype) if isinstance(dtype, str) else np.dtype(dtype)
    shp = tuple(int(d) for d in shape)
    st = None if strides is None else tuple(int(s) for s in strides)
    try:
        arr = np.ndarray(shp, dt, buffer=payload, strides=st)
    except TypeError as exc:  # numpy's "buffer is too small" / bad strides
        raise ValueError(
            f"payload of {memoryview(payload).nbytes} bytes cannot hold a {dt} tensor of "
            f"shape {shp} strides {st}: {exc}"
        ) from None
    return arr.copy() if copy else arr


#: Spark keeps a field's metadata in Arrow field metadata under this key (``toArrow``, UDFs)
_SPARK_ARROW_METADATA: Final = b"SPARK::metadata::json"


def tensor_layout(obj: Any) -> tuple[str, tuple[int, ...]] | None:
    """``(dtype, shape)`` from the ``payload`` field metadata (#16.6), or None.

    ``obj``: a Spark DataFrame or ``StructType`` / ``StructField`` (``df.schema``), a pyarrow
    Table, RecordBatch, Schema or Field (``df.toArrow()``), or the metadata dict itself. The
    tensorpool source puts it there when every frame of the read streams had one layout at
    ``load()`` (see :mod:`tensorpool.spark_source.rings.layout_hint`).
    """
    import json

    meta: Any = None
    schema = getattr(obj, "schema", obj)  # DataFrame / Table / RecordBatch -> their schema
    if isinstance(schema, Mapping):
        meta = schema
    elif hasattr(schema, "get_field_index"):  # pyarrow.Schema
        i = schema.get_field_index("payload")
        raw = (schema.field(i).metadata or {}) if i >= 0 else {}
        meta = json.loads(raw[_SPARK_ARROW_METADATA]) if _SPARK_ARROW_METADATA in raw else None
    elif hasattr(schema, "fieldNames"):  # pyspark StructType
        meta = schema["payload"].metadata if "payload" in schema.fieldNames() else None
    elif hasattr(schema, "metadata"):  # a StructField / pyarrow Field
        meta = schema.metadata
        if isinstance(meta, Mapping) and _SPARK_ARROW_METADATA in meta:
            meta = json.loads(meta[_SPARK_ARROW_METADATA])
    if not isinstance(meta, Mapping) or "dtype" not in meta or "shape" not in meta:
        return None
    return str(meta["dtype"]), tuple(int(d) for d in meta["shape"])


def _layout_of(source: Any, dtype: Any, shape: Any) -> tuple[Any, Any]:
    """``dtype``/``shape`` as given, else from ``source``'s payload metadata (#16.6)."""
    if dtype is not None and shape is not None:
        return dtype, shape
    layout = tensor_layout(source) if source is not None else None
    if layout is None:
        raise ValueError(
            "dtype and shape are needed: select the dtype and shape columns "
            "(includeTensorMetadata=true), pass them, or read streams with one fixed layout "
            "(then df.schema['payload'].metadata has them)"
        )
    return (layout[0] if dtype is None else dtype), (layout[1] if shape is None else shape)


def to_numpy(row: Any, *, copy: bool = False, schema: Any = None) -> np.ndarray:
    """A Spark ``Row`` (or dict) of the tensorpool schema -> numpy array.

    A row without ``dtype``/``shape`` columns takes them from ``schema`` (a DataFrame or its
    ``schema``: the ``payload`` field metadata, #16.6); then the frame is C-contiguous.
    """
    payload = _field(row, "payload")
    if payload is None:
        raise ValueError("the row needs its payload column")
    dtype, shape = _field(row, "dtype"), _field(row, "shape")
    strides = _field(row, "strides") if dtype is not None and shape is not None else None
    dtype, shape = _layout_of(schema, dtype, shape)
    return view(payload, dtype, shape, strides, copy=copy)


def _arrow_binary(col: Any) -> Any:
    """``col`` as a single pyarrow BinaryArray, or None if it is not an Arrow binary column."""
    mod = type(col).__module__
    if not mod.startswith("pyarrow"):
        return None
    import pyarrow as pa

    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    return col if isinstance(col, pa.BinaryArray) else None


def _binary_parts(arr: Any) -> tuple[memoryview, np.ndarray]:
    """(data buffer, offsets) of a BinaryArray, honouring a sliced array's offset."""
    bufs = arr.buffers()
    offs = np.frombuffer(bufs[1], np.int32)[arr.offset : arr.offset + len(arr) + 1]
    data = memoryview(bufs[2]) if bufs[2] is not None else memoryview(b"")
    return data, offs


def _as_list(col: Any) -> list[Any]:
    if col is None:
        return []
    if hasattr(col, "to_pylist"):
        return col.to_pylist()
    if hasattr(col, "tolist"):
        return col.tolist()
    return list(col)


def column_to_numpy(
    payload: Any,
    dtype: Any,
    shape: Any,
    strides: Any = None,
) -> list[np.ndarray]:
    """One zero-copy view per row of pandas Series / Arrow arrays / lists.

    ``dtype``/``shape``/``strides`` may be columns or single values shared by every row.
    """
    arrow = _arrow_binary(payload)
    if arrow is not None:
        data, offs = _binary_parts(arrow)
        payloads: list[Any] = [data[offs[i] : offs[i + 1]] for i in range(len(arrow))]
    else:
        payloads = _as_list(payload)
    n = len(payloads)

    def per_row(col: Any) -> list[Any]:
        if col is None or isinstance(col, (str, np.dtype)):
            return [col] * n
        if isinstance(col, tuple):
            return [col] * n
        vals = _as_list(col)
        if len(vals) == n and (n == 0 or not isinstance(vals[0], int | np.integer)):
            return vals
        return [tuple(vals)] * n  # a single shape given as a list

    dts, shapes, strs = per_row(dtype), per_row(shape), per_row(strides)
    return [view(payloads[i], dts[i], shapes[i], strs[i]) for i in range(n)]


def _payload_column(source: Any) -> Any:
    """The ``payload`` column of a Spark DataFrame (via ``toArrow``) or an Arrow table/batch."""
    if hasattr(source, "toArrow") and hasattr(source, "schema"):  # pyspark DataFrame
        source = source.select("payload").toArrow()
    if hasattr(source, "column") and hasattr(source, "schema") and hasattr(source, "num_rows"):
        return source.column("payload")
    return source


def stack(
    payload: Any, dtype: str | np.dtype | None = None, shape: Sequence[int] | None = None
) -> np.ndarray:
    """``(n, *shape)`` array of equal, C-contiguous frames.

    ``payload``: a column (pyarrow, pandas, list of bytes), or a Spark DataFrame / Arrow table
    with a ``payload`` column; without ``dtype``/``shape`` they come from its ``payload`` field
    metadata (#16.6). Zero-copy for a pyarrow ``BinaryArray`` whose frames are back to back;
    otherwise one copy (a pandas column of ``bytes`` is joined once).
    """
    dtype, shape = _layout_of(payload, dtype, shape)
    payload = _payload_column(payload)
    dt = numpy_dtype(dtype) if isinstance(dtype, str) else np.dtype(dtype)
    shp = tuple(int(d) for d in shape)
    frame = int(np.prod(shp, dtype=np.int64)) * dt.itemsize
    arrow = _arrow_binary(payload)
    if arrow is not None:
        n = len(arrow)
        data, offs = _binary_parts(arrow)
        if n and np.all(np.diff(offs) == frame):
            flat = np.frombuffer(data, np.uint8, n * frame, int(offs[0]))
            return flat.view(dt).reshape((n, *shp))
        items: list[Any] = arrow.to_pylist()
    else:
        items = _as_list(payload)
    for i, b in enumerate(items):
        if len(b) != frame:
            raise ValueError(f"row {i}: payload has {len(b)} bytes, shape {shp} needs {frame}")
    joined = b"".join(items)
    return np.frombuffer(joined, dt).reshape((len(items), *shp))


__all__ = [
    "NUMPY_DTYPES",
    "WIRE_DTYPES",
    "column_to_numpy",
    "numpy_dtype",
    "stack",
    "tensor_layout",
    "to_numpy",
    "view",
]
