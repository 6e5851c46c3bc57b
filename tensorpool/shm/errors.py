"""One exception hierarchy for everything the SHM layer refuses.

Each refusal carries ``reason`` — one of the stable names in :class:`tensorpool.counters.Reason` —
so callers can count it, report it in QoS, or fall back (§15.22) without parsing messages.
Subclasses exist only to let callers catch a family (URI, path, superblock, layout) at once.
``ShmError`` derives from ``ValueError`` because every case is "this input is not acceptable".
"""

from __future__ import annotations

import errno


class ShmError(ValueError):
    """A region, URI, path or header was rejected; ``reason`` says which rule failed."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


class UriError(ShmError):
    """A ``region_uri`` is not a supported, well-formed ``shm:file`` URI (§4.1, §15.22)."""


class PathRejected(ShmError):
    """An announced path failed containment or identity checks (§15.21a.5)."""


class BackendError(ShmError):
    """Hugepage or stride requirements of §15.22 are not met."""


class SuperblockError(ShmError):
    """A region's superblock does not match what was announced (§7.1, §15.1)."""


class TensorLayoutError(ShmError):
    """A TensorHeader (or a numpy array to be described by one) is invalid (§8.2, §15.8)."""


class WireLimitError(ShmError):
    """A ring or frame size the wire cannot express (u32 ``stride_bytes``/``nslots``, int32
    dims): refused before any file is created, instead of failing half-way through."""


class NoSpaceError(OSError):
    """Region files do not fit their filesystem (``ENOSPC``).

    Raised before a region is announced, so a full tmpfs is a clean error and not a ``SIGBUS``
    on the first write to an unbacked page. ``str()`` is the one-line message alone.
    """

    reason = "region_no_space"

    def __init__(self, message: str, *, needed: int = 0, free: int = 0) -> None:
        super().__init__(errno.ENOSPC, message)
        self.needed = needed
        self.free = free

    def __str__(self) -> str:
        return str(self.strerror)


class UnsupportedPlatform(RuntimeError):
    """The seqlock's memory-ordering assumptions do not hold on this CPU (see seqlock docs)."""
