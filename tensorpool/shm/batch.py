"""The batch fast path of the seqlock (§8.3): many frames per numpy operation.

Per frame, the Python work costs more than the bytes (issue #15: ~10 interpreter calls per
4 KiB frame). Here each seqlock step is done once for a whole batch of frames of one stream:

Reader (:class:`BatchReader`), given the descriptors' ``seq`` and ``header_index`` arrays::

    w1 = seq_commit[idx]                 # one numpy gather: one aligned 8-byte load per slot
    drop rows: index out of range, not committed, seq mismatch, regressed (§15.3)
    fields = slots[idx]                  # one gather of the slot records, validated vectorized
    payload: zero-copy stacked view (consecutive slots), or one gather into an owned array
    w2 = seq_commit[idx]                 # one gather; rows where w2 != w1 are torn
    (zero-copy: :meth:`BatchReader.confirm` repeats this load after the caller used the views)

Writer (:class:`BatchWriter`), for ``n`` consecutive seqs (consecutive slots, split at the wrap)::

    seq_commit[i0:i0+n] = seq << 1       # in progress, one strided store pass
    payload rows                         # one strided copy (caller fills a claim, or copyto)
    slot fields, one strided store per field; TensorHeader blob, one broadcast store
    seq_commit[i0:i0+n] = seq << 1 | 1   # committed, one strided store pass

Every rule of :class:`~tensorpool.shm.seqlock.SlotReader` applies row by row with the same
reason names and the same counters (a row's reason is the first rule it fails, in the
per-frame reader's order; a header that fails validation while its word changed is
``torn_read``). Why the vectorized order is as safe as the per-frame one on x86-64, and why
other CPUs stay refused, is in the memory-ordering notes of :mod:`tensorpool.shm.seqlock`.

The reader shares its per-slot state (highest accepted commit word, validated layouts) and its
counters with the :class:`SlotReader` it is built from, so a consumer may mix both paths.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter
from typing import Final

import numpy as np

from tensorpool.counters import Reason
from tensorpool.shm.errors import TensorLayoutError
from tensorpool.shm.layout import (
    HEADER_SLOT_BYTES,
    SLOT_FIELDS_OFFSET,
    SLOT_FIELDS_READ,
    SUPERBLOCK_SIZE,
    TENSOR_BLOB_END,
    TENSOR_BLOB_OFFSET,
    TENSOR_BLOB_READ,
)
from tensorpool.shm.ring import SLOT_DTYPE
from tensorpool.shm.seqlock import MAX_SEQ, SlotRead, SlotReader, SlotWriter
from tensorpool.shm.tensor import TensorLayout

_ONE: Final = np.uint64(1)
_WORDS_PER_SLOT: Final = HEADER_SLOT_BYTES // 8
_KNOWN_LAYOUTS_MAX: Final = 1024
_KEY_FIRST_WORD: Final = TENSOR_BLOB_OFFSET // 8  # word 7: bytes [56, 64)
_KEY_END_WORD: Final = -(-TENSOR_BLOB_END // 8)  # word 19: bytes up to 152
_BLOB_IN_ROW: Final = TENSOR_BLOB_OFFSET - 8 * _KEY_FIRST_WORD
_BLOB_IN_ROW_END: Final = TENSOR_BLOB_END - 8 * _KEY_FIRST_WORD
_PAD_START: Final = SLOT_FIELDS_OFFSET + SLOT_FIELDS_READ.size  # SlotHeader pad [34, 60)

#: Per-row outcome codes of a batch read (0: accepted). ``REASONS[code]`` is the counter name.
OK: Final = 0
REASONS: Final[tuple[str, ...]] = (
    "",
    Reason.HEADER_INDEX_OUT_OF_RANGE,
    Reason.NOT_COMMITTED,
    Reason.SEQ_MISMATCH,
    Reason.SEQ_COMMIT_REGRESSED,
    "layout",  # placeholder: a layout failure is counted under the layout error's own reason
    Reason.PAYLOAD_OFFSET_NONZERO,
    Reason.PAYLOAD_SLOT_OUT_OF_RANGE,
    Reason.PAYLOAD_SLOT_MISMATCH,
    Reason.UNKNOWN_POOL_ID,
    Reason.VALUES_LEN_EXCEEDS_STRIDE,
    Reason.VALUES_LEN_BELOW_EXTENT,
    Reason.TORN_READ,
)
_CODE_OF: Final = {reason: code for code, reason in enumerate(REASONS) if code}
_RANGE, _NOT_COMMITTED, _SEQ_MISMATCH, _REGRESSED, _LAYOUT = 1, 2, 3, 4, 5
_OFFSET, _SLOT_RANGE, _SLOT_MISMATCH, _POOL, _LEN_STRIDE, _LEN_EXTENT, _TORN = (
    6,
    7,
    8,
    9,
    10,
    11,
    12,
)


class SlotBatch:
    """Frames read by one :meth:`BatchReader.read` (one stream, one mapping).

    Row ``k`` is descriptor ``k`` of the batch; ``valid[k]`` says whether it was accepted.
    ``array`` is a stacked ``(n, *shape)`` ndarray when every accepted row shares one layout
    and pool (rows not accepted hold whatever the slot held: mask them with ``valid``); else
    it is None and ``arrays`` holds one array per row (None for rows not accepted or empty).
    Zero-copy batches (``copied`` False) view the producer's slots: valid until the next
    read, and only trustworthy after :meth:`BatchReader.confirm` (see seqlock's notes).
    """

    __slots__ = (
        "_arrays",
        "_one",
        "_reader",
        "array",
        "codes",
        "commit_words",
        "confirmed",
        "copied",
        "epoch",
        "header_index",
        "layout",
        "layout_reasons",
        "meta_versions",
        "on_confirm",
        "pool_id",
        "seqs",
        "stream_id",
        "timestamps_ns",
        "valid",
        "values_len",
    )

    def __init__(
        self,
        seqs: np.ndarray,
        header_index: np.ndarray,
        commit_words: np.ndarray,
        timestamps_ns: np.ndarray,
        meta_versions: np.ndarray,
        values_len: np.ndarray,
        pool_id: np.ndarray,
        codes: np.ndarray,
        layout: TensorLayout | None,
        array: np.ndarray | None,
        arrays: list[np.ndarray | None] | None,
        copied: bool,
        valid: np.ndarray | None = None,
    ) -> None:
        self.seqs = seqs
        self.header_index = header_index
        self.commit_words = commit_words
        self.timestamps_ns = timestamps_ns
        self.meta_versions = meta_versions
        self.values_len = values_len
        self.pool_id = pool_id
        self.codes = codes
        self.valid = codes == OK if valid is None else valid
        self.layout = layout
        self.array = array
        self._arrays = arrays
        self.copied = copied
        self.confirmed = copied
        self.layout_reasons: dict[int, str] = {}
        self._reader: BatchReader | None = None
        #: one accepted row (:class:`RowBatch`): slot, commit word and values_len as ints,
        #: so the final check and the stats need no numpy call
        self._one: tuple[int, int, int] | None = None
        #: called once after the final check (the consumer counts accepted frames there)
        self.on_confirm: Callable[[SlotBatch], object] | None = None
        self.stream_id = 0
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.seqs)

    def confirm(self) -> int:
        """The zero-copy contract's last step: re-check the commit words after the views
        were used; rows overwritten meanwhile become ``torn_read`` (counted) and leave
        ``valid``. Returns the rows accepted. Idempotent; a copied batch is already final."""
        if not self.confirmed:
            reader = self._reader
            if reader is None:
                self.confirmed = True
            else:
                reader.confirm(self)
        cb = self.on_confirm
        if cb is not None:
            self.on_confirm = None
            cb(self)
        if self._one is not None:  # one accepted row (a paced stream): no numpy call
            return 1
        return int(np.count_nonzero(self.valid))

    @property
    def count(self) -> int:
        """Accepted rows."""
        return int(np.count_nonzero(self.valid))

    @property
    def arrays(self) -> list[np.ndarray | None]:
        """One array (or None) per row; built from ``array`` when the batch is stacked."""
        if self._arrays is None:
            arr = self.array
            self._arrays = [
                arr[k] if ok and arr is not None else None for k, ok in enumerate(self.valid)
            ]
        return self._arrays

    def reasons(self) -> list[str]:
        """The drop reason of each row ('' when accepted)."""
        lr = self.layout_reasons
        return [
            lr.get(k, "") if c == _LAYOUT else REASONS[c] for k, c in enumerate(self.codes.tolist())
        ]


def _row_column(name: str, make: Callable[[RowBatch], np.ndarray]) -> property:
    """A column of a :class:`RowBatch`, made on first use and kept in the :class:`SlotBatch`
    slot of the same name (which the property shadows)."""
    slot = SlotBatch.__dict__[name]

    def get(self: RowBatch) -> np.ndarray:
        try:
            return slot.__get__(self, SlotBatch)  # type: ignore[no-any-return]
        except AttributeError:
            col = make(self)
            slot.__set__(self, col)
            return col

    return property(get, doc=f"``{name}`` of the one row (built when first read).")


class RowBatch(SlotBatch):
    """A one-frame batch read by :meth:`BatchReader.read_one` (a paced stream's poll).

    The same object as any :class:`SlotBatch` to its callers, but its columns (``valid`` and
    ``codes`` too) are built only when read, and ``confirm()`` and the consumer's stats use
    plain ints while ``_one`` is set (the row is accepted; a torn row clears it). Each numpy
    call costs about what the whole per-frame check does, several times that in the cold
    caches of a consumer that waited a millisecond for its frame: a paced batch consumer
    would otherwise trail ``poll()``'s latency (issue #15). Each batch is a new object with
    its own columns: nothing a caller keeps is ever reused.
    """

    __slots__ = ("_got",)

    seqs = _row_column("seqs", lambda b: np.array([b._got.seq], np.int64))
    header_index = _row_column("header_index", lambda b: np.array([b._got.header_index], np.int64))
    commit_words = _row_column("commit_words", lambda b: np.array([b._got.commit_word], np.uint64))
    timestamps_ns = _row_column(
        "timestamps_ns", lambda b: np.array([b._got.timestamp_ns], np.uint64)
    )
    meta_versions = _row_column(
        "meta_versions", lambda b: np.array([b._got.meta_version], np.int64)
    )
    values_len = _row_column("values_len", lambda b: np.array([b._got.values_len_bytes], np.int64))
    pool_id = _row_column("pool_id", lambda b: np.array([b._got.pool_id], np.int64))
    codes = _row_column("codes", lambda b: _ROW_OK.copy() if b._one else np.full(1, _TORN, np.int8))
    valid = _row_column("valid", lambda b: _ROW_VALID.copy() if b._one else np.zeros(1, bool))

    def __init__(self, got: SlotRead, reader: BatchReader, copy: bool) -> None:
        # SlotBatch.__init__ would store the columns; set everything else it sets
        self._got = got
        self.layout = got.layout
        arr = got.array
        self.array = None if arr is None else arr[None]  # (1, *shape): the slot (or a copy)
        self._arrays = [None] if arr is None else None
        self.copied = copy
        self.confirmed = copy
        self.layout_reasons = {}
        self._reader = reader
        self._one = (got.header_index, got.commit_word, got.values_len_bytes)
        self.on_confirm = None
        self.stream_id = 0
        self.epoch = 0

    def __len__(self) -> int:
        return 1


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


_EMPTY_I64: Final = _frozen(np.zeros(0, np.int64))
_EMPTY_I8: Final = _frozen(np.zeros(0, np.int8))
_EMPTY_BOOL: Final = _frozen(np.zeros(0, bool))
#: templates of a one-row batch's ``codes`` and ``valid``: ``copy()`` is ~5x cheaper than
#: ``np.zeros``/``np.ones`` plus a compare
_ROW_OK: Final = _frozen(np.zeros(1, np.int8))
_ROW_VALID: Final = _frozen(np.ones(1, bool))


def empty_batch() -> SlotBatch:
    """A batch of no frames (nothing arrived): shared read-only zero-length columns, so an
    empty poll of a busy-spinning consumer allocates one object."""
    z = _EMPTY_I64
    return SlotBatch(z, z, z, z, z, z, z, _EMPTY_I8, None, None, [], True, _EMPTY_BOOL)


class BatchReader:
    """Vectorized seqlock reader over a :class:`SlotReader`'s mapping (shares its state)."""

    __slots__ = (
        "_closed",
        "_field_rows",
        "_field_tmpl",
        "_full",
        "_index",
        "_key",
        "_key_rows",
        "_no_codes",
        "_pool_u8",
        "_reader",
        "_slots",
        "_steps",
        "_stride",
        "_tmpl_len",
        "_tmpl_pool",
        "_tmpl_pools",
        "_words",
        "nslots",
    )

    def __init__(self, reader: SlotReader) -> None:
        self._reader = reader
        self._closed = False
        hmm = reader._hmm
        n = reader.nslots
        self.nslots = n
        size = SUPERBLOCK_SIZE + n * HEADER_SLOT_BYTES
        self._words = np.frombuffer(hmm, np.uint64, size // 8)[
            SUPERBLOCK_SIZE // 8 :: _WORDS_PER_SLOT
        ]
        self._slots = np.frombuffer(hmm, SLOT_DTYPE, n, SUPERBLOCK_SIZE)
        # header words [56, 152) of every slot: the TensorHeader bytes [60, 147) inside, with
        # the pads on both sides (zero-filled by writers); one row compare per slot finds a
        # layout already validated
        rows64 = np.frombuffer(hmm, np.uint64, n * _WORDS_PER_SLOT, SUPERBLOCK_SIZE)
        self._key_rows = rows64.reshape(n, _WORDS_PER_SLOT)[:, _KEY_FIRST_WORD:_KEY_END_WORD]
        self._key: tuple[np.ndarray, TensorLayout, bytes] | None = None
        self._index = np.arange(n, dtype=np.int64)
        # slot bytes [8, 22) as u16: values_len, payload_slot, pool_id, payload_offset
        rows16 = np.frombuffer(hmm, np.uint16, n * (HEADER_SLOT_BYTES // 2), SUPERBLOCK_SIZE)
        first16 = SLOT_FIELDS_OFFSET // 2
        self._field_rows = rows16.reshape(n, HEADER_SLOT_BYTES // 2)[:, first16 : first16 + 7]
        self._field_tmpl = np.zeros((n, 7), np.uint16)
        self._field_tmpl[:, 2] = self._index & 0xFFFF
        self._field_tmpl[:, 3] = self._index >> 16
        self._tmpl_pool = -1
        self._tmpl_len = np.zeros(n, np.int64)
        self._tmpl_pools = np.zeros(n, np.int64)
        self._no_codes = np.zeros(n, np.int8)
        self._steps = np.arange(0, 2 * n, 2, dtype=np.uint64)
        self._stride = dict(reader._pool_stride)
        self._pool_u8 = {
            pid: np.frombuffer(mm, np.uint8, n * self._stride[pid], SUPERBLOCK_SIZE)
            for pid, mm in reader._pool_mm.items()
        }
        # (pool_id, layout blob) -> (nslots, *dims) view of the whole pool with that layout
        self._full: dict[tuple[int, bytes], np.ndarray] = {}

    def close(self) -> None:
        """Drop the views of the mapping (batches still open count as torn when confirmed)."""
        self._closed = True
        self._words = np.empty(0, np.uint64)
        self._slots = np.empty(0, SLOT_DTYPE)
        self._key_rows = np.empty((0, _KEY_END_WORD - _KEY_FIRST_WORD), np.uint64)
        self._field_rows = np.empty((0, 7), np.uint16)
        self._pool_u8 = {}
        self._full = {}
        self._key = None

    def slot_seqs(self, header_index: np.ndarray) -> np.ndarray:
        """The seq each of these slots holds now (committed or in progress): the batch form of
        :meth:`SlotReader.slot_seq`, a hint for how far ahead the producer is (§15.4)."""
        return (self._words[header_index] >> _ONE).astype(np.int64)

    def lapped_head(self, seq: int) -> int:
        """The producer's position if it is at least half a ring past ``seq``, else -1: the
        batch consumer's test for "this run is being overwritten" (see
        :meth:`ConsumerCore.accept_run`). One load answers the common case: the slot of
        ``seq + nslots/2`` holds that seq or a later lap only once the producer got there. The
        max over all slots is taken only then, and capped one lap past that slot's seq, so a
        single bad word cannot make the consumer skip more than a ring."""
        mask = self.nslots - 1
        probe = seq + ((mask + 1) >> 1)
        words = self._words
        if len(words) <= mask:  # closed
            return -1
        held = int(words[probe & mask]) >> 1
        if held < probe or (held - probe) & mask:
            return -1
        return min(int(words.max()) >> 1, held + mask)

    def _layout_of(self, key: bytes) -> TensorLayout | str:
        known = self._reader._known
        layout = known.get(key)
        if layout is None:
            try:
                layout = TensorLayout.from_blob_fields(TENSOR_BLOB_READ.unpack(key))
            except TensorLayoutError as exc:
                return exc.reason
            if len(known) >= _KNOWN_LAYOUTS_MAX:
                known.clear()
            known[key] = layout
        return layout

    def _pool_view(self, pool_id: int, key: bytes, layout: TensorLayout) -> np.ndarray:
        full = self._full.get((pool_id, key))
        if full is None:
            stride = self._stride[pool_id]
            full = np.ndarray(
                (self.nslots, *layout.dims),
                layout.np_dtype,
                self._pool_u8[pool_id],
                0,
                (stride, *layout.strides),
            )
            if len(self._full) >= 64:
                self._full.clear()
            self._full[(pool_id, key)] = full
        return full

    def _layout_row(self, row: np.ndarray) -> TensorLayout | str:
        """Layout of one slot from a copy of its header words ``[56, 152)`` (the blob inside)."""
        return self._layout_of(row.tobytes()[_BLOB_IN_ROW:_BLOB_IN_ROW_END])

    def read_run(self, first_seq: int, n: int, copy: bool = False) -> SlotBatch:
        """:meth:`read` for the frames ``first_seq .. first_seq+n-1`` (their own slots): the
        common case of a consumer keeping up, checked with a handful of whole-batch compares.
        Any row that fails a check sends the whole batch through :meth:`read`, which counts
        every row exactly as the per-frame reader would."""
        nslots = self.nslots
        i0 = first_seq & (nslots - 1)
        if n <= 0 or i0 + n > nslots or first_seq < 0 or first_seq + n - 1 > MAX_SEQ:
            return self._general(first_seq, n, copy)
        words = self._words
        w1 = words[i0 : i0 + n].copy()  # §8.3 first load, one aligned 8-byte load per slot
        lo = (first_seq << 1) | 1
        lc = self._reader._last_commit
        cached = self._key
        if not (
            cached is not None
            and bool((w1 == self._steps[:n] + np.uint64(lo)).all())
            and lo > max(lc)  # no slot can have gone back (§15.3)
            and bool((self._key_rows[i0 : i0 + n] == cached[0]).all())
        ):
            return self._general(first_seq, n, copy)
        # values_len, payload_slot, pool_id, payload_offset of every slot against a template
        # (the first slot's values_len and pool, each slot's own index, offset 0)
        fields = self._field_rows[i0 : i0 + n]
        tmpl = self._field_tmpl[i0 : i0 + n]
        if not bool((fields == tmpl).all()) and not (
            self._retemplate(i0, cached[1]) and bool((fields == tmpl).all())
        ):
            return self._general(first_seq, n, copy)
        sl = self._slots[i0 : i0 + n]
        ts = sl["timestamp_ns"].copy()
        mv = sl["meta_version"].copy()
        layout = cached[1]
        array = self._pool_view(self._tmpl_pool, cached[2], layout)[i0 : i0 + n]
        if copy:
            array = array.copy()  # one copy into owned memory, before the second load
        if not bool((words[i0 : i0 + n] == w1).all()):  # §8.3 second load
            return self._general(first_seq, n, copy)
        seqs = self._index[:n] + first_seq
        idx = self._index[i0 : i0 + n]
        batch = SlotBatch(
            seqs,
            idx,
            w1,
            ts,
            mv,
            self._tmpl_len[:n],
            self._tmpl_pools[:n],
            self._no_codes[:n].copy(),
            layout,
            array,
            None,
            copy,
        )
        batch._reader = self
        if copy:
            lc[i0 : i0 + n] = w1.tolist()
        return batch

    def _retemplate(self, i0: int, layout: TensorLayout) -> bool:
        """Rebuild the field template from slot ``i0`` (a new frame size or pool); False when
        that slot itself would fail validation (the general path then says why)."""
        row = self._slots[i0]
        v0 = int(row["values_len"])
        p0 = int(row["pool_id"])
        stride = self._stride.get(p0, 0)
        if not stride or not (v0 == 0 or layout.extent_bytes <= v0 <= stride):
            return False
        tmpl = self._field_tmpl
        tmpl[:, 0] = v0 & 0xFFFF
        tmpl[:, 1] = v0 >> 16
        tmpl[:, 4] = p0
        self._tmpl_pool = p0
        self._tmpl_len[:] = v0
        self._tmpl_pools[:] = p0
        return True

    def read_one(self, seq: int, header_index: int, copy: bool = False) -> SlotBatch:
        """One descriptor: the per-frame reader's checks (cheaper than a dozen numpy calls for
        a single row, so a paced stream keeps the per-frame latency), as a one-row batch."""
        reader = self._reader
        got = reader.read(header_index, seq, copy)
        if got is None:
            reason = reader.last_drop_reason or ""
            code = _CODE_OF.get(reason, _LAYOUT)
            z = np.zeros(1, np.int64)
            index = header_index if 0 <= header_index < self.nslots else 0
            batch = SlotBatch(
                np.array([seq], np.int64), np.array([index], np.int64), z, z, z, z, z,
                np.array([code], np.int8), None, None, [None], True,
            )  # fmt: skip
            if code == _LAYOUT:
                batch.layout_reasons = {0: reason}
            return batch
        return RowBatch(got, self, copy)

    def _general(self, first_seq: int, n: int, copy: bool) -> SlotBatch:
        seqs = np.arange(first_seq, first_seq + max(n, 0), dtype=np.int64)
        return self.read(seqs, seqs & (self.nslots - 1), copy)

    def read(self, seqs: np.ndarray, header_index: np.ndarray, copy: bool = False) -> SlotBatch:
        """Validate frames ``seqs`` in slots ``header_index`` (a batch of descriptors).

        Drops are counted in the shared counters per row, exactly as :meth:`SlotReader.read`
        would. ``copy=True`` gathers the payloads into owned memory before the second commit
        word load (no confirm needed); zero-copy batches need :meth:`confirm` after use.
        A zero-copy read of slots that are not consecutive (or wrap) is copied too: there is
        no single view of them.
        """
        n = len(seqs)
        if n == 0:
            return empty_batch()
        reader = self._reader
        nslots = self.nslots
        idx = np.asarray(header_index, np.int64)
        seqs = np.asarray(seqs, np.int64)
        codes = np.zeros(n, np.int8)
        if int(idx.min()) < 0 or int(idx.max()) >= nslots:
            bad_range = (idx < 0) | (idx >= nslots)
            codes[bad_range] = _RANGE
            idx = np.where(bad_range, 0, idx)
        i0 = int(idx[0])
        contig = int(idx[-1]) - i0 == n - 1 and bool(codes[0] == OK)
        words = self._words
        w1 = words[i0 : i0 + n].copy() if contig else words[idx]  # §8.3 first load
        expect = (seqs.astype(np.uint64) << _ONE) | _ONE
        if not np.array_equal(w1, expect):
            miss = (codes == OK) & (w1 != expect)
            codes[miss & ((w1 & _ONE) == 0)] = _NOT_COMMITTED
            codes[miss & ((w1 & _ONE) == _ONE)] = _SEQ_MISMATCH
        lc = reader._last_commit
        last = (
            np.fromiter(itemgetter(*idx.tolist())(lc), np.uint64, n)
            if n > 1
            else np.array([lc[i0]], np.uint64)
        )
        if (w1 < last).any():
            codes[(codes == OK) & (w1 < last)] = _REGRESSED
        # the slot fields, copied between the two loads (views of consecutive slots, or gathers)
        if contig:
            sl = self._slots[i0 : i0 + n]
            key_rows = self._key_rows[i0 : i0 + n]
        else:
            sl = self._slots[idx]
            key_rows = self._key_rows[idx]
        vlen = sl["values_len"].astype(np.int64)
        pslot = sl["payload_slot"].astype(np.int64)
        pool = sl["pool_id"].astype(np.int64)
        offset_bad = sl["payload_offset"] != 0
        ts = sl["timestamp_ns"].copy()
        mv = sl["meta_version"].copy()
        ok = codes == OK
        layout: TensorLayout | None = None
        layouts: list[TensorLayout | None] | None = None
        layout_keys: list[bytes | None] | None = None
        layout_reasons: dict[int, str] = {}
        cached = self._key
        if cached is not None and bool((key_rows == cached[0]).all()):
            layout = cached[1]  # every slot holds the layout seen last time: the common case
            layout_key = cached[2]
        elif ok.any():
            rows_copy = key_rows.copy() if contig else key_rows
            first = int(np.argmax(ok))
            got = self._layout_row(rows_copy[first])
            same = (rows_copy == rows_copy[first]).all(axis=1)
            if isinstance(got, TensorLayout) and bool(same[ok].all()):
                layout = got
                layout_key = rows_copy[first].tobytes()
                self._key = (rows_copy[first].copy(), got, layout_key)
            else:
                layouts = [None] * n
                layout_keys = [None] * n
                for k in np.flatnonzero(ok).tolist():
                    g = got if same[k] else self._layout_row(rows_copy[k])
                    if isinstance(g, TensorLayout):
                        layouts[k] = g
                        layout_keys[k] = rows_copy[k].tobytes()
                    else:
                        codes[k] = _LAYOUT
                        layout_reasons[k] = g
                ok = codes == OK
                if isinstance(got, TensorLayout) and bool(same[ok].all()):
                    # only the rows that failed differed: the rest still share one layout
                    layout, layouts, layout_keys = got, None, None
                    layout_key = rows_copy[first].tobytes()
        if offset_bad.any():
            codes[ok & offset_bad] = _OFFSET
            ok = codes == OK
        if not np.array_equal(pslot, idx):
            codes[ok & (pslot != idx) & (pslot >= nslots)] = _SLOT_RANGE
            codes[ok & (pslot != idx) & (pslot < nslots)] = _SLOT_MISMATCH
            ok = codes == OK
        pid0 = int(pool[0])
        stride0 = self._stride.get(pid0, 0)
        if stride0 and bool((pool == pid0).all()):
            stride: np.ndarray | int = stride0
        else:
            stride = np.zeros(n, np.int64)
            for pid, s in self._stride.items():
                stride[pool == pid] = s
            codes[ok & (stride == 0)] = _POOL
            ok = codes == OK
        if (vlen > stride).any():
            codes[ok & (vlen > stride)] = _LEN_STRIDE
            ok = codes == OK
        if layout is not None:
            extent: np.ndarray | int = layout.extent_bytes
        elif layouts is not None:
            extent = np.array([0 if x is None else x.extent_bytes for x in layouts], np.int64)
        else:
            extent = 0  # no row left to check
        short = (vlen != 0) & (vlen < extent)
        if short.any():
            codes[ok & short] = _LEN_EXTENT
            ok = codes == OK
        # payload: one stacked array when the accepted rows share layout and pool
        array: np.ndarray | None = None
        arrays: list[np.ndarray | None] | None = None
        rows = np.flatnonzero(ok)
        if len(rows):
            k0 = int(rows[0])
            pidk = int(pool[k0])
            if layout is not None and bool((pool[rows] == pidk).all()):
                full = self._pool_view(pidk, layout_key, layout)
                if not copy and contig:
                    array = full[i0 : i0 + n]  # consecutive slots, no wrap: a zero-copy view
                elif contig:
                    array = full[i0 : i0 + n].copy()  # one copy into owned memory
                else:
                    array = full[idx]  # one gather into owned memory
                    copy = True
            else:
                arrays = [None] * n
                for k in rows.tolist():
                    lay = layout if layout is not None else layouts[k]  # type: ignore[index]
                    key = layout_key if layout is not None else layout_keys[k]  # type: ignore[index]
                    if vlen[k] == 0 or lay is None:
                        continue
                    view = self._pool_view(int(pool[k]), key, lay)[int(idx[k])]  # type: ignore[arg-type]
                    arrays[k] = view.copy() if copy else view
        w2 = words[i0 : i0 + n] if contig else words[idx]  # §8.3 second load, after the reads
        changed = w2 != w1
        if changed.any():
            # accepted rows, and header failures seen while the producer rewrote the slot
            torn = changed & (ok | ((codes >= _LAYOUT) & (codes <= _LEN_EXTENT)))
            codes[torn] = _TORN
            for k in np.flatnonzero(torn).tolist():
                layout_reasons.pop(k, None)
        bad = codes != OK
        if bad.any():
            counters = reader.counters
            counts = np.bincount(codes[bad], minlength=len(REASONS))
            for code in np.flatnonzero(counts).tolist():
                if code == _LAYOUT:
                    for reason in layout_reasons.values():
                        counters.increment(reason)
                else:
                    counters.increment(REASONS[code], int(counts[code]))
            k = int(np.flatnonzero(bad)[-1])
            reader.last_drop_reason = layout_reasons.get(k) or REASONS[int(codes[k])]
            if arrays is not None:
                for k in np.flatnonzero(bad).tolist():
                    arrays[k] = None
        batch = SlotBatch(seqs, idx, w1, ts, mv, vlen, pool, codes, layout, array, arrays, copy)
        batch._reader = self
        batch.layout_reasons = layout_reasons
        if copy:
            good = ~bad
            for i, w in zip(idx[good].tolist(), w1[good].tolist(), strict=True):
                lc[i] = w
        return batch

    def confirm(self, batch: SlotBatch) -> int:
        """Re-load the commit words after a zero-copy batch was used; rows whose word moved are
        ``torn_read`` (counted) and leave ``valid``. Returns the rows still valid. Idempotent."""
        one = batch._one
        if one is not None and not batch.confirmed and not self._closed:
            # a row from read_one (a paced stream): the per-frame reader's check, plain ints
            # (a changed word goes on below, which counts the torn row)
            i, word, _ = one
            if self._words[i] == word:
                batch.confirmed = True
                self._reader._last_commit[i] = word
                return 1
        if batch.confirmed:
            return int(np.count_nonzero(batch.valid))
        batch.confirmed = True
        valid = batch.valid
        if not valid.any():
            return 0
        idx = batch.header_index
        if len(idx) == 1 and not self._closed:  # one row: plain ints beat numpy calls
            i = int(idx[0])
            word = int(batch.commit_words[0])
            if int(self._words[i]) == word:
                self._reader._last_commit[i] = word
                return 1
            torn = valid.copy()
        else:
            # a closed reader: the mapping went away under the batch, nothing is proven
            torn = (
                valid.copy() if self._closed else valid & (self._words[idx] != batch.commit_words)
            )
        reader = self._reader
        if torn.any():
            batch._one = None  # a RowBatch's row is no longer accepted
            batch.codes[torn] = _TORN
            valid &= ~torn
            n = int(np.count_nonzero(torn))
            reader.counters.increment(Reason.TORN_READ, n)
            reader.last_drop_reason = Reason.TORN_READ
        lc = reader._last_commit
        n = len(idx)
        i0 = int(idx[0])
        if int(idx[-1]) - i0 == n - 1 and bool(valid.all()):
            lc[i0 : i0 + n] = batch.commit_words.tolist()
        else:
            for i, w in zip(idx[valid].tolist(), batch.commit_words[valid].tolist(), strict=True):
                lc[i] = w
        return int(np.count_nonzero(valid))


class BatchClaim:
    """Consecutive slots handed out by :meth:`BatchWriter.claim`: fill ``array`` (``(n,
    *dims)``, a writable strided view of the payload slots), then commit."""

    __slots__ = ("array", "first_seq", "header_index", "layout", "n", "pool_id")

    def __init__(
        self, first_seq: int, n: int, header_index: int, pool_id: int, layout: TensorLayout,
        array: np.ndarray,
    ) -> None:  # fmt: skip
        self.first_seq = first_seq
        self.n = n
        self.header_index = header_index
        self.pool_id = pool_id
        self.layout = layout
        self.array = array


class BatchWriter:
    """Vectorized single writer over a :class:`SlotWriter`'s mapping (§8.3 order per row)."""

    __slots__ = (
        "_blob_rows",
        "_full",
        "_mask",
        "_pad_rows",
        "_slots",
        "_words",
        "nslots",
        "writer",
    )

    def __init__(self, writer: SlotWriter) -> None:
        self.writer = writer
        n = writer.nslots
        self.nslots = n
        self._mask = n - 1
        hmm = writer._hmm
        size = SUPERBLOCK_SIZE + n * HEADER_SLOT_BYTES
        self._words = np.frombuffer(hmm, np.uint64, size // 8)[
            SUPERBLOCK_SIZE // 8 :: _WORDS_PER_SLOT
        ]
        self._slots = np.frombuffer(hmm, SLOT_DTYPE, n, SUPERBLOCK_SIZE)
        # the TensorHeader part of every slot as raw bytes [60, 256)
        raw = np.frombuffer(hmm, np.uint8, n * HEADER_SLOT_BYTES, SUPERBLOCK_SIZE)
        rows = raw.reshape(n, HEADER_SLOT_BYTES)
        self._blob_rows = rows[:, TENSOR_BLOB_OFFSET:]
        self._pad_rows = rows[:, _PAD_START:TENSOR_BLOB_OFFSET]
        self._full: dict[tuple[int, TensorLayout], np.ndarray] = {}

    def claim(self, first_seq: int, n: int, layout: TensorLayout, pool_id: int) -> BatchClaim:
        """Mark up to ``n`` consecutive slots from ``first_seq`` in progress (one store pass);
        stops at the ring's wrap, so the claim may hold fewer rows than asked."""
        if first_seq < 0 or first_seq + n - 1 > MAX_SEQ:
            raise ValueError(f"seq {first_seq}+{n} outside 0..2**63-1")
        i0 = first_seq & self._mask
        n = min(n, self.nslots - i0)
        seqs = np.arange(first_seq, first_seq + n, dtype=np.uint64)
        self._words[i0 : i0 + n] = seqs << _ONE  # §8.3 step 1 for every row
        full = self._full.get((pool_id, layout))
        if full is None:
            w = self.writer
            stride = w._pool_stride[pool_id]
            full = np.ndarray(
                (self.nslots, *layout.dims),
                layout.np_dtype,
                w._pool_u8[pool_id],
                SUPERBLOCK_SIZE,
                (stride, *layout.strides),
            )
            if len(self._full) >= 64:
                self._full.clear()
            self._full[(pool_id, layout)] = full
        return BatchClaim(first_seq, n, i0, pool_id, layout, full[i0 : i0 + n])

    def commit(
        self,
        claim: BatchClaim,
        timestamps_ns: np.ndarray | int,
        meta_version: int,
        values_len_bytes: int | None = None,
    ) -> None:
        """Headers (one strided store per field, the TensorHeader blob broadcast), then the
        committed words (one store pass): §8.3 steps 3 and 4 for every row of the claim."""
        self.write_headers(claim, timestamps_ns, meta_version, values_len_bytes)
        i0, n = claim.header_index, claim.n
        seqs = np.arange(claim.first_seq, claim.first_seq + n, dtype=np.uint64)
        self._words[i0 : i0 + n] = (seqs << _ONE) | _ONE  # §8.3 step 4 for every row

    def write_headers(
        self,
        claim: BatchClaim,
        timestamps_ns: np.ndarray | int,
        meta_version: int,
        values_len_bytes: int | None = None,
    ) -> None:
        """§8.3 step 3 for every row, slots still in progress. :meth:`commit` calls it; a
        producer reporting FrameProgress calls it at the claim too, so prefix readers find the
        frames' layout while they are written (Wire §10.2.2)."""
        i0, n = claim.header_index, claim.n
        layout = claim.layout
        nbytes = layout.extent_bytes if values_len_bytes is None else values_len_bytes
        slots = self._slots[i0 : i0 + n]
        slots["values_len"] = nbytes
        slots["payload_slot"] = np.arange(i0, i0 + n, dtype=np.uint32)
        slots["pool_id"] = claim.pool_id
        slots["payload_offset"] = 0
        slots["timestamp_ns"] = timestamps_ns
        slots["meta_version"] = meta_version
        self._pad_rows[i0 : i0 + n] = 0  # the per-frame writer's full overwrite zeroes it too
        self._blob_rows[i0 : i0 + n] = np.frombuffer(layout.blob, np.uint8)
