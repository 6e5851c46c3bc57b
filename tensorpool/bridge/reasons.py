"""Stable names for everything the bridge drops, so status lines, JSON and tests agree.

Three families, counted separately because they count different things:

* chunk drops (:class:`ChunkDrop`) count *chunks* refused before they touched any
  frame state — malformed, foreign, early, out of bounds;
* frame drops (:class:`FrameDrop`) count *frames* abandoned after assembly started or
  refused at completion — a missing chunk (timeout, superseded), a conflict, a header
  that fails §6;
* send drops (:class:`SendDrop`) count frames the sender did not (fully) transmit.

A name never changes meaning once published; add new ones instead.
"""

from __future__ import annotations

from typing import Final


class ChunkDrop:
    """Per-chunk refusals (§5.2, §6 steps 1-3, §8)."""

    TRUNCATED: Final = "chunk_truncated"
    BAD_MESSAGE_HEADER: Final = "chunk_bad_message_header"
    UNKNOWN_STREAM: Final = "unknown_stream"
    NO_ANNOUNCE: Final = "no_announce"
    EPOCH_MISMATCH: Final = "epoch_mismatch"
    """Newer than the forwarded announce: wait for the announce of that epoch (§6.3)."""
    STALE_EPOCH: Final = "stale_epoch"
    """Older than the forwarded announce (§8)."""
    DEST_NOT_READY: Final = "dest_not_ready"
    """No local producer for the mapping: not opened yet, or its open failed (retried)."""
    DESTINATION_ATTACHING: Final = "destination_attaching"
    """The local producer is attaching through the SHM driver; the receiver keeps serving
    its other streams meanwhile instead of waiting for the driver's answer."""
    CHUNK_COUNT_INVALID: Final = "chunk_count_invalid"
    CHUNK_INDEX_OUT_OF_RANGE: Final = "chunk_index_out_of_range"
    HEADER_INCLUDED_INVALID: Final = "header_included_invalid"
    HEADER_FLAG_MISMATCH: Final = "header_flag_mismatch"
    HEADER_LENGTH_INVALID: Final = "chunk_header_length_invalid"
    CHUNK_OFFSET_INVALID: Final = "chunk_offset_invalid"
    CHUNK_LENGTH_MISMATCH: Final = "chunk_length_mismatch"
    CHUNK_TOO_LARGE: Final = "chunk_too_large"
    CHUNK_EMPTY: Final = "chunk_empty"
    CHUNK_OUT_OF_BOUNDS: Final = "chunk_out_of_bounds"
    PAYLOAD_TOO_LARGE: Final = "payload_too_large"
    PAYLOAD_EXCEEDS_SOURCE_STRIDE: Final = "payload_exceeds_source_stride"
    PAYLOAD_EXCEEDS_LOCAL_STRIDE: Final = "payload_exceeds_local_stride"
    STALE_SEQ: Final = "stale_seq"
    """A chunk of a frame already completed or dropped, or older than the one in flight."""
    DUPLICATE: Final = "duplicate_chunk"
    """An identical duplicate (§5.2): ignored, counted here for visibility."""


class FrameDrop:
    """Per-frame drops (§5.2, §5.3, §5.3a, §6 steps 4-7, §8)."""

    ASSEMBLY_TIMEOUT: Final = "assembly_timeout"
    SUPERSEDED: Final = "superseded"
    """Incomplete when a newer frame's chunk arrived (a chunk went missing, §5.3)."""
    EPOCH_CHANGE: Final = "epoch_change"
    CHUNK_CONFLICT: Final = "chunk_conflict"
    CHUNK_OVERLAP: Final = "chunk_overlap"
    CHUNK_INCONSISTENT: Final = "chunk_inconsistent"
    """chunkCount or payloadLength differ between chunks of one frame."""
    COVERAGE_MISMATCH: Final = "coverage_mismatch"
    HEADER_SEQ_MISMATCH: Final = "header_seq_mismatch"
    HEADER_VALUES_LEN_MISMATCH: Final = "header_values_len_mismatch"
    HEADER_POOL_ID_UNKNOWN: Final = "header_pool_id_unknown"
    NO_LOCAL_SLOT: Final = "no_local_slot"
    DEST_LOST: Final = "dest_lost"
    COMMIT_FAILED: Final = "commit_failed"
    # Embedded TensorHeader failures reuse tensorpool.counters.Reason names
    # (dtype_unknown, ndims_out_of_range, values_len_below_extent, payload_offset_nonzero...).


class SendDrop:
    """Frames the sender did not deliver (§5.2 back-pressure, seqlock re-validation)."""

    BACK_PRESSURED: Final = "back_pressured"
    NOT_CONNECTED: Final = "not_connected"
    PUBLICATION_FAILED: Final = "publication_failed"
    SOURCE_OVERWRITTEN: Final = "source_overwritten"
    """The slot changed while its chunks were being sent: the last chunk is withheld, so
    the receiver never completes the frame."""
    PAYLOAD_TOO_LARGE: Final = "payload_too_large"
    NO_ANNOUNCE_SENT: Final = "no_announce_sent"


class ControlDrop:
    """Control-plane messages the bridge refused or could not forward."""

    ANNOUNCE_UNKNOWN_STREAM: Final = "announce_unknown_stream"
    ANNOUNCE_INVALID: Final = "announce_invalid"
    ANNOUNCE_OLD_EPOCH: Final = "announce_old_epoch"
    PROGRESS_UNKNOWN_STREAM: Final = "progress_unknown_stream"
    PROGRESS_EPOCH_MISMATCH: Final = "progress_epoch_mismatch"
    PROGRESS_NO_DESTINATION: Final = "progress_no_destination"
    PROGRESS_EXPIRED: Final = "progress_expired"
    PROGRESS_DISABLED: Final = "progress_disabled"
    QOS_DISABLED: Final = "qos_disabled"
    QOS_UNKNOWN_STREAM: Final = "qos_unknown_stream"
    METADATA_UNKNOWN_STREAM: Final = "metadata_unknown_stream"
    DECODE_ERROR: Final = "decode_error"
    FORWARD_FAILED: Final = "forward_failed"
