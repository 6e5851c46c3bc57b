"""The thin CuPy layer: executes the registry's actions and enqueues copies. No decisions here.

CuPy is imported on first use only (``tensorpool[gpu]`` is optional): without it every GPU
option fails with :data:`MISSING_EXTRA`, one line naming the extra. Nothing in this module is
reached by the host paths.

API used (CuPy >= 13, ``cupy_backends/cuda/api/runtime.pyx``): ``runtime.hostRegister(ptr,
size, flags)``, ``runtime.hostUnregister(ptr)``, ``runtime.memcpy2DAsync(dst, dpitch, src,
spitch, width, height, kind, stream)``, ``runtime.memcpyAsync(dst, src, size, kind, stream)``,
``runtime.deviceGetAttribute(attr, device)``, ``runtime.getDeviceCount()``;
``cupy.cuda.Stream``, ``cupy.cuda.Event``, ``cupy.cuda.alloc_pinned_memory``.
"""

from __future__ import annotations

import os
from typing import Any, Final

from tensorpool.gpu.registry import Register, Unregister

MISSING_EXTRA: Final = (
    "GPU delivery needs CuPy: pip install 'tensorpool[gpu]' "
    "(CUDA 13; 'tensorpool[gpu-cuda12]' for CUDA 12)"
)

# cudaHostRegister flags (driver_types.h); CuPy does not export them as names
HOST_REGISTER_PORTABLE: Final = 1
HOST_REGISTER_MAPPED: Final = 2
HOST_REGISTER_IO_MEMORY: Final = 4
HOST_REGISTER_READ_ONLY: Final = 8
MEMCPY_HOST_TO_DEVICE: Final = 1
#: cudaDevAttrHostRegisterReadOnlySupported (CUDA >= 11.1)
ATTR_HOST_REGISTER_READ_ONLY: Final = 113
# cudaError_t values the layer tells apart
ERROR_INVALID_VALUE: Final = 1
ERROR_NO_DEVICE: Final = 100
ERROR_HOST_MEMORY_ALREADY_REGISTERED: Final = 712
ERROR_HOST_MEMORY_NOT_REGISTERED: Final = 713
ERROR_NOT_SUPPORTED: Final = 801


class GpuUnavailable(RuntimeError):
    """No CuPy, no CUDA driver, or no GPU: the message is one line the user can act on."""


def import_cupy() -> Any:
    try:
        import cupy
    except ImportError:
        raise GpuUnavailable(MISSING_EXTRA) from None
    return cupy


def parse_device(device: str | int) -> int:
    """``"cuda"``, ``"cuda:N"`` or ``N`` -> the CUDA device ordinal (no CUDA call)."""
    if isinstance(device, bool):
        raise ValueError(f"device must be 'cuda', 'cuda:N' or an int, got {device!r}")
    if isinstance(device, int):
        ordinal = device
    elif isinstance(device, str) and device.strip() == "cuda":
        ordinal = 0
    elif isinstance(device, str) and device.strip().startswith("cuda:"):
        text = device.strip()[5:]
        if not text.isdigit():
            raise ValueError(f"device must be 'cuda' or 'cuda:N', got {device!r}")
        ordinal = int(text)
    else:
        raise ValueError(f"device must be 'cuda' or 'cuda:N', got {device!r}")
    if ordinal < 0:
        raise ValueError(f"device ordinal must be >= 0, got {device!r}")
    return ordinal


def page_size() -> int:
    return os.sysconf("SC_PAGE_SIZE")


class Cuda:
    """One CUDA device seen through CuPy: registration, streams, events, async copies."""

    def __init__(self, ordinal: int) -> None:
        cp = import_cupy()
        self.cp = cp
        self.rt = cp.cuda.runtime
        try:
            count = self.rt.getDeviceCount()
        except cp.cuda.runtime.CUDARuntimeError as exc:
            raise GpuUnavailable(f"no CUDA GPU visible ({_name(exc)})") from None
        if count == 0:
            raise GpuUnavailable("no CUDA GPU visible")
        if ordinal >= count:
            raise GpuUnavailable(f"cuda:{ordinal} does not exist ({count} CUDA device(s) visible)")
        self.ordinal = ordinal
        self.device = cp.cuda.Device(ordinal)
        try:
            self.read_only_supported = bool(
                self.rt.deviceGetAttribute(ATTR_HOST_REGISTER_READ_ONLY, ordinal)
            )
        except cp.cuda.runtime.CUDARuntimeError:
            self.read_only_supported = False

    def register(self, action: Register) -> str | None:
        """Pin the range read-only where supported (consumer mappings are PROT_READ), portable
        to every context; on ``cudaErrorNotSupported`` retry without read-only. Returns None,
        or the failure's name."""
        rt = self.rt
        flags = HOST_REGISTER_PORTABLE
        if self.read_only_supported:
            flags |= HOST_REGISTER_READ_ONLY
        with self.device:
            try:
                rt.hostRegister(action.address, action.size, flags)
                return None
            except rt.CUDARuntimeError as exc:
                if exc.status != ERROR_NOT_SUPPORTED or not flags & HOST_REGISTER_READ_ONLY:
                    return _name(exc)
            try:
                rt.hostRegister(action.address, action.size, HOST_REGISTER_PORTABLE)
                return None
            except rt.CUDARuntimeError as exc:
                return _name(exc)

    def unregister(self, action: Unregister) -> None:
        """Unpin; a range the driver does not know (a registration that never completed) is
        already in the state we want."""
        rt = self.rt
        with self.device:
            try:
                rt.hostUnregister(action.address)
            except rt.CUDARuntimeError as exc:
                if exc.status != ERROR_HOST_MEMORY_NOT_REGISTERED:
                    raise

    def stream(self) -> Any:
        with self.device:
            return self.cp.cuda.Stream(non_blocking=True)

    def event(self) -> Any:
        with self.device:
            return self.cp.cuda.Event(block=False, disable_timing=True)

    def empty(self, nbytes: int) -> Any:
        """A device buffer of ``nbytes`` (uint8), from CuPy's memory pool."""
        with self.device:
            return self.cp.empty(max(nbytes, 1), self.cp.uint8)

    def pinned(self, nbytes: int) -> tuple[Any, int]:
        """A pinned host staging buffer: ``(owner, address)``."""
        mem = self.cp.cuda.alloc_pinned_memory(max(nbytes, 1))
        return mem, int(mem.ptr)

    def copy_rows(
        self, dst: int, dpitch: int, src: int, spitch: int, width: int, rows: int, stream: Any
    ) -> None:
        """``rows`` rows of ``width`` bytes, host (pitch ``spitch``) -> device (``dpitch``),
        one asynchronous 2D copy on ``stream``."""
        if rows == 1 or (dpitch == width and spitch == width):
            self.rt.memcpyAsync(dst, src, width * rows, MEMCPY_HOST_TO_DEVICE, stream.ptr)
        else:
            self.rt.memcpy2DAsync(
                dst, dpitch, src, spitch, width, rows, MEMCPY_HOST_TO_DEVICE, stream.ptr
            )

    def device_view(self, buffer: Any, shape: tuple[int, ...], dtype: Any,
                    strides: tuple[int, ...]) -> Any:  # fmt: skip
        """A CuPy array over ``buffer``'s memory (no copy): exports ``__dlpack__``."""
        return self.cp.ndarray(shape, dtype, buffer.data, strides=strides)


def _name(exc: BaseException) -> str:
    """A CUDA error as one line (CuPy's message already holds the error's name)."""
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
