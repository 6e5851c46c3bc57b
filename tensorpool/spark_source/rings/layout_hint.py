"""Self-describing tensors (#16.6): a stream's one fixed layout in the ``payload`` field metadata.

``DataSource.schema()`` runs at ``load()``. There the source looks at the selected rings once
(the same attachment a batch read plans with: announces, or a SHM-driver lease with
``driver=true``, for at most :data:`PROBE_TIMEOUT_S`) and, when *every committed frame of every
selected stream* has the same C-contiguous layout, puts it into the schema::

    df.schema["payload"].metadata == {"dtype": "float32", "shape": [480, 640]}

:func:`tensorpool.spark_source.convert.stack` / :func:`~.convert.to_numpy` read it when the
``dtype``/``shape`` columns are not selected (or ``includeTensorMetadata=false``). Nothing is
added when the layouts differ, a ring is empty, the streams cannot be attached in time or the
streams are discovered (``streams="*"``): the schema is then the plain one, and ``load()`` is
never failed by this probe. The hint describes the rings *at load()*; a producer that changes
its layout later makes it stale -- :func:`~.convert.stack` checks every payload's size, and the
``dtype``/``shape`` columns always describe each frame.
"""

from __future__ import annotations

import logging
from typing import Any, Final

import numpy as np

from tensorpool.spark_source.convert import NUMPY_DTYPES
from tensorpool.spark_source.options import SourceOptions
from tensorpool.spark_source.rings import mapped_rings
from tensorpool.spark_source.rings.attach import StreamsNotAttached, open_attachment
from tensorpool.spark_source.rings.local import kept_probe, settings

log = logging.getLogger(__name__)

#: longest a ``load()`` waits for the rings to describe the payload (a live producer answers a
#: hello at once; a stream that is not up yet must not hold ``load()`` for ``attachTimeoutMs``)
PROBE_TIMEOUT_S: Final = 1.0


def ring_layout(m: mapped_rings.MappedStream) -> tuple[str, tuple[int, ...]] | None:
    """``(dtype, shape)`` shared by every committed frame of the ring, if C-contiguous."""
    scan = m.ring.scan()
    ok = scan.committed
    if not ok.any():
        return None
    blobs = scan.fields["blob"][ok]
    if not (blobs == blobs[0]).all():
        return None
    layout = m.layout_of(blobs[0].tobytes())
    if layout is None:
        return None
    dtype = layout.dtype.name.lower()
    dims = tuple(int(d) for d in layout.dims)
    item = NUMPY_DTYPES.get(dtype)
    if item is None:
        return None
    c_strides = [
        int(np.prod(dims[i + 1 :], dtype=np.int64)) * item.itemsize for i in range(len(dims))
    ]
    if list(layout.strides) != c_strides:
        return None
    return dtype, dims


def payload_metadata(opts: SourceOptions) -> dict[str, Any] | None:
    """The ``payload`` field metadata for ``opts``' streams, or None (see the module doc)."""
    if not opts.streams or opts.remote is not None:  # remote (#18): no Aeron probe here
        return None
    conn = opts.connection
    timeout = min(PROBE_TIMEOUT_S, conn.attach_timeout_ms / 1000)
    try:
        if conn.driver:
            with open_attachment(
                opts.streams, settings(opts), driver=True, background=False, intake_capacity=None
            ) as att:
                layouts = att.wait_for_layouts(timeout)
        else:
            # #15: the probe a batch plan in this process reuses (kept open between queries)
            with kept_probe(opts) as probe:
                layouts = probe.wait_for_layouts(timeout, opts.streams)
        found = {
            ring_layout(
                mapped_rings.mapped(mapped_rings.RegionSpec.from_layout(layouts[s]), conn.base_dirs)
            )
            for s in opts.streams
        }
    except StreamsNotAttached:
        return None  # not up yet: the plain schema
    except Exception as exc:  # a hint must never fail load()
        log.info("tensorpool: no payload layout in the schema: %s", exc)
        return None
    if len(found) != 1 or None in found:
        return None
    dtype, shape = found.pop()  # type: ignore[misc]
    return {"dtype": dtype, "shape": list(shape)}


__all__ = ["PROBE_TIMEOUT_S", "payload_metadata", "ring_layout"]
