"""SBE schema → Python codec generator.

Run ``python -m tensorpool.specs.codegen`` to regenerate
``tensorpool/specs/generated/{wire,driver,bridge}.py`` from ``schemas/*.xml``, or
``python -m tensorpool.specs.codegen --check`` to fail (exit 1) when a committed
module is stale.

The model: the XML is parsed (stdlib ``xml.etree``) into a small tree — primitive
and named simple types, enums, composites, messages with fixed fields, repeating
groups and var data — and laid out exactly as ``sbe-tool`` would: fields packed in
declaration order with no implicit alignment, constants taking no bytes, an
explicit ``blockLength`` padding the block. Anything the generator does not
understand (sets, nested composites as fields, ``sinceVersion``...) is a hard error
rather than a silently different layout.

The emitted code is flyweight-style: decoders read fields lazily from the caller's
buffer with precompiled ``struct.Struct`` readers; encoders pack the header and the
whole fixed block with a single precompiled ``Struct``. Group walking and var-data
conversion live in :mod:`tensorpool.specs._runtime`.
"""

from __future__ import annotations

import argparse
import keyword
import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

SBE_NS = "http://fixprotocol.io/2016/sbe"
HERE = Path(__file__).resolve().parent
SCHEMA_DIR = HERE / "schemas"
GENERATED_DIR = HERE / "generated"
SCHEMAS = ("wire", "driver", "bridge")

# Messages that live in shared memory and are read in place while a writer may be
# active (seqlock, liveness timestamps): their decoders read every field on access.
# All others are unpacked once per wrap, which is ~3x faster for a full read.
SHM_RESIDENT: dict[str, frozenset[str]] = {
    "wire": frozenset({"ShmRegionSuperblock", "SlotHeader", "TensorHeader"}),
}


class SchemaError(Exception):
    """The schema uses something this generator cannot lay out faithfully."""


# ---------------------------------------------------------------------------- model


@dataclass(frozen=True)
class Primitive:
    name: str
    fmt: str  # struct format character
    size: int
    min_value: int | float
    max_value: int | float
    null_value: int | float


PRIMITIVES: dict[str, Primitive] = {
    "char": Primitive("char", "B", 1, 0x20, 0x7E, 0),
    "int8": Primitive("int8", "b", 1, -127, 127, -128),
    "uint8": Primitive("uint8", "B", 1, 0, 254, 255),
    "int16": Primitive("int16", "h", 2, -32767, 32767, -32768),
    "uint16": Primitive("uint16", "H", 2, 0, 65534, 65535),
    "int32": Primitive("int32", "i", 4, -(2**31) + 1, 2**31 - 1, -(2**31)),
    "uint32": Primitive("uint32", "I", 4, 0, 2**32 - 2, 2**32 - 1),
    "int64": Primitive("int64", "q", 8, -(2**63) + 1, 2**63 - 1, -(2**63)),
    "uint64": Primitive("uint64", "Q", 8, 0, 2**64 - 2, 2**64 - 1),
    "float": Primitive("float", "f", 4, float("-inf"), float("inf"), float("nan")),
    "double": Primitive("double", "d", 8, float("-inf"), float("inf"), float("nan")),
}


@dataclass
class SimpleType:
    """A ``<type>``: primitive, optionally an array, optional, or a constant."""

    name: str
    primitive: Primitive
    length: int = 1
    presence: str = "required"
    null_value: int | None = None
    min_value: int | None = None
    max_value: int | None = None
    constant: int | None = None
    character_encoding: str | None = None


@dataclass
class Enum:
    name: str
    encoding: Primitive
    values: list[tuple[str, int]]


@dataclass
class Composite:
    name: str
    members: list[SimpleType]

    def member(self, name: str) -> SimpleType:
        for m in self.members:
            if m.name == name:
                return m
        raise SchemaError(f"composite {self.name} has no member {name}")


@dataclass
class Field:
    name: str
    id: int
    type_name: str
    kind: str  # "scalar" | "enum" | "array" | "constant"
    primitive: Primitive
    offset: int = 0
    length: int = 1
    optional: bool = False
    null_value: int | None = None
    min_value: int | None = None
    max_value: int | None = None
    constant: int | None = None
    enum: Enum | None = None

    @property
    def size(self) -> int:
        return 0 if self.kind == "constant" else self.primitive.size * self.length

    @property
    def bytes_array(self) -> bool:
        return self.kind == "array" and self.primitive.name in ("uint8", "char")

    @property
    def snake(self) -> str:
        return snake(self.name)

    @property
    def upper(self) -> str:
        return self.snake.upper()


@dataclass
class VarData:
    name: str
    id: int
    type_name: str
    length: Primitive
    max_length: int
    text: bool

    @property
    def snake(self) -> str:
        return snake(self.name)


@dataclass
class Group:
    name: str
    id: int
    dimension: Composite
    block_length: int = 0
    fields: list[Field] = field(default_factory=list)
    groups: list[Group] = field(default_factory=list)
    data: list[VarData] = field(default_factory=list)

    @property
    def snake(self) -> str:
        return snake(self.name)


@dataclass
class Message:
    name: str
    id: int
    block_length: int = 0
    explicit_block_length: bool = False
    fields: list[Field] = field(default_factory=list)
    groups: list[Group] = field(default_factory=list)
    data: list[VarData] = field(default_factory=list)
    description: str = ""


@dataclass
class Schema:
    key: str  # module name: wire / driver / bridge
    package: str
    id: int
    version: int
    semantic_version: str
    byte_order: str  # struct prefix
    types: dict[str, SimpleType] = field(default_factory=dict)
    enums: dict[str, Enum] = field(default_factory=dict)
    composites: dict[str, Composite] = field(default_factory=dict)
    messages: list[Message] = field(default_factory=list)


# ---------------------------------------------------------------------------- names


def snake(name: str) -> str:
    """camelCase → snake_case; ``headerNslots`` → ``header_nslots``."""
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", s)
    s = s.lower()
    if keyword.iskeyword(s):
        s += "_"
    return s


def upper_snake(name: str) -> str:
    return snake(name).rstrip("_").upper()


# Names the generated classes use for themselves; a schema member may not shadow them.
RESERVED = {
    "buf",
    "offset",
    "wrap",
    "wrap_body",
    "to_dict",
    "encoded_length",
    "raw_tuple",
    "decode_tuple",
    "acting_block_length",
    "acting_version",
    "buffer",
    "encode",
    "encode_body",
}


# ---------------------------------------------------------------------------- parsing


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip()
    return int(text, 0) if text.lower().startswith("0x") else int(text)


def _tag(el: ET.Element) -> str:
    return el.tag.split("}", 1)[-1]


def _parse_simple(el: ET.Element) -> SimpleType:
    name = el.attrib["name"]
    prim_name = el.attrib.get("primitiveType")
    if prim_name not in PRIMITIVES:
        raise SchemaError(f"type {name}: unsupported primitiveType {prim_name!r}")
    for attr in ("sinceVersion", "offset", "valueRef"):
        if attr in el.attrib and attr != "offset":
            raise SchemaError(f"type {name}: attribute {attr} is not supported")
    presence = el.attrib.get("presence", "required")
    t = SimpleType(
        name=name,
        primitive=PRIMITIVES[prim_name],
        length=_int(el.attrib.get("length")) if "length" in el.attrib else 1,  # type: ignore[arg-type]
        presence=presence,
        null_value=_int(el.attrib.get("nullValue")),
        min_value=_int(el.attrib.get("minValue")),
        max_value=_int(el.attrib.get("maxValue")),
        character_encoding=el.attrib.get("characterEncoding"),
    )
    if presence == "constant":
        if el.text is None or not el.text.strip():
            raise SchemaError(f"constant type {name} has no value")
        t.constant = _int(el.text)
    return t


def parse_schema(path: Path, key: str | None = None) -> Schema:
    """Parse one schema file into the layout model."""
    root = ET.parse(path).getroot()
    if _tag(root) != "messageSchema":
        raise SchemaError(f"{path}: root element is not messageSchema")
    order = root.attrib.get("byteOrder", "littleEndian")
    if order not in ("littleEndian", "bigEndian"):
        raise SchemaError(f"{path}: byteOrder {order!r}")
    schema = Schema(
        key=key or path.stem,
        package=root.attrib.get("package", ""),
        id=int(root.attrib["id"]),
        version=int(root.attrib.get("version", "0")),
        semantic_version=root.attrib.get("semanticVersion", ""),
        byte_order="<" if order == "littleEndian" else ">",
    )
    for types in root:
        if _tag(types) != "types":
            continue
        for el in types:
            tag = _tag(el)
            name = el.attrib.get("name", "")
            if tag == "type":
                schema.types[name] = _parse_simple(el)
            elif tag == "composite":
                members = []
                for m in el:
                    if _tag(m) != "type":
                        raise SchemaError(f"composite {name}: only <type> members supported")
                    members.append(_parse_simple(m))
                schema.composites[name] = Composite(name, members)
            elif tag == "enum":
                enc = el.attrib["encodingType"]
                if enc not in PRIMITIVES:
                    raise SchemaError(f"enum {name}: encodingType {enc} not supported")
                values = [(v.attrib["name"], _int(v.text)) for v in el if _tag(v) == "validValue"]
                schema.enums[name] = Enum(name, PRIMITIVES[enc], values)  # type: ignore[arg-type]
            else:
                raise SchemaError(f"{path}: <{tag}> in <types> is not supported")
    _check_header(schema)
    for el in root:
        if _tag(el) == "message":
            schema.messages.append(_parse_message(schema, el))
    ids = [m.id for m in schema.messages]
    if len(ids) != len(set(ids)):
        raise SchemaError(f"{path}: duplicate message ids")
    return schema


def _check_header(schema: Schema) -> None:
    hdr = schema.composites.get("messageHeader")
    if hdr is None:
        raise SchemaError("schema has no messageHeader composite")
    names = [(m.name, m.primitive.name) for m in hdr.members]
    want = [(n, "uint16") for n in ("blockLength", "templateId", "schemaId", "version")]
    if names != want:
        raise SchemaError(f"messageHeader must be {want}, got {names}")


def _resolve_field(schema: Schema, el: ET.Element) -> Field:
    name = el.attrib["name"]
    type_name = el.attrib["type"]
    for attr in ("sinceVersion", "valueRef"):
        if attr in el.attrib:
            raise SchemaError(f"field {name}: attribute {attr} is not supported")
    presence = el.attrib.get("presence")
    f = Field(
        name=name,
        id=int(el.attrib["id"]),
        type_name=type_name,
        kind="scalar",
        primitive=PRIMITIVES["uint8"],
        min_value=_int(el.attrib.get("minValue")),
        max_value=_int(el.attrib.get("maxValue")),
    )
    if type_name in schema.enums:
        enum = schema.enums[type_name]
        f.kind, f.enum, f.primitive = "enum", enum, enum.encoding
    elif type_name in PRIMITIVES:
        f.primitive = PRIMITIVES[type_name]
    elif type_name in schema.types:
        t = schema.types[type_name]
        f.primitive, f.length = t.primitive, t.length
        if t.presence == "constant":
            f.kind, f.constant = "constant", t.constant
        elif t.presence == "optional" and presence is None:
            presence = "optional"
        f.null_value = t.null_value
        f.min_value = f.min_value if f.min_value is not None else t.min_value
        f.max_value = f.max_value if f.max_value is not None else t.max_value
    elif type_name in schema.composites:
        raise SchemaError(f"field {name}: composite-typed fields are not supported")
    else:
        raise SchemaError(f"field {name}: unknown type {type_name}")
    if "length" in el.attrib:  # a length on the field itself makes an inline array
        f.length = _int(el.attrib["length"])  # type: ignore[assignment]
    if f.kind != "constant" and f.length != 1:
        if f.kind == "enum":
            raise SchemaError(f"field {name}: enum arrays are not supported")
        if f.length < 1:
            raise SchemaError(f"field {name}: array length {f.length}")
        f.kind = "array"
    if presence == "constant":
        if f.kind != "constant":
            raise SchemaError(f"field {name}: constant presence needs a constant type")
    elif presence == "optional":
        if f.kind == "array":
            raise SchemaError(f"field {name}: optional arrays are not supported")
        f.optional = True
        nv = _int(el.attrib.get("nullValue"))
        if nv is not None:
            f.null_value = nv
        if f.null_value is None:
            f.null_value = f.primitive.null_value  # type: ignore[assignment]
        if isinstance(f.null_value, float):
            raise SchemaError(f"field {name}: optional floating point not supported")
    if f.primitive.fmt in "fd" and f.kind != "scalar":
        raise SchemaError(f"field {name}: floating point arrays not supported")
    return f


def _resolve_data(schema: Schema, el: ET.Element) -> VarData:
    name = el.attrib["name"]
    type_name = el.attrib["type"]
    comp = schema.composites.get(type_name)
    if comp is None:
        raise SchemaError(f"data {name}: unknown composite {type_name}")
    if el.attrib.get("presence") == "optional":
        raise SchemaError(f"data {name}: var data cannot be optional (use length 0)")
    length = comp.member("length")
    payload = comp.member("varData")
    if length.primitive.fmt not in "BHIQ":
        raise SchemaError(f"data {name}: length must be an unsigned integer")
    max_length = length.max_value if length.max_value is not None else length.primitive.max_value
    text = payload.character_encoding is not None
    if text and payload.character_encoding not in ("US-ASCII", "ASCII"):
        raise SchemaError(f"data {name}: characterEncoding {payload.character_encoding}")
    return VarData(name, int(el.attrib["id"]), type_name, length.primitive, int(max_length), text)


def _parse_members(
    schema: Schema, el: ET.Element, owner: str
) -> tuple[list[Field], list[Group], list[VarData], int]:
    fields: list[Field] = []
    groups: list[Group] = []
    data: list[VarData] = []
    offset = 0
    for child in el:
        tag = _tag(child)
        if tag == "field":
            if groups or data:
                raise SchemaError(f"{owner}: fixed field after a group or var data")
            f = _resolve_field(schema, child)
            if "offset" in child.attrib:
                explicit = _int(child.attrib["offset"])
                assert explicit is not None
                if explicit < offset:
                    raise SchemaError(f"{owner}.{f.name}: offset {explicit} overlaps")
                offset = explicit
            f.offset = offset
            offset += f.size
            fields.append(f)
        elif tag == "group":
            if data:
                raise SchemaError(f"{owner}: group after var data")
            groups.append(_parse_group(schema, child, owner))
        elif tag == "data":
            data.append(_resolve_data(schema, child))
        else:
            raise SchemaError(f"{owner}: unsupported member <{tag}>")
    names = [snake(x.name) for x in (*fields, *groups, *data)]
    if len(names) != len(set(names)):
        raise SchemaError(f"{owner}: duplicate member names")
    for n in names:
        if n in RESERVED:
            raise SchemaError(f"{owner}: member name {n!r} collides with codec API")
    return fields, groups, data, offset


def _parse_group(schema: Schema, el: ET.Element, owner: str) -> Group:
    name = el.attrib["name"]
    dim = schema.composites.get(el.attrib.get("dimensionType", "groupSizeEncoding"))
    if dim is None:
        raise SchemaError(f"group {name}: unknown dimensionType")
    if [m.name for m in dim.members] != ["blockLength", "numInGroup"]:
        raise SchemaError(f"group {name}: dimension must be (blockLength, numInGroup)")
    fields, groups, data, end = _parse_members(schema, el, f"{owner}.{name}")
    bl = _int(el.attrib.get("blockLength")) or end
    if bl < end:
        raise SchemaError(f"group {name}: blockLength {bl} < fields end {end}")
    return Group(name, int(el.attrib["id"]), dim, bl, fields, groups, data)


def _parse_message(schema: Schema, el: ET.Element) -> Message:
    name = el.attrib["name"]
    fields, groups, data, end = _parse_members(schema, el, name)
    explicit = _int(el.attrib.get("blockLength"))
    if explicit is not None and explicit < end:
        raise SchemaError(f"message {name}: blockLength {explicit} < fields end {end}")
    return Message(
        name=name,
        id=int(el.attrib["id"]),
        block_length=explicit if explicit is not None else end,
        explicit_block_length=explicit is not None,
        fields=fields,
        groups=groups,
        data=data,
        description=el.attrib.get("description", ""),
    )


# ---------------------------------------------------------------------------- emitting


def _struct_fmt(fields: list[Field], block_length: int) -> str:
    """Format of a whole block: fields in offset order, ``x`` for gaps and tail pad."""
    parts: list[str] = []
    pos = 0
    for f in fields:
        if f.kind == "constant":
            continue
        if f.offset > pos:
            parts.append(f"{f.offset - pos}x")
        parts.append(_field_fmt(f))
        pos = f.offset + f.size
    if block_length > pos:
        parts.append(f"{block_length - pos}x")
    return "".join(parts)


def _field_fmt(f: Field) -> str:
    if f.kind == "array":
        return f"{f.length}s" if f.bytes_array else f"{f.length}{f.primitive.fmt}"
    return f.primitive.fmt


def _reader_name(fmt: str) -> str:
    names = {"B": "u8", "b": "i8", "H": "u16", "h": "i16", "I": "u32", "i": "i32"}
    names |= {"Q": "u64", "q": "i64", "f": "f32", "d": "f64"}
    if fmt in names:
        return f"_r_{names[fmt]}"
    m = re.fullmatch(r"(\d+)([a-zA-Z])", fmt)
    assert m, fmt
    base = "bytes" if m.group(2) == "s" else names[m.group(2)]
    return f"_r_{base}_{m.group(1)}"


def _py_literal(v: int | float) -> str:
    if isinstance(v, int) and v >= 0xFFFF:
        return f"0x{v:X}"
    return repr(v)


def _py_type(f: Field) -> str:
    if f.kind == "enum":
        assert f.enum is not None
        base = f.enum.name
    elif f.kind == "array":
        base = "bytes" if f.bytes_array else "tuple[int, ...]"
    elif f.primitive.fmt in "fd":
        base = "float"
    else:
        base = "int"
    return f"{base} | None" if f.optional else base


LINE_LENGTH = 100


def _split_args(text: str) -> list[str]:
    """Split ``a, f(b, c), "d, e"`` at top-level commas."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    tail = text[start:].strip()
    if tail:
        parts.append(tail)
    return parts


def _wrap_line(indent: str, line: str) -> list[str]:
    """Break an over-long call the way ruff format would: arguments on their own line,
    or one per line with a trailing comma when they still do not fit."""
    stripped = line.lstrip(" ")
    indent, line = indent + " " * (len(line) - len(stripped)), stripped
    if len(indent) + len(line) <= LINE_LENGTH or line.startswith(("#", '"')):
        return [indent + line]
    open_at = line.find("(")
    if open_at < 0:
        return [indent + line]
    depth, quote, close_at = 0, "", -1
    for i in range(open_at, len(line)):
        ch = line[i]
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                close_at = i
                break
    if close_at < 0 or close_at == open_at + 1:
        return [indent + line]
    head, args, tail = line[: open_at + 1], line[open_at + 1 : close_at], line[close_at:]
    inner = indent + "    "
    if len(inner) + len(args) <= LINE_LENGTH:
        return [indent + head, inner + args.strip(), indent + tail]
    out = [indent + head]
    for arg in _split_args(args):
        out.extend(_wrap_line(inner, arg + ","))
    out.append(indent + tail)
    return out


class Emitter:
    """Collects lines; ``w`` writes one line at the current indent (wrapping long calls)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.level = 0
        self._pending = ""

    def w(self, line: str = "", end: str = "\n") -> None:
        """Write a line; ``end=""`` keeps it open so the next call continues it."""
        line = self._pending + line
        self._pending = ""
        if end == "":
            self._pending = line
            return
        if not line:
            self.lines.append("")
            return
        self.lines.extend(_wrap_line("    " * self.level, line))

    def indent(self) -> Emitter:
        self.level += 1
        return self

    def dedent(self) -> None:
        self.level -= 1

    def text(self) -> str:
        """The module text with PEP 8 blank lines: two around top-level blocks."""
        out: list[str] = []
        blanks = 0
        for line in self.lines:
            if not line:
                blanks += 1
                continue
            if out:
                prev = out[-1]
                top = not line.startswith((" ", ")", "]", "}"))
                if top and (line.startswith(("class ", "def ", "@")) or prev.startswith(" ")):
                    want = 2
                elif top:
                    want = min(blanks, 2)
                else:
                    want = min(blanks, 1)
                out.extend([""] * want)
            out.append(line)
            blanks = 0
        return "\n".join(out) + "\n"


class ModuleGen:
    """Emits one generated module for one schema."""

    def __init__(self, schema: Schema, source_name: str) -> None:
        self.s = schema
        self.source_name = source_name
        self.e = Emitter()
        self.readers: dict[str, str] = {}  # reader name -> format
        self.writers: dict[str, str] = {}  # writer name -> format
        self.exports: list[str] = []

    # -------------------------------------------------------------- helpers
    def reader(self, fmt: str) -> str:
        name = _reader_name(fmt)
        self.readers[name] = fmt
        return name

    def writer(self, fmt: str) -> str:
        name = _reader_name(fmt).replace("_r_", "_w_", 1)
        self.writers[name] = fmt
        return name

    # -------------------------------------------------------------- module
    def generate(self) -> str:
        body = Emitter()
        self.e = body
        self.emit_enums()
        for msg in self.s.messages:
            self.emit_message(msg)
        self.emit_tables()
        head = Emitter()
        self.emit_head(head)
        return head.text() + "\n\n" + body.text()

    def emit_head(self, e: Emitter) -> None:
        s = self.s
        e.w(f'"""SBE codecs for schema {s.id} v{s.version} ({s.package}).')
        e.w("")
        e.w(f"GENERATED by ``python -m tensorpool.specs.codegen`` from schemas/{self.source_name}.")
        e.w("Do not edit: change the schema or the generator and regenerate.")
        e.w('"""')
        e.w("")
        e.w("from __future__ import annotations")
        e.w("")
        e.w("import struct")
        e.w("from collections.abc import Buffer")
        e.w("from enum import IntEnum")
        e.w("from typing import Any")
        e.w("")
        e.w("from tensorpool.specs import _runtime as _rt")
        e.w("")
        # isort-style order (constants, classes, functions), as ruff's RUF022 expects
        names = sorted(set(self.exports), key=lambda n: (not n.isupper(), not n[0].isupper(), n))
        e.w("__all__ = [")
        for n in names:
            e.w(f'    "{n}",')
        e.w("]")
        e.w("")
        e.w(f"SCHEMA_ID = {s.id}")
        e.w(f"SCHEMA_VERSION = {s.version}")
        e.w(f'SEMANTIC_VERSION = "{s.semantic_version}"')
        e.w(f'PACKAGE = "{s.package}"')
        e.w("MESSAGE_HEADER_LENGTH = 8")
        for t in s.types.values():
            if t.presence == "constant":
                e.w(f"{upper_snake(t.name)} = {t.constant}")
        e.w("")
        e.w(f'_r_hdr = struct.Struct("{s.byte_order}HHHH").unpack_from')
        for name, fmt in sorted(self.readers.items()):
            e.w(f'{name} = struct.Struct("{s.byte_order}{fmt}").unpack_from')
        for name, fmt in sorted(self.writers.items()):
            e.w(f'{name} = struct.Struct("{s.byte_order}{fmt}").pack_into')

    def emit_enums(self) -> None:
        e = self.e
        for enum in self.s.enums.values():
            self.exports.append(enum.name)
            e.w("")
            e.w("")
            e.w(f"class {enum.name}(IntEnum):")
            e.indent()
            e.w(f'"""``{enum.name}`` ({enum.encoding.name} on the wire)."""')
            e.w("")
            for n, v in enum.values:
                e.w(f"{n} = {v}")
            e.dedent()
            e.w("")
            e.w("")
            cname = f"_{upper_snake(enum.name)}"
            e.w(f"{cname}_BY_VALUE = {{m.value: m for m in {enum.name}}}")
            e.w(f"{cname}_VALUES: frozenset[int] = frozenset({cname}_BY_VALUE)")

    # -------------------------------------------------------------- specs
    def group_spec_name(self, path: list[str]) -> str:
        return "_G_" + "_".join(upper_snake(p) for p in path)

    def emit_group_spec(self, group: Group, path: list[str]) -> str:
        """Emit the runtime table for a group (children first); returns its name."""
        p = [*path, group.name]
        nested = [self.emit_group_spec(g, p) for g in group.groups]
        name = self.group_spec_name(p)
        e = self.e
        bo = self.s.byte_order
        dim = group.dimension
        dim_fmt = "".join(m.primitive.fmt for m in dim.members)
        count_member = dim.member("numInGroup")
        max_count = (
            count_member.max_value
            if count_member.max_value is not None
            else count_member.primitive.max_value
        )
        min_entry = group.block_length
        min_entry += sum(d.length.size for d in group.data)
        min_entry += sum(sum(m.primitive.size for m in g.dimension.members) for g in group.groups)
        e.w("")
        e.w(f"{name} = _rt.GroupSpec(")
        e.indent()
        e.w(f'name="{group.snake}",')
        e.w(f'dim_struct=struct.Struct("{bo}{dim_fmt}"),')
        e.w(f"max_count={_py_literal(max_count)},")
        e.w(f"block_length={group.block_length},")
        e.w(f'block_struct=struct.Struct("{bo}{_struct_fmt(group.fields, group.block_length)}"),')
        e.w("fields=(")
        e.indent()
        for f in group.fields:
            if f.kind == "constant":
                continue
            null = _py_literal(f.null_value) if f.optional else "None"  # type: ignore[arg-type]
            enum_vals = f"_{upper_snake(f.enum.name)}_VALUES" if f.enum else "None"
            arr = f.length if f.kind == "array" else 0
            e.w(f'_rt.FieldSpec("{f.snake}", {null}, {enum_vals}, {arr}, {f.bytes_array}),')
        e.dedent()
        e.w("),")
        e.w(f"groups=({''.join(n + ', ' for n in nested)}),".replace(", )", ",)"))
        if len(group.data) == 1:
            e.w(f"data=({self.data_spec_expr(group.data[0])},),")
        else:
            e.w("data=(")
            e.indent()
            for d in group.data:
                e.w(self.data_spec_expr(d) + ",")
            e.dedent()
            e.w("),")
        e.w(f"min_entry_size={min_entry},")
        e.dedent()
        e.w(")")
        return name

    def data_spec_expr(self, d: VarData) -> str:
        return (
            f'_rt.DataSpec("{d.snake}", struct.Struct("{self.s.byte_order}{d.length.fmt}"), '
            f"{_py_literal(d.max_length)}, {d.text})"
        )

    # -------------------------------------------------------------- messages
    def emit_message(self, msg: Message) -> None:
        e = self.e
        key = upper_snake(msg.name)
        group_specs = [self.emit_group_spec(g, [msg.name]) for g in msg.groups]
        for g, spec in zip(msg.groups, group_specs, strict=True):
            self.emit_entry_decoder(g, [msg.name], spec)
        fixed = [f for f in msg.fields if f.kind != "constant"]
        block_fmt = _struct_fmt(msg.fields, msg.block_length)
        bo = self.s.byte_order
        e.w("")
        if group_specs:
            e.w("")
        e.w(f'_{key}_BLOCK = struct.Struct("{bo}{block_fmt}")')
        e.w(f'_{key}_FULL = struct.Struct("{bo}HHHH{block_fmt}")')
        if msg.name in SHM_RESIDENT.get(self.s.key, ()) and msg.block_length > 0:
            e.w(f'_{key}_PROBE = struct.Struct("{bo}HHHH{msg.block_length - 1}xB").unpack_from')
        if msg.data or msg.groups:
            e.w(f"_{key}_ROOT_DATA = (")
            e.indent()
            for d in msg.data:
                e.w(self.data_spec_expr(d) + ",")
            e.dedent()
            e.w(")")
        if msg.groups:
            e.w(f"_{key}_GROUPS = ({''.join(n + ', ' for n in group_specs)})".replace(", )", ",)"))
        self.emit_decoder(msg, fixed)
        self.emit_encoder(msg, fixed)

    def class_attrs(self, msg: Message, role: str) -> None:
        e = self.e
        e.w(f'NAME = "{msg.name}"')
        e.w(f"TEMPLATE_ID = {msg.id}")
        e.w(f"SCHEMA_ID = {self.s.id}")
        e.w(f"SCHEMA_VERSION = {self.s.version}")
        e.w(f"BLOCK_LENGTH = {msg.block_length}")
        self.field_attrs(msg.fields, msg.data)

    def field_attrs(self, fields: list[Field], data: list[VarData]) -> None:
        e = self.e
        for f in fields:
            if f.kind == "constant":
                e.w(f"{f.upper}_VALUE = {f.constant}")
                continue
            e.w(f"{f.upper}_OFFSET = {f.offset}")
            if f.optional:
                e.w(f"{f.upper}_NULL_VALUE = {_py_literal(f.null_value)}")  # type: ignore[arg-type]
            if f.min_value is not None:
                e.w(f"{f.upper}_MIN_VALUE = {_py_literal(f.min_value)}")
            if f.max_value is not None:
                e.w(f"{f.upper}_MAX_VALUE = {_py_literal(f.max_value)}")
            if f.kind == "array":
                e.w(f"{f.upper}_LENGTH = {f.length}")
        for d in data:
            e.w(f"{upper_snake(d.name)}_MAX_LENGTH = {_py_literal(d.max_length)}")

    def emit_field_getters(
        self, fields: list[Field], base: str, owner: str, snapshot: bool = False
    ) -> None:
        """Property per fixed field.

        Lazy: read from ``self._buf`` at ``self.<base> + offset`` on every access.
        Snapshot: index into ``self._v``, the header + block tuple unpacked by ``wrap``.
        """
        e = self.e
        index = 4  # snapshot tuple: 4 header values, then the block in layout order
        for f in fields:
            e.w("")
            e.w("@property")
            if f.kind == "constant":
                e.w(f"def {f.snake}(self) -> int:")
                e.indent()
                e.w('"""Schema constant: occupies no bytes on the wire."""')
                e.w(f"return {f.constant}")
                e.dedent()
                continue
            pos = f"self.{base}" + (f" + {f.offset}" if f.offset else "")
            width = f.length if (f.kind == "array" and not f.bytes_array) else 1
            if snapshot:
                one = f"self._v[{index}]"
                many = f"self._v[{index}:{index + width}]"
            else:
                rd = self.reader(_field_fmt(f))
                one = f"{rd}(self._buf, {pos})[0]"
                many = f"{rd}(self._buf, {pos})"
            index += width
            if f.kind == "array":
                e.w(f"def {f.snake}(self) -> {_py_type(f)}:")
                e.indent()
                e.w(f"return {one if f.bytes_array else many}")
                e.dedent()
                continue
            if f.kind == "enum":
                assert f.enum is not None
                cname = f"_{upper_snake(f.enum.name)}"
                e.w(f"def {f.snake}(self) -> {_py_type(f)}:")
                e.indent()
                e.w(f"raw = {one}")
                if f.optional:
                    e.w(f"if raw == {_py_literal(f.null_value)}:")  # type: ignore[arg-type]
                    e.w("    return None")
                e.w(f"value = {cname}_BY_VALUE.get(raw)")
                e.w("if value is None:")
                e.w(f'    raise _rt.unknown_enum("{f.enum.name}", "{owner}.{f.snake}", raw)')
                e.w("return value")
                e.dedent()
                e.w("")
                e.w("@property")
                e.w(f"def {f.snake}_raw(self) -> int:")
                e.indent()
                e.w('"""Raw wire value, for validators that count unknown values as drops."""')
                e.w(f"return {one}")
                e.dedent()
                continue
            e.w(f"def {f.snake}(self) -> {_py_type(f)}:")
            e.indent()
            if f.optional:
                e.w(f"value = {one}")
                e.w(f"return None if value == {_py_literal(f.null_value)} else value")  # type: ignore[arg-type]
            else:
                e.w(f"return {one}")
            e.dedent()

    def emit_data_getters(self, data: list[VarData], from_slots: bool, owner: str) -> None:
        e = self.e
        for i, d in enumerate(data):
            if from_slots:
                p, n = f"self._{d.snake}_pos", f"self._{d.snake}_len"
            else:
                p, n = f"self._data[{i}][0]", f"self._data[{i}][1]"
            e.w("")
            e.w("@property")
            if d.text and from_slots:
                e.w(f"def {d.snake}(self) -> str:")
                e.indent()
                e.w(f"n = {n}")
                e.w("if not n:")
                e.w('    return ""')
                e.w(f"p = {p}")
                e.w("try:")
                e.w('    return str(self._buf[p : p + n], "ascii")  # type: ignore[index]')
                e.w("except UnicodeDecodeError:")
                e.w(f'    raise _rt.non_ascii("{owner}.{d.snake}") from None')
            elif d.text:
                e.w(f"def {d.snake}(self) -> str:")
                e.indent()
                e.w(f'return _rt.read_text(self._buf, {p}, {n}, "{owner}.{d.snake}")')
            elif from_slots:
                e.w(f"def {d.snake}(self) -> bytes:")
                e.indent()
                e.w(f"p = {p}")
                e.w(f"return bytes(self._buf[p : p + {n}])  # type: ignore[index]")
            else:
                e.w(f"def {d.snake}(self) -> bytes:")
                e.indent()
                e.w(f"return _rt.read_bytes(self._buf, {p}, {n})")
            e.dedent()
            e.w("")
            e.w("@property")
            e.w(f"def {d.snake}_offset(self) -> int:")
            e.indent()
            e.w('"""Buffer position of the first value byte (after the length prefix)."""')
            e.w(f"return {p}")
            e.dedent()
            e.w("")
            e.w("@property")
            e.w(f"def {d.snake}_length(self) -> int:")
            e.indent()
            e.w(f"return {n}")
            e.dedent()

    def emit_group_getters(self, groups: list[Group], path: list[str]) -> None:
        e = self.e
        for i, g in enumerate(groups):
            cls = self.entry_class_name([*path, g.name])
            e.w("")
            e.w("@property")
            e.w(f"def {g.snake}(self) -> _rt.GroupView:")
            e.indent()
            e.w(f'"""Entries of ``{g.name}`` as {cls} flyweights."""')
            e.w(f"return _rt.GroupView(self._buf, self._groups[{i}], {cls})")
            e.dedent()

    def emit_to_dict(self, fields: list[Field], groups: list[Group], data: list[VarData]) -> None:
        e = self.e
        e.w("")
        e.w("def to_dict(self) -> dict[str, Any]:")
        e.indent()
        e.w('"""Plain values keyed like the encoder\'s keyword arguments."""')
        e.w("return {")
        e.indent()
        for f in fields:
            if f.kind != "constant":
                e.w(f'"{f.snake}": self.{f.snake},')
        for g in groups:
            e.w(f'"{g.snake}": _rt.entries_to_dicts(self.{g.snake}),')
        for d in data:
            e.w(f'"{d.snake}": self.{d.snake},')
        e.dedent()
        e.w("}")
        e.dedent()

    def entry_class_name(self, path: list[str]) -> str:
        return "".join(p[0].upper() + p[1:] for p in path) + "Decoder"

    def emit_entry_decoder(self, group: Group, path: list[str], spec: str) -> None:
        p = [*path, group.name]
        for g in group.groups:
            self.emit_entry_decoder(g, p, self.group_spec_name([*p, g.name]))
        e = self.e
        cls = self.entry_class_name(p)
        self.exports.append(cls)
        owner = ".".join(snake(x) for x in p)
        e.w("")
        e.w("")
        e.w(f"class {cls}:")
        e.indent()
        e.w(f'"""One entry of group ``{".".join(p)}`` (flyweight over the message)."""')
        e.w("")
        e.w('__slots__ = ("_buf", "_data", "_groups", "_pos")')
        e.w("")
        e.w(f"BLOCK_LENGTH = {group.block_length}")
        self.field_attrs(group.fields, group.data)
        e.w("")
        e.w("def __init__(")
        e.w("    self, buf: Buffer, pos: int, groups: tuple[Any, ...], data: tuple[Any, ...]")
        e.w(") -> None:")
        e.indent()
        e.w("self._buf = buf")
        e.w("self._pos = pos")
        e.w("self._groups = groups")
        e.w("self._data = data")
        e.dedent()
        self.emit_field_getters(group.fields, "_pos", owner)
        self.emit_group_getters(group.groups, p)
        self.emit_data_getters(group.data, False, owner)
        self.emit_to_dict(group.fields, group.groups, group.data)
        e.w("")
        e.w("def __repr__(self) -> str:")
        e.w(f'    return f"{cls}({{self.to_dict()!r}})"')
        e.dedent()
        e.w("")

    def emit_decoder(self, msg: Message, fixed: list[Field]) -> None:
        e = self.e
        key = upper_snake(msg.name)
        cls = f"{msg.name}Decoder"
        self.exports.append(cls)
        var = bool(msg.data or msg.groups)
        lazy = msg.name in SHM_RESIDENT.get(self.s.key, ())
        sid, tid, ver, bl = self.s.id, msg.id, self.s.version, msg.block_length
        slots = ["_body", "_buf", "_limit", "_offset", "_v"]
        if msg.groups:
            slots.append("_groups")
        for d in msg.data:
            slots += [f"_{d.snake}_pos", f"_{d.snake}_len"]
        # the unpacker used by wrap: whole block (snapshot) or header + last block byte (lazy)
        probe = f"_{key}_FULL.unpack_from"
        if lazy:
            probe = f"_{key}_PROBE" if bl > 0 else "_r_hdr"
        e.w("")
        e.w("")
        e.w(f"class {cls}:")
        e.indent()
        e.w(f'"""Flyweight decoder for ``{msg.name}`` (template {tid}).')
        e.w("")
        e.w("``wrap`` checks the header and every group / var-data length against the buffer,")
        if lazy:
            e.w("so later reads stay in bounds. This layout lives in shared memory: every")
            e.w("property reads the buffer when called, so re-reads see concurrent writes.")
        else:
            e.w("so later reads stay in bounds. Fixed fields are unpacked once by ``wrap`` (one")
            e.w("precompiled Struct): re-wrap to see new bytes. Var data is read on access.")
        e.w('"""')
        e.w("")
        e.w("__slots__ = (" + ", ".join(f'"{x}"' for x in sorted(slots)) + ")")
        e.w("")
        self.class_attrs(msg, "decoder")
        e.w("")
        e.w("def __init__(self, buf: Buffer | None = None, offset: int = 0) -> None:")
        e.indent()
        e.w("if buf is not None:")
        e.w("    self.wrap(buf, offset)")
        e.dedent()
        # ---- wrap
        e.w("")
        e.w(f"def wrap(self, buf: Buffer, offset: int = 0) -> {cls}:")
        e.indent()
        e.w('"""Decode a message that starts with the 8-byte message header."""')
        e.w("try:")
        e.w(f"    v = {probe}(buf, offset)")
        e.w("except struct.error:")
        wrap_error = f'_rt.wrap_error("{msg.name}", buf, offset, {sid}, {tid}, {ver}, {bl})'
        e.w(f"    raise {wrap_error} from None")
        if not var and (bl > 0 or not lazy):
            # The unpack above proved the whole block is present when blockLength is ours:
            # the common case needs no length check. A longer acting block goes on below.
            e.w(f"if v[0] == {bl} and v[2] == {sid} and v[1] == {tid} and v[3] <= {ver} ", end="")
            e.w("and offset >= 0:")
            e.indent()
            e.w("self._buf = buf")
            e.w("self._offset = offset")
            if lazy:
                e.w("self._body = offset + 8")
            e.w(f"self._limit = offset + {bl + 8}")
            e.w("self._v = v")
            e.w("return self")
            e.dedent()
        e.w(f"if v[2] != {sid} or v[1] != {tid} or v[3] > {ver} or v[0] < {bl} or offset < 0:")
        e.w(f"    raise {wrap_error}")
        e.w("limit = offset + 8 + v[0]")
        e.w("if type(buf) in _rt.BYTE_TYPES:")
        e.w("    n = len(buf)  # type: ignore[arg-type]")
        e.w("else:")
        e.w("    buf, n = _rt.byte_view(buf)")
        e.w("if limit > n:")
        e.w(f'    raise _rt.truncated("{msg.name}", limit, n)')
        e.w("self._buf = buf")
        e.w("self._offset = offset")
        e.w("self._body = offset + 8")
        e.w("self._v = v")
        if var:
            self.emit_walk_inline(msg)
        else:
            e.w("self._limit = limit")
        e.w("return self")
        e.dedent()
        # ---- wrap_body
        e.w("")
        e.w("def wrap_body(")
        e.w("    self,")
        e.w("    buf: Buffer,")
        e.w("    offset: int = 0,")
        e.w(f"    acting_block_length: int = {bl},")
        e.w(f"    acting_version: int = {ver},")
        e.w(f") -> {cls}:")
        e.indent()
        e.w('"""Decode a header-less body (SHM layouts); sizes come from the caller."""')
        e.w(f"if acting_block_length < {bl} or acting_version > {ver} or offset < 0:")
        e.w("    raise _rt.body_error(")
        e.w(f'        "{msg.name}", offset, acting_block_length, acting_version, {ver}, {bl}')
        e.w("    )")
        e.w("limit = offset + acting_block_length")
        e.w("if type(buf) in _rt.BYTE_TYPES:")
        e.w("    n = len(buf)  # type: ignore[arg-type]")
        e.w("else:")
        e.w("    buf, n = _rt.byte_view(buf)")
        e.w("if limit > n:")
        e.w(f'    raise _rt.truncated("{msg.name}", limit, n)')
        e.w("self._buf = buf")
        e.w("self._offset = offset")
        e.w("self._body = offset")
        if lazy:
            e.w(f"self._v = (acting_block_length, {tid}, {sid}, acting_version)")
        else:
            e.w(
                f"self._v = (acting_block_length, {tid}, {sid}, acting_version, "
                f"*_{key}_BLOCK.unpack_from(buf, offset))"
            )
        if var:
            self.emit_walk_inline(msg)
        else:
            e.w("self._limit = limit")
        e.w("return self")
        e.dedent()
        # ---- generic accessors
        e.w("")
        e.w("@property")
        e.w("def encoded_length(self) -> int:")
        e.indent()
        e.w('"""Bytes from the wrapped offset to the end of the message."""')
        e.w("return self._limit - self._offset")
        e.dedent()
        e.w("")
        e.w("@property")
        e.w("def acting_block_length(self) -> int:")
        e.w("    return self._v[0]")
        e.w("")
        e.w("@property")
        e.w("def acting_version(self) -> int:")
        e.w("    return self._v[3]")
        e.w("")
        e.w("@property")
        e.w("def buffer(self) -> Buffer:")
        e.w("    return self._buf")
        e.w("")
        e.w("@property")
        e.w("def offset(self) -> int:")
        e.w("    return self._offset")
        e.w("")
        e.w("def raw_tuple(self) -> tuple[Any, ...]:")
        e.indent()
        e.w('"""All fixed fields at once: raw ints (no enum or null mapping), in layout')
        e.w("order, integer arrays flattened, uint8 arrays as bytes.")
        e.w('"""')
        if lazy:
            e.w(f"return _{key}_BLOCK.unpack_from(self._buf, self._body)")
        else:
            e.w("return self._v[4:]")
        e.dedent()
        e.w("")
        e.w("@staticmethod")
        e.w("def decode_tuple(buf: Buffer, offset: int = 0) -> tuple[Any, ...]:")
        e.indent()
        e.w('"""Header check plus ``raw_tuple`` without a flyweight: the fastest read."""')
        if var:
            e.w(f"return {cls}().wrap(buf, offset).raw_tuple()")
        else:
            e.w("try:")
            e.w(f"    v = _{key}_FULL.unpack_from(buf, offset)")
            e.w("except struct.error:")
            e.w(f"    return {cls}().wrap(buf, offset).raw_tuple()")
            e.w(f"if v[2] != {sid} or v[1] != {tid} or v[3] > {ver} or v[0] != {bl} or offset < 0:")
            e.w(f"    return {cls}().wrap(buf, offset).raw_tuple()")
            e.w("return v[4:]")
        e.dedent()
        self.emit_field_getters(msg.fields, "_body", snake(msg.name), snapshot=not lazy)
        self.emit_group_getters(msg.groups, [msg.name])
        self.emit_data_getters(msg.data, True, snake(msg.name))
        self.emit_to_dict(msg.fields, msg.groups, msg.data)
        e.w("")
        e.w("def __repr__(self) -> str:")
        e.w(f'    return f"{cls}({{self.to_dict()!r}})"')
        e.dedent()

    def emit_walk_inline(self, msg: Message) -> None:
        """Check and record every group entry and var-data field after the block."""
        e = self.e
        key = upper_snake(msg.name)
        e.w("pos = limit")
        if msg.groups:
            e.w(f'pos, self._groups = _rt.walk_groups(buf, pos, n, _{key}_GROUPS, "{msg.name}")')
        for i, d in enumerate(msg.data):
            lsize = d.length.size
            rd = self.reader(d.length.fmt)
            e.w(f"if pos + {lsize} > n:")
            e.w(f'    raise _rt.data_error(buf, pos, n, _{key}_ROOT_DATA[{i}], "{msg.name}")')
            e.w(f"length = {rd}(buf, pos)[0]")
            e.w(f"pos += {lsize}")
            e.w(f"if length > {_py_literal(d.max_length)} or pos + length > n:")
            e.w(
                f"    raise _rt.data_error(buf, pos - {lsize}, n, _{key}_ROOT_DATA[{i}], "
                f'"{msg.name}")'
            )
            e.w(f"self._{d.snake}_pos = pos")
            e.w(f"self._{d.snake}_len = length")
            e.w("pos += length")
        e.w("self._limit = pos")

    # -------------------------------------------------------------- encoder
    def encoder_params(self, msg: Message) -> list[str]:
        params = []
        for f in msg.fields:
            if f.kind == "constant":
                continue
            t = _py_type(f)
            if f.kind == "enum":
                t = f"{f.enum.name} | int" + (" | None" if f.optional else "")  # type: ignore[union-attr]
            elif f.kind == "array":
                t = "bytes | None" if f.bytes_array else "Sequence[int] | None"
            default = " = None" if (f.optional or f.kind == "array") else ""
            params.append(f"{f.snake}: {t}{default}")
        for g in msg.groups:
            params.append(f"{g.snake}: Sequence[Any] = ()")
        for d in msg.data:
            t = "str | bytes | None" if d.text else "Buffer | None"
            params.append(f"{d.snake}: {t} = None")
        return params

    def emit_encoder(self, msg: Message, fixed: list[Field]) -> None:
        e = self.e
        key = upper_snake(msg.name)
        cls = f"{msg.name}Encoder"
        self.exports.append(cls)
        var = bool(msg.data or msg.groups)
        e.w("")
        e.w("")
        e.w(f"class {cls}:")
        e.indent()
        e.w(f'"""Encoder for ``{msg.name}`` (template {msg.id}).')
        e.w("")
        e.w("Keyword per field (snake_case); optional fields default to None (null sentinel),")
        e.w("arrays may be shorter than their length (zero-filled), groups are sequences of")
        e.w("dicts keyed by member name (or tuples in schema order), var data are str")
        e.w("(varAscii) or bytes-like (varData). Returns the number of bytes written.")
        e.w('"""')
        e.w("")
        e.w("__slots__ = ()")
        e.w("")
        self.class_attrs(msg, "encoder")
        fixed_len = 8 + msg.block_length
        for with_header in (True, False):
            fname = "encode" if with_header else "encode_body"
            e.w("")
            e.w("@staticmethod")
            e.w(f"def {fname}(")
            e.indent()
            e.w("buf: Buffer,")
            e.w("offset: int = 0,")
            e.w("*,")
            for p in self.encoder_params(msg):
                e.w(p.replace("Sequence[", "_Seq[") + ",")
            e.dedent()
            e.w(") -> int:")
            e.indent()
            if with_header:
                e.w('"""Write header + message at ``offset``; returns bytes written."""')
            else:
                e.w('"""Write the header-less body at ``offset`` (SHM layouts); returns bytes."""')
            self.emit_normalize(msg, fixed)
            head_args = f"{msg.block_length}, {msg.id}, {self.s.id}, {self.s.version}, "
            values = ", ".join(
                (f"*{f.snake}" if (f.kind == "array" and not f.bytes_array) else f.snake)
                for f in fixed
            )
            st = f"_{key}_FULL" if with_header else f"_{key}_BLOCK"
            args = (head_args if with_header else "") + values
            size = fixed_len if with_header else msg.block_length
            if var:
                for i, g in enumerate(msg.groups):
                    e.w(f'g{i} = _rt.prepare_group(_{key}_GROUPS[{i}], {g.snake}, "{msg.name}")')
                for i, d in enumerate(msg.data):
                    mx = _py_literal(d.max_length)
                    where = f'"{msg.name}.{d.snake}"'
                    if d.text:
                        e.w(f"d{i} = _rt.text_bytes({d.snake}, {where}, {mx})")
                    else:  # bytes pass straight through; everything else is converted
                        e.w(f"if type({d.snake}) is bytes and len({d.snake}) <= {mx}:")
                        e.w(f"    d{i} = {d.snake}")
                        e.w("else:")
                        e.w(f"    d{i} = _rt.data_bytes({d.snake}, {where}, {mx})")
                    e.w(f"n{i} = len(d{i})  # type: ignore[arg-type]")
                total = [str(size)]
                total += [f"g{i}[0]" for i in range(len(msg.groups))]
                total += [f"{d.length.size} + n{i}" for i, d in enumerate(msg.data)]
                e.w(f"total = {' + '.join(total)}")
                e.w("if type(buf) in _rt.BYTE_TYPES:")
                e.w("    have = len(buf)  # type: ignore[arg-type]")
                e.w("else:")
                e.w("    buf, have = _rt.byte_view(buf)")
                e.w("if offset < 0 or offset + total > have:")
                e.w(f'    raise _rt.pack_error("{msg.name}", buf, offset, total, ValueError())')
            else:
                e.w("if offset < 0:")
                e.w(f'    raise _rt.pack_error("{msg.name}", buf, offset, {size}, ValueError())')
            e.w("try:")
            e.w(f"    {st}.pack_into(buf, offset, {args})")
            e.w("except struct.error as exc:")
            e.w(f'    raise _rt.pack_error("{msg.name}", buf, offset, {size}, exc) from None')
            if var:
                e.w(f"pos = offset + {size}")
                for i, _g in enumerate(msg.groups):
                    e.w(f'pos = _rt.write_group(buf, pos, _{key}_GROUPS[{i}], g{i}, "{msg.name}")')
                for i, d in enumerate(msg.data):
                    e.w(f"{self.writer(d.length.fmt)}(buf, pos, n{i})")
                    e.w(f"pos += {d.length.size}")
                    e.w(f"if n{i}:")
                    e.w(f"    buf[pos : pos + n{i}] = d{i}  # type: ignore[index]")
                    e.w(f"    pos += n{i}")
                e.w("return total")
            else:
                e.w(f"return {size}")
            e.dedent()
        # encoded_length
        e.w("")
        e.w("@staticmethod")
        if var:
            e.w("def encoded_length(")
            e.indent()
            e.w("*,")
            for g in msg.groups:
                e.w(f"{g.snake}: _Seq[Any] = (),")
            for d in msg.data:
                e.w(f"{d.snake}: Any = None,")
            e.w("**_fields: Any,")
            e.dedent()
            e.w(") -> int:")
            e.indent()
            e.w('"""Size of ``encode(...)`` output for the same arguments (header included)."""')
            parts = [str(fixed_len)]
            for i, g in enumerate(msg.groups):
                parts.append(f'_rt.prepare_group(_{key}_GROUPS[{i}], {g.snake}, "{msg.name}")[0]')
            for d in msg.data:
                parts += [str(d.length.size), f"_rt.var_length({d.snake})"]
            one_line = f"return {' + '.join(parts)}"
            if len(one_line) + 4 * e.level <= LINE_LENGTH:
                e.w(one_line)
            else:
                e.w("return (")
                for i, p in enumerate(parts):
                    e.w(f"    {'+ ' if i else ''}{p}")
                e.w(")")
            e.dedent()
        else:
            e.w("def encoded_length(**_fields: Any) -> int:")
            e.indent()
            e.w('"""Size of ``encode(...)`` output (header included); fixed for this message."""')
            e.w(f"return {fixed_len}")
            e.dedent()
        e.dedent()

    def emit_normalize(self, msg: Message, fixed: list[Field]) -> None:
        e = self.e
        for f in fixed:
            if f.kind == "array":
                helper = "byte_array" if f.bytes_array else "int_array"
                if f.bytes_array:
                    e.w(f'{f.snake} = _rt.byte_array({f.snake}, {f.length}, "{f.snake}")')
                else:
                    e.w(f"if {f.snake} is None or len({f.snake}) != {f.length}:")
                    e.w(f'    {f.snake} = _rt.{helper}({f.snake}, {f.length}, "{f.snake}")')
            elif f.kind == "enum":
                assert f.enum is not None
                cname = f"_{upper_snake(f.enum.name)}"
                if f.optional:
                    e.w(f"if {f.snake} is None:")
                    e.w(f"    {f.snake} = {_py_literal(f.null_value)}")  # type: ignore[arg-type]
                    e.w(f"elif {f.snake} not in {cname}_VALUES:")
                else:
                    e.w(f"if {f.snake} not in {cname}_VALUES:")
                e.w(f'    _rt.check_enum({cname}_VALUES, "{f.enum.name}", "{f.snake}", {f.snake})')
            elif f.optional:
                e.w(f"if {f.snake} is None:")
                e.w(f"    {f.snake} = {_py_literal(f.null_value)}")  # type: ignore[arg-type]

    # -------------------------------------------------------------- tables
    def emit_tables(self) -> None:
        e = self.e
        e.w("")
        e.w("")
        e.w("DECODERS: dict[int, type] = {")
        for m in self.s.messages:
            e.w(f"    {m.id}: {m.name}Decoder,")
        e.w("}")
        e.w('"""templateId → decoder class, for dispatch."""')
        e.w("")
        e.w("ENCODERS: dict[int, type] = {")
        for m in self.s.messages:
            e.w(f"    {m.id}: {m.name}Encoder,")
        e.w("}")
        self.exports += ["DECODERS", "ENCODERS", "SCHEMA_ID", "SCHEMA_VERSION"]
        self.exports += ["MESSAGE_HEADER_LENGTH"]
        for t in self.s.types.values():
            if t.presence == "constant":
                self.exports.append(upper_snake(t.name))


def render(schema: Schema, source_name: str) -> str:
    text = ModuleGen(schema, source_name).generate()
    # ``Sequence`` is only used in annotations; keep the import list minimal and stable.
    if "_Seq[" in text:
        text = text.replace(
            "from collections.abc import Buffer\n",
            "from collections.abc import Buffer\nfrom collections.abc import Sequence as _Seq\n",
        )
    return text


INIT_TEXT = '''"""Generated SBE codecs; see ``tensorpool.specs.codegen``. Do not edit."""
'''


def render_all(schema_dir: Path = SCHEMA_DIR) -> dict[str, str]:
    """File name → generated text, for every schema (plus the package ``__init__``)."""
    out = {"__init__.py": INIT_TEXT}
    for key in SCHEMAS:
        schema = parse_schema(schema_dir / f"{key}.xml", key)
        out[f"{key}.py"] = render(schema, f"{key}.xml")
    return out


def write_all(out_dir: Path = GENERATED_DIR, schema_dir: Path = SCHEMA_DIR) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_all(schema_dir).items():
        path = out_dir / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            written.append(path)
    return written


def stale_files(out_dir: Path = GENERATED_DIR, schema_dir: Path = SCHEMA_DIR) -> list[str]:
    stale = []
    for name, text in render_all(schema_dir).items():
        path = out_dir / name
        if not path.exists() or path.read_text() != text:
            stale.append(str(path))
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tensorpool.specs.codegen",
        description="Generate Python SBE codecs from tensorpool/specs/schemas/*.xml.",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if generated files are stale")
    parser.add_argument("--out", type=Path, default=GENERATED_DIR, help="output directory")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files(args.out)
        for path in stale:
            print(f"stale: {path} (run python -m tensorpool.specs.codegen)", file=sys.stderr)
        return 1 if stale else 0
    for path in write_all(args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
