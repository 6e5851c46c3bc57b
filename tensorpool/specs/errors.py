"""One exception hierarchy for everything the SBE codecs can reject.

Agents never die on bad input: they catch :class:`CodecError`, count a drop under
``err.reason`` and move on. ``reason`` is therefore a stable, snake_case name meant
for counters and logs; the message text is for humans and may change.

``CodecError`` derives from ``ValueError`` so callers that only know "this input
was bad" can catch the builtin.
"""

from __future__ import annotations

__all__ = [
    "BlockLengthTooSmall",
    "BufferTooSmall",
    "CodecError",
    "GroupOverflow",
    "NonAscii",
    "SchemaIdMismatch",
    "TemplateIdMismatch",
    "TruncatedBuffer",
    "UnknownEnumValue",
    "UnsupportedVersion",
    "ValueOutOfRange",
    "VarDataOverflow",
]


class CodecError(ValueError):
    """Base of every codec failure; ``reason`` names the failure for drop counters."""

    reason: str = "codec_error"


class TruncatedBuffer(CodecError):
    """Decoding would read past the end of the buffer (fixed header or block)."""

    reason = "truncated"


class SchemaIdMismatch(CodecError):
    """The message header names a schema this decoder (or dispatcher) does not know."""

    reason = "schema_id_mismatch"


class TemplateIdMismatch(CodecError):
    """The message header names another message (or an unknown one) of the schema."""

    reason = "template_id_mismatch"


class UnsupportedVersion(CodecError):
    """The sender's schema version is newer than ours (Driver §4.4a: reject, don't guess)."""

    reason = "unsupported_version"


class BlockLengthTooSmall(CodecError):
    """The acting block length is shorter than the fields we must read."""

    reason = "block_length_too_small"


class GroupOverflow(CodecError):
    """A repeating group's dimension or entries run past the buffer, or too many entries
    were given to an encoder."""

    reason = "group_overflow"


class VarDataOverflow(CodecError):
    """A var-data length runs past the buffer or exceeds the composite's maxValue."""

    reason = "var_data_overflow"


class UnknownEnumValue(CodecError):
    """A raw enum value has no member; §15.8 requires rejection, never a guess."""

    reason = "unknown_enum_value"


class NonAscii(CodecError):
    """A varAscii field holds (or was given) bytes outside US-ASCII."""

    reason = "non_ascii"


class ValueOutOfRange(CodecError):
    """An encoder was given a value its wire type cannot hold (or of the wrong type)."""

    reason = "value_out_of_range"


class BufferTooSmall(CodecError):
    """The caller's buffer cannot hold the message being encoded."""

    reason = "buffer_too_small"
