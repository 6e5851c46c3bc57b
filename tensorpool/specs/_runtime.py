"""Support code shared by the generated codecs (``tensorpool.specs.generated.*``).

The generator inlines the hot paths (header check, fixed block, root var data) into
each message class. What lives here is the cold or generic part: building error
objects, converting var data, and walking / writing repeating groups, whose
shape is described by small :class:`GroupSpec` tables emitted next to each
message. Keeping this logic in one hand-written place keeps the generated files
short and makes the bounds checks reviewable once.

Bounds model: a decoder's ``wrap`` walks every group and var-data length once,
checks each against the buffer end and the composite's ``maxValue``, and stores the
positions. Property reads afterwards only touch bytes inside the checked extent, so
fields, groups and var data may be read in any order.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Buffer, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from tensorpool.specs.errors import (
    BlockLengthTooSmall,
    BufferTooSmall,
    CodecError,
    GroupOverflow,
    NonAscii,
    SchemaIdMismatch,
    TemplateIdMismatch,
    TruncatedBuffer,
    UnknownEnumValue,
    UnsupportedVersion,
    ValueOutOfRange,
    VarDataOverflow,
)

HEADER = struct.Struct("<HHHH")
"""The standard 8-byte SBE message header (blockLength, templateId, schemaId, version)."""


class FieldSpec(NamedTuple):
    """How to normalise one fixed group field before packing it."""

    name: str
    null_value: int | None  # set for optional fields: None on input maps to this
    enum_values: frozenset[int] | None  # set for enum fields: allowed raw values
    array_length: int  # 0 for scalars
    bytes_array: bool  # uint8/char arrays travel as bytes


class DataSpec(NamedTuple):
    """One var-data member: length prefix codec, declared maximum, text or bytes."""

    name: str
    length_struct: struct.Struct
    max_length: int
    text: bool


class GroupSpec(NamedTuple):
    """One repeating group: dimension codec, entry block and what follows each entry."""

    name: str
    dim_struct: struct.Struct
    max_count: int
    block_length: int
    block_struct: struct.Struct
    fields: tuple[FieldSpec, ...]
    groups: tuple[GroupSpec, ...]
    data: tuple[DataSpec, ...]
    min_entry_size: int  # block + every nested prefix: bounds the walk by buffer size


# Records produced by the decode walk:
#   data record  = (position of first byte, length)
#   entry record = (entry block position, tuple of group records, tuple of data records)
#   group record = tuple of entry records
DataRecord = tuple[int, int]
EntryRecord = tuple[int, tuple[Any, ...], tuple[DataRecord, ...]]


BYTE_TYPES = frozenset({bytes, bytearray, mmap.mmap})
"""Buffer types whose ``len`` and slices count bytes; anything else goes via byte_view."""


def byte_view(buf: Buffer) -> tuple[Buffer, int]:
    """A 1-D byte view of ``buf`` and its size, so slicing var data counts bytes.

    A ``memoryview`` with a wider format (``cast("I")``) or a numpy array would
    otherwise slice by items. Plain byte memoryviews are returned as they are.
    """
    if type(buf) is memoryview and buf.itemsize == 1 and buf.ndim == 1:
        return buf, buf.nbytes
    mv = memoryview(buf)
    if mv.itemsize != 1 or mv.ndim != 1:
        mv = mv.cast("B")
    return mv, mv.nbytes


def buffer_length(buf: Buffer) -> int:
    """Length in bytes; a memoryview's ``len`` counts items, not bytes."""
    if type(buf) is memoryview:
        return buf.nbytes
    return len(buf)  # type: ignore[arg-type]


# ---------------------------------------------------------------- header checks


def header_error(
    name: str,
    schema_id: int,
    template_id: int,
    version: int,
    block_length: int,
    offset: int,
    want_schema_id: int,
    want_template_id: int,
    want_version: int,
    want_block_length: int,
) -> CodecError:
    """Build the most specific error for a header that failed the inline check."""
    if offset < 0:
        return TruncatedBuffer(f"{name}: negative offset {offset}")
    if schema_id != want_schema_id:
        return SchemaIdMismatch(f"{name}: schemaId {schema_id}, expected {want_schema_id}")
    if template_id != want_template_id:
        return TemplateIdMismatch(f"{name}: templateId {template_id}, expected {want_template_id}")
    if version > want_version:
        return UnsupportedVersion(
            f"{name}: schema version {version} is newer than supported {want_version}"
        )
    return BlockLengthTooSmall(f"{name}: blockLength {block_length} < {want_block_length}")


def wrap_error(
    name: str,
    buf: Buffer,
    offset: int,
    want_schema_id: int,
    want_template_id: int,
    want_version: int,
    want_block_length: int,
) -> CodecError:
    """The precise error for a ``wrap`` whose one-shot header/block unpack failed or
    whose header did not match (cold path: re-reads the header on its own)."""
    have = buffer_length(buf)
    if offset < 0:
        return TruncatedBuffer(f"{name}: negative offset {offset}")
    if offset + 8 > have:
        return truncated(name, offset + 8, have)
    block_length, template_id, schema_id, version = HEADER.unpack_from(buf, offset)
    if (
        schema_id != want_schema_id
        or template_id != want_template_id
        or version > want_version
        or block_length < want_block_length
    ):
        return header_error(
            name,
            schema_id,
            template_id,
            version,
            block_length,
            offset,
            want_schema_id,
            want_template_id,
            want_version,
            want_block_length,
        )
    return truncated(name, offset + 8 + block_length, have)


def body_error(
    name: str,
    offset: int,
    block_length: int,
    version: int,
    want_version: int,
    want_block_length: int,
) -> CodecError:
    """Error for ``wrap_body`` arguments that cannot describe a valid body."""
    if offset < 0:
        return TruncatedBuffer(f"{name}: negative offset {offset}")
    if version > want_version:
        return UnsupportedVersion(
            f"{name}: schema version {version} is newer than supported {want_version}"
        )
    return BlockLengthTooSmall(f"{name}: blockLength {block_length} < {want_block_length}")


def truncated(name: str, need: int, have: int) -> TruncatedBuffer:
    return TruncatedBuffer(f"{name}: needs {need} bytes, buffer has {have}")


def unknown_enum(enum_name: str, field: str, raw: int) -> UnknownEnumValue:
    return UnknownEnumValue(f"{field}: {raw} is not a {enum_name} value")


def pack_error(name: str, buf: Buffer, offset: int, size: int, exc: Exception) -> CodecError:
    """Classify a ``struct.error`` from an encoder: short buffer or bad value."""
    have = buffer_length(buf)
    if offset < 0 or offset + size > have:
        return BufferTooSmall(f"{name}: needs {size} bytes at offset {offset}, buffer has {have}")
    return ValueOutOfRange(f"{name}: {exc}")


# ---------------------------------------------------------------- encoder values


def require(name: str) -> ValueOutOfRange:
    return ValueOutOfRange(f"{name} is required")


def check_enum(values: frozenset[int], enum_name: str, field: str, value: Any) -> None:
    if value not in values:
        raise UnknownEnumValue(f"{field}: {value!r} is not a {enum_name} value")


def int_array(value: Sequence[int] | None, length: int, name: str) -> Sequence[int]:
    """Accept a shorter sequence and zero-fill it (the spec wants unused dims zeroed)."""
    if value is None:
        return (0,) * length
    n = len(value)
    if n > length:
        raise ValueOutOfRange(f"{name}: {n} values, at most {length}")
    if n == length:
        return value
    return tuple(value) + (0,) * (length - n)


def byte_array(value: Any, length: int, name: str) -> bytes:
    """uint8 arrays travel as bytes; ``struct``'s ``s`` format zero-fills short input."""
    if value is None:
        return b""
    if not isinstance(value, bytes):
        try:
            value = bytes(value)
        except (TypeError, ValueError) as exc:
            raise ValueOutOfRange(f"{name}: {exc}") from None
    if len(value) > length:
        raise ValueOutOfRange(f"{name}: {len(value)} bytes, at most {length}")
    return value


def text_bytes(value: Any, name: str, max_length: int) -> bytes:
    """varAscii input: str (or ASCII bytes); None and "" both encode as length 0."""
    if value is None:
        return b""
    if isinstance(value, str):
        try:
            data = value.encode("ascii")
        except UnicodeEncodeError:
            raise NonAscii(f"{name}: non-ASCII text") from None
    elif isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        if not data.isascii():
            raise NonAscii(f"{name}: non-ASCII bytes")
    else:
        raise ValueOutOfRange(f"{name}: expected str, got {type(value).__name__}")
    if len(data) > max_length:
        raise VarDataOverflow(f"{name}: {len(data)} bytes exceeds maximum {max_length}")
    return data


def data_bytes(value: Any, name: str, max_length: int) -> Buffer:
    """varData input: any byte buffer, passed through without a copy where possible."""
    if value is None:
        return b""
    if isinstance(value, (bytes, bytearray)):
        data: Any = value
    elif isinstance(value, memoryview):
        data = value if value.format == "B" and value.ndim == 1 else value.cast("B")
    elif isinstance(value, str):
        raise ValueOutOfRange(f"{name}: expected bytes, got str")
    else:
        try:
            data = memoryview(value).cast("B")
        except TypeError:
            raise ValueOutOfRange(f"{name}: expected bytes, got {type(value).__name__}") from None
    if len(data) > max_length:
        raise VarDataOverflow(f"{name}: {len(data)} bytes exceeds maximum {max_length}")
    return data


def var_length(value: Any) -> int:
    """Encoded size of a var-data value, for ``encoded_length`` (no conversion)."""
    if value is None:
        return 0
    if isinstance(value, memoryview):
        return value.nbytes
    return len(value)


# ---------------------------------------------------------------- decoder values


def non_ascii(name: str) -> NonAscii:
    return NonAscii(f"{name}: non-ASCII bytes")


def read_text(buf: Buffer, pos: int, length: int, name: str) -> str:
    if not length:
        return ""
    try:
        return str(buf[pos : pos + length], "ascii")  # type: ignore[index]
    except UnicodeDecodeError:
        raise NonAscii(f"{name}: non-ASCII bytes") from None


def read_bytes(buf: Buffer, pos: int, length: int) -> bytes:
    if not length:
        return b""
    return bytes(buf[pos : pos + length])  # type: ignore[index]


# ---------------------------------------------------------------- decode walk


def walk_data(
    buf: Buffer, pos: int, end: int, specs: tuple[DataSpec, ...], owner: str
) -> tuple[int, tuple[DataRecord, ...]]:
    """Check and locate consecutive var-data fields starting at ``pos``."""
    out = []
    for spec in specs:
        size = spec.length_struct.size
        if pos + size > end:
            raise VarDataOverflow(f"{owner}.{spec.name}: length prefix past end of buffer")
        (length,) = spec.length_struct.unpack_from(buf, pos)
        pos += size
        if length > spec.max_length:
            raise VarDataOverflow(
                f"{owner}.{spec.name}: length {length} exceeds maximum {spec.max_length}"
            )
        if pos + length > end:
            raise VarDataOverflow(f"{owner}.{spec.name}: length {length} runs past end of buffer")
        out.append((pos, length))
        pos += length
    return pos, tuple(out)


def walk_groups(
    buf: Buffer, pos: int, end: int, specs: tuple[GroupSpec, ...], owner: str
) -> tuple[int, tuple[tuple[EntryRecord, ...], ...]]:
    """Check and locate consecutive repeating groups (recursively) starting at ``pos``."""
    records = []
    for spec in specs:
        where = f"{owner}.{spec.name}"
        dim_size = spec.dim_struct.size
        if pos + dim_size > end:
            raise GroupOverflow(f"{where}: group dimension past end of buffer")
        block_length, count = spec.dim_struct.unpack_from(buf, pos)
        pos += dim_size
        if block_length < spec.block_length:
            raise BlockLengthTooSmall(
                f"{where}: entry blockLength {block_length} < {spec.block_length}"
            )
        # Cheap upper bound first, so a forged count cannot make us loop long.
        min_size = block_length + spec.min_entry_size - spec.block_length
        if pos + count * min_size > end:
            raise GroupOverflow(f"{where}: {count} entries cannot fit in the buffer")
        entries = []
        for _ in range(count):
            if pos + block_length > end:
                raise GroupOverflow(f"{where}: entry past end of buffer")
            entry_pos = pos
            pos += block_length
            if spec.groups:
                pos, nested = walk_groups(buf, pos, end, spec.groups, where)
            else:
                nested = ()
            if spec.data:
                pos, data = walk_data(buf, pos, end, spec.data, where)
            else:
                data = ()
            entries.append((entry_pos, nested, data))
        records.append(tuple(entries))
    return pos, tuple(records)


class GroupView(Sequence[Any]):
    """Read-only sequence over the entries of one decoded group.

    Entries are fresh flyweights, so holding on to several (``list(view)``) is safe.
    """

    __slots__ = ("_buf", "_cls", "_entries")

    def __init__(self, buf: Buffer, entries: tuple[EntryRecord, ...], cls: type) -> None:
        self._buf = buf
        self._entries = entries
        self._cls = cls

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, index: int) -> Any:  # type: ignore[override]
        return self._cls(self._buf, *self._entries[index])

    def __iter__(self) -> Iterator[Any]:
        buf, cls = self._buf, self._cls
        for record in self._entries:
            yield cls(buf, *record)

    def __repr__(self) -> str:
        return f"GroupView({[e.to_dict() for e in self]!r})"


# ---------------------------------------------------------------- group encode


def _normalize(spec: FieldSpec, value: Any, where: str) -> Any:
    name = f"{where}.{spec.name}"
    if spec.array_length:
        if spec.bytes_array:
            return byte_array(value, spec.array_length, name)
        return int_array(value, spec.array_length, name)
    if value is None:
        if spec.null_value is None:
            raise require(name)
        return spec.null_value
    if spec.enum_values is not None and value not in spec.enum_values:
        raise UnknownEnumValue(f"{name}: {value!r} is not a valid enum value")
    return value


Prepared = tuple[int, list[tuple[list[Any], list[Any], list[Buffer]]]]


def prepare_group(spec: GroupSpec, entries: Any, owner: str) -> Prepared:
    """Validate and convert group entries; returns (encoded size, normalised entries).

    Entries are mappings keyed by snake_case member name (optional members and var
    data may be omitted) or sequences in schema order: fields, groups, then data.
    """
    where = f"{owner}.{spec.name}"
    if entries is None:
        entries = ()
    count = len(entries)
    if count > spec.max_count:
        raise GroupOverflow(f"{where}: {count} entries, at most {spec.max_count}")
    size = spec.dim_struct.size
    out = []
    names = None
    for entry in entries:
        if isinstance(entry, Mapping):
            if names is None:
                names = {f.name for f in spec.fields}
                names.update(g.name for g in spec.groups)
                names.update(d.name for d in spec.data)
            unknown = set(entry) - names
            if unknown:
                raise ValueOutOfRange(f"{where}: unknown member(s) {sorted(unknown)}")
            raw_fields = [entry.get(f.name) for f in spec.fields]
            raw_groups = [entry.get(g.name) for g in spec.groups]
            raw_data = [entry.get(d.name) for d in spec.data]
        else:
            items = list(entry)
            nf, ng, nd = len(spec.fields), len(spec.groups), len(spec.data)
            if len(items) > nf + ng + nd:
                raise ValueOutOfRange(f"{where}: {len(items)} members, at most {nf + ng + nd}")
            items += [None] * (nf + ng + nd - len(items))
            raw_fields = items[:nf]
            raw_groups = items[nf : nf + ng]
            raw_data = items[nf + ng :]
        flat: list[Any] = []
        for fspec, value in zip(spec.fields, raw_fields, strict=True):
            v = _normalize(fspec, value, where)
            if fspec.array_length and not fspec.bytes_array:
                flat.extend(v)
            else:
                flat.append(v)
        groups = []
        for gspec, value in zip(spec.groups, raw_groups, strict=True):
            gsize, gprep = prepare_group(gspec, value, where)
            size += gsize
            groups.append((gsize, gprep))
        data: list[Buffer] = []
        for dspec, value in zip(spec.data, raw_data, strict=True):
            name = f"{where}.{dspec.name}"
            b = (
                text_bytes(value, name, dspec.max_length)
                if dspec.text
                else data_bytes(value, name, dspec.max_length)
            )
            size += dspec.length_struct.size + len(b)  # type: ignore[arg-type]
            data.append(b)
        size += spec.block_length
        out.append((flat, groups, data))
    return size, out


def write_group(buf: Buffer, pos: int, spec: GroupSpec, prepared: Prepared, owner: str) -> int:
    """Write a prepared group at ``pos`` (room already checked); returns the next position."""
    entries = prepared[1]
    spec.dim_struct.pack_into(buf, pos, spec.block_length, len(entries))
    pos += spec.dim_struct.size
    for flat, groups, data in entries:
        try:
            spec.block_struct.pack_into(buf, pos, *flat)
        except struct.error as exc:
            raise ValueOutOfRange(f"{owner}.{spec.name}: {exc}") from None
        pos += spec.block_length
        for gspec, gprep in zip(spec.groups, groups, strict=True):
            pos = write_group(buf, pos, gspec, gprep, owner)
        for dspec, b in zip(spec.data, data, strict=True):
            pos = write_data(buf, pos, dspec.length_struct, b)
    return pos


def write_data(buf: Buffer, pos: int, length_struct: struct.Struct, data: Any) -> int:
    n = len(data)
    length_struct.pack_into(buf, pos, n)
    pos += length_struct.size
    if n:
        buf[pos : pos + n] = data  # type: ignore[index]
    return pos + n


def entries_to_dicts(view: GroupView) -> list[dict[str, Any]]:
    return [entry.to_dict() for entry in view]


def data_error(buf: Buffer, pos: int, end: int, spec: DataSpec, owner: str) -> CodecError:
    """The precise error for a root var-data field that failed the inline check."""
    try:
        walk_data(buf, pos, end, (spec,), owner)
    except CodecError as exc:
        return exc
    return VarDataOverflow(f"{owner}.{spec.name}: invalid length")  # pragma: no cover
