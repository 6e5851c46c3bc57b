"""Decode any tensorpool SBE message by the (schemaId, templateId) in its header.

Tools such as ``tensorpool tap`` and agents that multiplex several messages on one
stream need "whatever this is" decoding. The generated modules are imported on
first use, so that ``python -m tensorpool.specs.codegen`` still runs when a
generated module is stale or broken.
"""

from __future__ import annotations

import struct
from collections.abc import Buffer
from typing import Any

from tensorpool.specs import _runtime as _rt
from tensorpool.specs.errors import SchemaIdMismatch, TemplateIdMismatch

__all__ = ["decode_any", "decoder_class", "peek_header"]

_unpack_header = struct.Struct("<HHHH").unpack_from
_TABLE: dict[int, dict[int, type]] | None = None


def _table() -> dict[int, dict[int, type]]:
    global _TABLE
    if _TABLE is None:
        from tensorpool.specs.generated import bridge, driver, wire

        _TABLE = {m.SCHEMA_ID: dict(m.DECODERS) for m in (wire, driver, bridge)}
    return _TABLE


def peek_header(buf: Buffer, offset: int = 0) -> tuple[int, int, int, int]:
    """Read the 8-byte message header: ``(block_length, template_id, schema_id, version)``.

    Raises :class:`~tensorpool.specs.errors.TruncatedBuffer` when fewer than 8 bytes
    remain; does not judge the values.
    """
    if offset < 0:
        raise _rt.truncated("messageHeader", offset + 8, _rt.buffer_length(buf))
    try:
        return _unpack_header(buf, offset)  # type: ignore[return-value]
    except struct.error:
        raise _rt.truncated("messageHeader", offset + 8, _rt.buffer_length(buf)) from None


def decoder_class(schema_id: int, template_id: int) -> type:
    """The decoder class for a (schemaId, templateId) pair, or a CodecError."""
    by_template = _table().get(schema_id)
    if by_template is None:
        raise SchemaIdMismatch(f"unknown schemaId {schema_id}")
    cls = by_template.get(template_id)
    if cls is None:
        raise TemplateIdMismatch(f"schemaId {schema_id} has no templateId {template_id}")
    return cls


def decode_any(buf: Buffer, offset: int = 0) -> Any:
    """Wrap a fresh decoder of the right type over the message at ``offset``.

    Every failure (short buffer, unknown ids, newer version, bad lengths) raises a
    :class:`~tensorpool.specs.errors.CodecError` subclass.
    """
    _, template_id, schema_id, _ = peek_header(buf, offset)
    return decoder_class(schema_id, template_id)().wrap(buf, offset)
