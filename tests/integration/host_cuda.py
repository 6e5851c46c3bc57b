"""A host-memory stand-in for :class:`tensorpool.gpu.cuda.Cuda`, for CI, which has no GPU.

It replaces only the thin CuPy layer (registration calls, streams, events, buffers, copies);
everything above it (:mod:`tensorpool.gpu.delivery`, the registry, the consumer) runs unchanged
against real producers, real SHM files and a real media driver. The part a GPU makes
impossible to reproduce on CI is the fault the delivery rule exists for: a slot overwritten
*while* its bytes are on their way to the device. Copies here are therefore deferred, as on a
CUDA stream: ``copy_rows`` only queues the copy, and it runs when the stream (or an event
recorded after it) is synchronized. A test can then overwrite slots between the enqueue and the
synchronize, which is exactly the window a DMA copy leaves open.

The real layer is exercised by the ``gpu``-marked tests (``tests/integration/test_gpu_delivery.py``)
on a GPU host.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np

from tensorpool.gpu.registry import Register, Unregister


class HostStream:
    """Ops run in order, when a synchronize reaches them."""

    ptr = 0

    def __init__(self) -> None:
        self.ops: list[Callable[[], None]] = []
        self.ran = 0
        #: a fault a test injects: runs once, just before the next queued copy runs
        self.before_copy: Callable[[], None] | None = None

    def enqueue(self, op: Callable[[], None]) -> None:
        self.ops.append(op)

    def run_to(self, upto: int) -> None:
        if self.ran < upto and self.before_copy is not None:
            fault, self.before_copy = self.before_copy, None
            fault()
        while self.ran < upto:
            self.ops[self.ran]()
            self.ran += 1

    def synchronize(self) -> None:
        self.run_to(len(self.ops))

    def wait_event(self, event: HostEvent) -> None:
        event.synchronize()  # one copy engine: what the event covers runs before what follows

    @property
    def pending(self) -> int:
        return len(self.ops) - self.ran


class HostEvent:
    def __init__(self) -> None:
        self.stream: HostStream | None = None
        self.mark = 0

    def record(self, stream: HostStream | None = None) -> None:
        self.stream = stream
        self.mark = len(stream.ops) if stream is not None else 0

    def synchronize(self) -> None:
        if self.stream is not None:
            self.stream.run_to(self.mark)


class HostBuffer:
    """A "device" allocation: host bytes with CuPy's ``.data.ptr`` / ``.nbytes`` / slicing."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array
        self.nbytes = array.nbytes
        self.data = SimpleNamespace(ptr=int(array.ctypes.data))

    def __getitem__(self, key: slice) -> HostBuffer:
        return HostBuffer(self.array[key])


class HostCuda:
    """Same surface as :class:`tensorpool.gpu.cuda.Cuda`; records what it was asked to do."""

    #: set by a test: the failure ``register`` returns for every range (None: succeed)
    fail_register: ClassVar[str | None] = None
    instances: ClassVar[list[HostCuda]] = []

    def __init__(self, ordinal: int) -> None:
        self.ordinal = ordinal
        self.read_only_supported = True
        self.calls: list[tuple[str, int, int]] = []
        self.default_stream = HostStream()
        self.streams: list[HostStream] = []
        self.cp = SimpleNamespace(
            cuda=SimpleNamespace(
                get_current_stream=lambda: self.default_stream,
                Stream=HostStream,
                ExternalStream=HostStream,
            )
        )
        HostCuda.instances.append(self)

    def register(self, action: Register) -> str | None:
        self.calls.append(("register", action.address, action.size))
        return self.fail_register

    def unregister(self, action: Unregister) -> None:
        self.calls.append(("unregister", action.address, 0))

    def stream(self) -> HostStream:
        s = HostStream()
        self.streams.append(s)
        return s

    def event(self) -> HostEvent:
        return HostEvent()

    def empty(self, nbytes: int) -> HostBuffer:
        return HostBuffer(np.zeros(max(nbytes, 1), np.uint8))

    def pinned(self, nbytes: int) -> tuple[np.ndarray, int]:
        mem = np.zeros(max(nbytes, 1), np.uint8)
        return mem, int(mem.ctypes.data)

    def copy_rows(
        self, dst: int, dpitch: int, src: int, spitch: int, width: int, rows: int, stream: Any
    ) -> None:
        assert dpitch >= width and spitch >= width and rows >= 1  # cudaMemcpy2D's preconditions

        def op() -> None:
            for r in range(rows):
                ctypes.memmove(dst + r * dpitch, src + r * spitch, width)

        stream.enqueue(op)

    def device_view(
        self, buffer: HostBuffer, shape: tuple[int, ...], dtype: Any, strides: tuple[int, ...]
    ) -> np.ndarray:
        return np.ndarray(shape, dtype, buffer=buffer.array, strides=strides)
