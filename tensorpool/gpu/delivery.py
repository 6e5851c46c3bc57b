"""Device delivery for the batch consumer API: a host batch's payloads, into GPU memory, checked.

``Consumer.poll_batch(n, device="cuda:0")`` takes a zero-copy host batch (the seqlock's first
load and every header check, :mod:`tensorpool.shm.batch`) and hands it here:

1. each pool the consumer maps is registered once with CUDA (:mod:`tensorpool.gpu.registry`
   decides, :mod:`tensorpool.gpu.cuda` executes), so the copies below run by DMA;
2. the payload rows are copied with asynchronous copies on a CUDA stream into a device buffer:
   one 2D copy per contiguous run of slots (a batch never crosses the ring's wrap, so one per
   stacked batch), one copy per row for mixed-layout batches;
3. the stream is synchronized (``wait=True``) or an event is recorded (``wait=False``: the
   batch's :meth:`DeviceBatch.confirm` waits on it);
4. then the commit words are re-loaded (:meth:`SlotBatch.confirm`): a row overwritten while it
   was being copied leaves ``valid`` and is counted ``torn_read``, exactly as a torn host read.
   The caller never gets a row that was not proven whole after its bytes reached the device.

Two device buffers alternate (double buffering): the next batch is copied into the other one
while the model still reads the last. A buffer is reused two polls later; the copy stream first
waits for the event :meth:`DeviceBatch.done` recorded (or, without it, for the work queued so far
on CuPy's current stream), so reusing it never races the model on the GPU.

The host paths never reach this module: nothing here costs the host paths anything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import numpy as np

from tensorpool.gpu.cuda import Cuda, page_size, parse_device
from tensorpool.gpu.registry import (
    STAGING,
    MappedRange,
    Policy,
    Register,
    RegistrationCore,
    Unregister,
)

if TYPE_CHECKING:
    from tensorpool.shm.batch import SlotBatch
    from tensorpool.shm.region import ShmRegion

#: Device rows of per-row copies start at this alignment (CUDA's allocation granularity).
ROW_ALIGN: Final = 256


class GpuRegistrationError(RuntimeError):
    """A pool could not be pinned and the failure policy is ``error``."""


def row_span(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> int:
    """Bytes from a frame's first element to the end of its last one (positive strides; the
    frame layouts of the wire have no negative ones). Zero for an empty frame."""
    if any(d == 0 for d in shape):
        return 0
    return itemsize + sum((d - 1) * s for d, s in zip(shape, strides, strict=True))


def pool_ranges(pools: list[ShmRegion]) -> list[MappedRange]:
    """The address ranges of mapped payload pools (the header ring is never copied from)."""
    out = []
    for region in pools:
        view = np.frombuffer(region.mmap, np.uint8)
        address = int(view.ctypes.data)
        del view  # no export may outlive this call: the region must stay closable
        out.append(MappedRange(region.path, region.epoch, address, region.size))
    return out


class DeviceBatch:
    """A batch on the device. ``valid``, ``seqs``, ``timestamps_ns`` are the host batch's
    (one row per descriptor). ``device_array`` is one CuPy ``(n, *shape)`` array when the rows
    share a layout (rows not in ``valid`` hold garbage: mask them), else None and
    ``device_arrays`` holds one array per row. Every CuPy array exports DLPack:
    ``torch.from_dlpack(batch.device_array)`` is zero-copy. Valid until the poll after next.
    """

    __slots__ = ("_delivery", "device_array", "device_arrays", "event", "host", "turn")

    def __init__(
        self,
        host: SlotBatch,
        device_array: Any,
        device_arrays: list[Any] | None,
        event: Any,
        delivery: DeviceDelivery | None,
        turn: int,
    ) -> None:
        self.host = host
        self.device_array = device_array
        self.device_arrays = device_arrays
        self.event = event
        self._delivery = delivery
        self.turn = turn

    def __len__(self) -> int:
        return len(self.host)

    @property
    def valid(self) -> np.ndarray:
        return self.host.valid

    @property
    def seqs(self) -> np.ndarray:
        return self.host.seqs

    @property
    def timestamps_ns(self) -> np.ndarray:
        return self.host.timestamps_ns

    @property
    def count(self) -> int:
        return self.host.count

    @property
    def confirmed(self) -> bool:
        return self.host.confirmed and self.event is None

    def confirm(self) -> int:
        """Wait for the copies (``wait=False`` batches), then re-check the commit words: rows
        overwritten during the copy leave ``valid`` (``torn_read``). Idempotent."""
        ev = self.event
        if ev is not None:
            ev.synchronize()
            self.event = None
        return self.host.confirm()

    def done(self, stream: Any = None) -> None:
        """Say the caller's work on this batch is queued (on ``stream``, default CuPy's
        current one): the copy that reuses the buffer waits for it on the GPU."""
        if self._delivery is not None:
            self._delivery._mark_done(self.turn, stream)

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        if self.device_array is None:
            raise TypeError("rows of different layouts: use batch.device_arrays[k]")
        return self.device_array.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> Any:
        if self.device_array is None:
            raise TypeError("rows of different layouts: use batch.device_arrays[k]")
        return self.device_array.__dlpack_device__()


class DeviceDelivery:
    """Copies a consumer's host batches into device memory (one per consumer and device)."""

    def __init__(
        self,
        device: str | int = "cuda:0",
        *,
        stream: Any = None,
        policy: Policy = "error",
    ) -> None:
        ordinal = parse_device(device)
        self.core = RegistrationCore(page_size(), policy)  # validates the policy
        self.cuda = Cuda(ordinal)
        self.ordinal = ordinal
        self.stream = self._as_stream(stream) if stream is not None else self.cuda.stream()
        self._user_stream = stream
        self._buffers: list[Any] = [None, None]
        self._done: list[Any] = [None, None]
        self._turn = 0
        self._open: DeviceBatch | None = None
        self._staging: tuple[Any, int, np.ndarray] | None = None
        self._synced: object = None
        self.batches = 0
        self.bytes_copied = 0
        self.staged_bytes = 0

    def serves(self, device: str | int, stream: Any) -> bool:
        return parse_device(device) == self.ordinal and (
            stream is None or stream is self._user_stream
        )

    def _as_stream(self, stream: Any) -> Any:
        cp = self.cuda.cp
        if isinstance(stream, cp.cuda.Stream | cp.cuda.ExternalStream):
            return stream
        ptr = getattr(stream, "cuda_stream", None)  # a torch.cuda.Stream
        if ptr is None:
            raise ValueError(f"stream must be a CuPy or torch CUDA stream, got {stream!r}")
        return cp.cuda.ExternalStream(int(ptr), self.ordinal)

    # --- mapping events (from the consumer) ---------------------------------------------------
    def sync(self, token: object, pools: list[ShmRegion]) -> None:
        """The consumer's pools now (``token`` changes whenever they do): register new ones."""
        if token is self._synced:
            return
        self._execute(self.core.on_mapped(pool_ranges(pools)))
        self._synced = token  # not before: a failed registration (policy error) fails again

    def release(self, pools: list[ShmRegion]) -> None:
        """The consumer is about to unmap these pools: finish the copy in flight (it reads
        them), then unpin them while they are still mapped."""
        self.finish()
        self._execute(self.core.on_unmapped([r.path for r in pools]))
        self._synced = None

    def _execute(self, actions: list[Register | Unregister]) -> None:
        for k, action in enumerate(actions):
            if isinstance(action, Unregister):
                self.cuda.unregister(action)
                continue
            failure = self.cuda.register(action)
            if failure is None:
                self.core.on_registered(action.path)
                continue
            decision = self.core.on_register_failed(action.path, failure)
            if decision.raise_error:
                for rest in actions[k + 1 :]:  # unpins still happen; pins not attempted are
                    if isinstance(rest, Unregister):  # forgotten, so tried again next poll
                        self.cuda.unregister(rest)
                    else:
                        self.core.on_register_failed(rest.path, "not attempted")
                raise GpuRegistrationError(
                    f"cannot pin {action.path} for GPU copies ({failure}); "
                    "use on_register_failure='staging' to copy through a pinned buffer"
                )

    # --- delivery -------------------------------------------------------------------------------
    def finish(self) -> None:
        """Confirm the batch still open (a ``wait=False`` one), after its copies completed."""
        open_batch, self._open = self._open, None
        if open_batch is not None:
            open_batch.confirm()

    def deliver(self, host: SlotBatch, *, wait: bool = True) -> DeviceBatch:
        """Copy ``host`` (a zero-copy batch whose final check has not run yet) to the device,
        then confirm it (``wait``) or leave it open until :meth:`DeviceBatch.confirm`."""
        turn = self._turn
        if not len(host) or not host.valid.any():
            host.confirm()
            return DeviceBatch(host, None, [], None, None, turn)
        self._turn = turn ^ 1
        stream = self.stream
        self._wait_buffer_free(turn)
        device_array: Any = None
        device_arrays: list[Any] | None = None
        arr = host.array
        if arr is not None:
            device_array = self._copy_stacked(arr, turn, stream)
        else:
            device_arrays = self._copy_rows(host, turn, stream)
        self.batches += 1
        if wait:
            stream.synchronize()
            host.confirm()  # §8.3 second load, after the bytes reached the device
            return DeviceBatch(host, device_array, device_arrays, None, self, turn)
        event = self.cuda.event()
        event.record(stream)
        batch = DeviceBatch(host, device_array, device_arrays, event, self, turn)
        self._open = batch
        return batch

    def _buffer(self, turn: int, nbytes: int) -> Any:
        buf = self._buffers[turn]
        if buf is None or buf.nbytes < nbytes:
            if buf is not None:
                self.stream.synchronize()  # no copy in flight into the buffer given up
            self._buffers[turn] = None
            buf = self.cuda.empty(max(nbytes, 1 << 20))
            self._buffers[turn] = buf
        return buf

    def _wait_buffer_free(self, turn: int) -> None:
        done = self._done[turn]
        self._done[turn] = None
        if done is None:  # what the caller queued on CuPy's current stream so far
            done = self.cuda.event()
            done.record(self.cuda.cp.cuda.get_current_stream())
        self.stream.wait_event(done)

    def _mark_done(self, turn: int, stream: Any) -> None:
        ev = self.cuda.event()
        ev.record(None if stream is None else self._as_stream(stream))
        self._done[turn] = ev

    def _copy_stacked(self, arr: np.ndarray, turn: int, stream: Any) -> Any:
        n = len(arr)
        inner_shape = arr.shape[1:]
        inner_strides = arr.strides[1:]
        span = row_span(inner_shape, inner_strides, arr.itemsize)
        buf = self._buffer(turn, n * span)
        if span:
            self._copy(buf.data.ptr, span, int(arr.ctypes.data), arr.strides[0], span, n, stream)
        return self.cuda.device_view(buf, arr.shape, arr.dtype, (span, *inner_strides))

    def _copy_rows(self, host: SlotBatch, turn: int, stream: Any) -> list[Any]:
        rows = host.arrays
        spans = [0 if a is None else row_span(a.shape, a.strides, a.itemsize) for a in rows]
        offsets = []
        total = 0
        for span in spans:
            offsets.append(total)
            total += -(-span // ROW_ALIGN) * ROW_ALIGN
        buf = self._buffer(turn, total)
        out: list[Any] = []
        base = buf.data.ptr
        for a, span, off in zip(rows, spans, offsets, strict=True):
            if a is None:
                out.append(None)
                continue
            if span:
                self._copy(base + off, span, int(a.ctypes.data), span, span, 1, stream)
            out.append(self.cuda.device_view(buf[off : off + max(span, 1)], a.shape, a.dtype,
                                             a.strides))  # fmt: skip
        return out

    def _copy(
        self, dst: int, dpitch: int, src: int, spitch: int, width: int, rows: int, stream: Any
    ) -> None:
        """Direct DMA from a pinned pool (or pageable owned memory); through the pinned
        staging buffer when the source lies in a pool whose registration failed."""
        nbytes = width * rows
        self.bytes_copied += nbytes
        if not self._in_staged_pool(src, spitch * (rows - 1) + width):
            self.cuda.copy_rows(dst, dpitch, src, spitch, width, rows, stream)
            return
        staging = self._staging
        if staging is None or staging[2].nbytes < nbytes:
            mem, address = self.cuda.pinned(max(nbytes, 1 << 20))
            staging = (mem, address, np.frombuffer(mem, np.uint8, max(nbytes, 1 << 20)))
            self._staging = staging
        stream.synchronize()  # the staging buffer's previous copy has left it
        flat = np.ctypeslib.as_array(_u8_at(src, spitch * (rows - 1) + width))
        src_rows = np.lib.stride_tricks.as_strided(flat, (rows, width), (spitch, 1))
        np.copyto(staging[2][:nbytes].reshape(rows, width), src_rows)
        self.staged_bytes += nbytes
        self.cuda.copy_rows(dst, dpitch, staging[1], width, width, rows, stream)

    def _in_staged_pool(self, src: int, nbytes: int) -> bool:
        return any(
            address <= src and src + nbytes <= address + size
            for address, size in self.core.spans(STAGING)
        )

    def close(self) -> None:
        """Finish the open batch and free the device and staging buffers (pools are unpinned
        by :meth:`release` when the consumer unmaps them)."""
        try:
            self.finish()
        finally:
            self._buffers = [None, None]
            self._done = [None, None]
            self._staging = None


def _u8_at(address: int, nbytes: int) -> Any:
    """A ctypes byte array over host memory the caller knows is mapped (a pool row range)."""
    import ctypes

    return (ctypes.c_uint8 * nbytes).from_address(address)
