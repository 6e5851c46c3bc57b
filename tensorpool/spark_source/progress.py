"""Read the source's loss counters back out of Spark's streaming query progress.

The tensorpool source reports data loss (``failOnDataLoss=false``) in its offsets, which Spark
prints in every progress report: ``progress["sources"][i]["endOffset"]`` is the JSON text
``{"<stream>": {"epoch": E, "seq": S, "lost": L, "lostLate": T}}``. :func:`lost_frames` turns a
progress (``query.lastProgress``, a ``StreamingQueryProgress`` or its ``json``) into
``{stream_id: {"lost": L, "lostLate": T, "total": L + T}}`` summed over tensorpool sources.
"""

from __future__ import annotations

import json
from typing import Any


def _as_dict(progress: Any) -> dict[str, Any]:
    if progress is None:
        return {}
    if isinstance(progress, dict):
        return progress
    if isinstance(progress, str):
        return json.loads(progress)
    text = getattr(progress, "json", None)
    if isinstance(text, str):
        return json.loads(text)
    if callable(text):
        return json.loads(text())
    raise TypeError(f"not a streaming query progress: {type(progress).__name__}")


def lost_frames(progress: Any) -> dict[int, dict[str, int]]:
    """Cumulative lost-frame counters per stream from one progress report."""
    out: dict[int, dict[str, int]] = {}
    for source in _as_dict(progress).get("sources", []):
        end = source.get("endOffset")
        if not end:
            continue
        try:
            doc = json.loads(end) if isinstance(end, str) else end
        except ValueError:
            continue
        if not isinstance(doc, dict):
            continue
        for key, pos in doc.items():
            if not (isinstance(pos, dict) and {"epoch", "seq", "lost", "lostLate"} <= set(pos)):
                continue  # not a tensorpool offset
            sid = int(key)
            acc = out.setdefault(sid, {"lost": 0, "lostLate": 0, "total": 0})
            acc["lost"] += int(pos["lost"])
            acc["lostLate"] += int(pos["lostLate"])
            acc["total"] = acc["lost"] + acc["lostLate"]
    return out


__all__ = ["lost_frames"]
