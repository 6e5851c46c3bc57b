"""Drop counters keyed by stable reason names.

Every validation rule in tensorpool fails closed: it drops the frame (or rejects the region) and
counts *why*. The reason names below are the vocabulary shared by QoS messages, ``inspect``
output and logs, so they are plain, stable strings defined in exactly one place.

The hot path only does ``counters.increment(Reason.X)`` — one dict lookup and one integer
store — so counting costs about as much as the comparison that triggered it.

QoS mapping (§15.4): the wire carries only ``drops_gap`` (sequence numbers that never arrived)
and ``drops_late`` (the frame was there but unstable or already overwritten when we looked).
``LATE_REASONS`` lists the slot-read reasons that belong to ``drops_late``; gaps are computed
by the consumer from descriptor sequence numbers, not by the slot reader.
"""

from __future__ import annotations

from typing import Final


class Reason:
    """Stable reason names. Values never change once published; add new ones, never reuse."""

    # --- slot read (§8.3, §10.2.1, §15.18, §15.21) -------------------------------------
    HEADER_INDEX_OUT_OF_RANGE: Final = "header_index_out_of_range"
    NOT_COMMITTED: Final = "not_committed"
    SEQ_MISMATCH: Final = "seq_mismatch"
    SEQ_COMMIT_REGRESSED: Final = "seq_commit_regressed"
    TORN_READ: Final = "torn_read"
    HEADER_BYTES_LENGTH_INVALID: Final = "header_bytes_length_invalid"
    EMBEDDED_BLOCK_LENGTH_INVALID: Final = "embedded_block_length_invalid"
    EMBEDDED_TEMPLATE_ID_INVALID: Final = "embedded_template_id_invalid"
    EMBEDDED_SCHEMA_ID_INVALID: Final = "embedded_schema_id_invalid"
    EMBEDDED_VERSION_INVALID: Final = "embedded_version_invalid"
    PAYLOAD_OFFSET_NONZERO: Final = "payload_offset_nonzero"
    PAYLOAD_SLOT_OUT_OF_RANGE: Final = "payload_slot_out_of_range"
    PAYLOAD_SLOT_MISMATCH: Final = "payload_slot_mismatch"
    UNKNOWN_POOL_ID: Final = "unknown_pool_id"
    VALUES_LEN_EXCEEDS_STRIDE: Final = "values_len_exceeds_stride"

    # --- tensor header (§8.2, §15.8) ------------------------------------------------------
    NDIMS_OUT_OF_RANGE: Final = "ndims_out_of_range"
    DTYPE_UNKNOWN: Final = "dtype_unknown"
    MAJOR_ORDER_UNKNOWN: Final = "major_order_unknown"
    PROGRESS_UNIT_UNKNOWN: Final = "progress_unit_unknown"
    DIMS_NEGATIVE: Final = "dims_negative"
    STRIDES_NEGATIVE: Final = "strides_negative"
    STRIDES_INCONSISTENT: Final = "strides_inconsistent"
    PROGRESS_STRIDE_INVALID: Final = "progress_stride_invalid"
    VALUES_LEN_BELOW_EXTENT: Final = "values_len_below_extent"

    # --- producer side (§9) ---------------------------------------------------------------
    NO_POOL_FITS: Final = "no_pool_fits"

    # --- region URI (§4.1, §15.22) ----------------------------------------------------------
    URI_UNKNOWN_SCHEME: Final = "uri_unknown_scheme"
    URI_MALFORMED: Final = "uri_malformed"
    URI_UNKNOWN_PARAMETER: Final = "uri_unknown_parameter"
    URI_DUPLICATE_PARAMETER: Final = "uri_duplicate_parameter"
    URI_MISSING_PATH: Final = "uri_missing_path"
    URI_BAD_BOOL: Final = "uri_bad_bool"

    # --- path containment (§15.21a.5) -----------------------------------------------------
    PATH_NOT_ABSOLUTE: Final = "path_not_absolute"
    PATH_NOT_FOUND: Final = "path_not_found"
    PATH_OUTSIDE_ALLOWED_BASE: Final = "path_outside_allowed_base"
    PATH_NOT_REGULAR_FILE: Final = "path_not_regular_file"
    PATH_OPEN_FAILED: Final = "path_open_failed"
    PATH_IDENTITY_CHANGED: Final = "path_identity_changed"

    # --- backend / hugepages / strides (§15.22) -------------------------------------------
    HUGEPAGES_NOT_VERIFIED: Final = "hugepages_not_verified"
    STRIDE_BYTES_NOT_POWER_OF_TWO: Final = "stride_bytes_not_power_of_two"
    STRIDE_BYTES_NOT_PAGE_MULTIPLE: Final = "stride_bytes_not_page_multiple"
    STRIDE_BYTES_NOT_HUGEPAGE_MULTIPLE: Final = "stride_bytes_not_hugepage_multiple"

    # --- superblock (§7.1, §15.1, §15.5, §15.14) ------------------------------------------
    REGION_TOO_SMALL: Final = "region_too_small"
    SUPERBLOCK_BAD_MAGIC: Final = "superblock_bad_magic"
    SUPERBLOCK_LAYOUT_VERSION_MISMATCH: Final = "superblock_layout_version_mismatch"
    SUPERBLOCK_EPOCH_MISMATCH: Final = "superblock_epoch_mismatch"
    SUPERBLOCK_STREAM_ID_MISMATCH: Final = "superblock_stream_id_mismatch"
    SUPERBLOCK_REGION_TYPE_MISMATCH: Final = "superblock_region_type_mismatch"
    SUPERBLOCK_POOL_ID_MISMATCH: Final = "superblock_pool_id_mismatch"
    SUPERBLOCK_NSLOTS_NOT_POWER_OF_TWO: Final = "superblock_nslots_not_power_of_two"
    SUPERBLOCK_NSLOTS_MISMATCH: Final = "superblock_nslots_mismatch"
    SUPERBLOCK_SLOT_BYTES_MISMATCH: Final = "superblock_slot_bytes_mismatch"
    SUPERBLOCK_STRIDE_BYTES_MISMATCH: Final = "superblock_stride_bytes_mismatch"
    SUPERBLOCK_ACTIVITY_STALE: Final = "superblock_activity_stale"

    # --- resources (issue #13.4) -----------------------------------------------------------
    #: a mapped region file shrank below the mapped length (touching it would be SIGBUS)
    REGION_TRUNCATED: Final = "region_truncated"
    #: region files do not fit the free space of their filesystem
    REGION_NO_SPACE: Final = "region_no_space"
    #: a ring or frame size the wire cannot express (u32 strides and slot counts)
    WIRE_LIMIT_EXCEEDED: Final = "wire_limit_exceeded"


#: Slot-read reasons that a consumer reports as ``drops_late`` (§15.3, §15.4): the frame was
#: announced but the slot was in flight, unstable, or already reused when we looked.
LATE_REASONS: Final[frozenset[str]] = frozenset(
    {Reason.NOT_COMMITTED, Reason.SEQ_MISMATCH, Reason.SEQ_COMMIT_REGRESSED, Reason.TORN_READ}
)

ALL_REASONS: Final[tuple[str, ...]] = tuple(
    value for name, value in vars(Reason).items() if name.isupper() and isinstance(value, str)
)


class DropCounters:
    """Per-reason drop counts; cheap to increment, cheap to snapshot.

    Counts are plain Python ints in a dict pre-seeded with every known reason so the hot path
    never allocates. Unknown reasons are accepted too (other layers may define their own), they
    simply start at zero on first use.
    """

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[str, int] = dict.fromkeys(ALL_REASONS, 0)

    def increment(self, reason: str, n: int = 1) -> None:
        counts = self._counts
        counts[reason] = counts.get(reason, 0) + n

    def get(self, reason: str) -> int:
        return self._counts.get(reason, 0)

    def __getitem__(self, reason: str) -> int:
        return self._counts.get(reason, 0)

    def snapshot(self) -> dict[str, int]:
        """Non-zero counts only, so reports stay short and diffable."""
        return {k: v for k, v in self._counts.items() if v}

    def total(self) -> int:
        return sum(self._counts.values())

    def sum_of(self, reasons: frozenset[str] | set[str] | tuple[str, ...]) -> int:
        """Sum over a reason group, e.g. ``sum_of(LATE_REASONS)`` for QoS ``drops_late``."""
        counts = self._counts
        return sum(counts.get(r, 0) for r in reasons)

    def reset(self) -> None:
        for k in self._counts:
            self._counts[k] = 0

    def __repr__(self) -> str:
        return f"DropCounters({self.snapshot()!r})"


#: Upper bounds (seconds) of :class:`LatencyHistogram` buckets: 100 µs to 10 s, roughly 1-2.5-5.
LATENCY_BUCKETS_S: Final[tuple[float, ...]] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip


class LatencyHistogram:
    """Cumulative-bucket latency counts that a metrics exporter reads at scrape time (#19.1).

    Plain ints, no locks and no dependency: the agent that observes (rarely: an attach) stays
    free of any metrics library, and a reader in another thread sees at worst one observation
    half-counted (the bucket before the sum), which the next scrape corrects.
    """

    __slots__ = ("bounds", "counts", "sum_s")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS_S) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum_s = 0.0

    def observe_ns(self, ns: int) -> None:
        seconds = ns / 1e9
        i = 0
        bounds = self.bounds
        while i < len(bounds) and seconds > bounds[i]:
            i += 1
        self.counts[i] += 1
        self.sum_s += seconds

    def cumulative(self) -> list[tuple[str, int]]:
        """``[(le, count), ...]`` ending with ``+Inf``, as Prometheus buckets are written."""
        out: list[tuple[str, int]] = []
        total = 0
        for bound, n in zip((*map(str, self.bounds), "+Inf"), list(self.counts), strict=True):
            total += n
            out.append((bound, total))
        return out
