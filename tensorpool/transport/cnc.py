"""Which media driver serves an Aeron directory: the identity of its ``cnc.dat``.

An Aeron client maps ``cnc.dat`` once, when it connects. If that media driver dies and a new one
starts in the same directory, the new one writes a new ``cnc.dat`` (new inode, new start
timestamp, new pid) while the old client keeps reading the dead one's mapping and learns of the
loss only after its ``driver_timeout_ms`` (10 s by default), and even then never reconnects.
Comparing the identity read here with the one read at connect time tells a client within one
check that the driver it talks to is gone, without touching the directory.

The layout read is Aeron's CnC metadata (``aeron_cnc_metadata_t``, CnC version 0.2+): six int32
fields, then ``client_liveness_timeout``, ``start_timestamp`` and ``pid`` as int64.
"""

from __future__ import annotations

import os
import struct
from typing import Final, NamedTuple

from tensorpool.fsafety import CNC_FILE
from tensorpool.fsafety import CNC_METADATA as _META


class CncIdentity(NamedTuple):
    """What distinguishes one media driver's ``cnc.dat`` from its successor's."""

    inode: int
    start_timestamp_ms: int
    pid: int


def read_cnc_identity(aeron_dir: str) -> CncIdentity | None:
    """The identity of the driver that last wrote ``aeron_dir/cnc.dat``; None if there is none
    yet (or it is still being created: too short to hold the metadata, or no pid in it yet)."""
    try:
        fd = os.open(os.path.join(aeron_dir, CNC_FILE), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        inode = os.fstat(fd).st_ino
        head = os.pread(fd, _META.size, 0)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(head) < _META.size:
        return None
    fields = _META.unpack(head)
    if fields[8] == 0:  # metadata not written yet: a client reconnecting now would do it twice
        return None
    return CncIdentity(inode, fields[7], fields[8])


_COUNTER_RECORD: Final = 512  # aeron_counter_metadata_descriptor_t
_COUNTER_HEAD: Final = struct.Struct("<ii8x")
_META_REGION: Final = 128  # the metadata, aligned to two cache lines

CLIENT_HEARTBEAT_TYPE: Final = 11
"""Aeron's counter type of a connected client (one per Aeron client of any process)."""
SUBSCRIBER_POSITION_TYPE: Final = 4
"""Aeron's counter type of one subscription's position on one image."""


def read_counters(aeron_dir: str) -> list[tuple[int, bytes]]:
    """The media driver's allocated counters as ``(type_id, key)``: how many Aeron clients,
    publications and subscriber images it serves (measurement and tests, not a hot path)."""
    with open(os.path.join(aeron_dir, CNC_FILE), "rb") as f:
        data = f.read()
    fields = _META.unpack_from(data)
    start = _META_REGION + fields[1] + fields[2]
    out = []
    for off in range(start, start + fields[3], _COUNTER_RECORD):
        state, type_id = _COUNTER_HEAD.unpack_from(data, off)
        if state == 1:  # allocated (0: never used, -1: reclaimed)
            out.append((type_id, data[off + 16 : off + 128]))
    return out


def subscriber_images(counters: list[tuple[int, bytes]], stream_id: int) -> int:
    """Subscriber positions (subscription x image) on ``stream_id``."""
    return sum(
        1
        for type_id, key in counters
        if type_id == SUBSCRIBER_POSITION_TYPE and struct.unpack_from("<i", key, 12)[0] == stream_id
    )
