"""One exception hierarchy for everything the SHM layer refuses.

Each refusal carries ``reason`` — one of the stable names in :class:`tensorpool.counters.Reason` —
so callers can count it, report it in QoS, or fall back (§15.22) without parsing messages.
Subclasses exist only to let callers catch a family (URI, path, superblock, layout) at once.
``ShmError`` derives from ``ValueError`` because every case is "this input is not acceptable".
"""

from __future__ import annotations


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


class UnsupportedPlatform(RuntimeError):
    """The seqlock's memory-ordering assumptions do not hold on this CPU (see seqlock docs)."""
