"""Fixtures for the SHM layer: real files in /dev/shm (tmpfs) when present, real mmaps."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest
from _shm_helpers import Stream, make_stream


@pytest.fixture
def shm_base() -> Iterator[str]:
    """A fresh base directory on tmpfs (or the system temp dir), canonical, removed afterwards."""
    parent = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    base = os.path.realpath(tempfile.mkdtemp(prefix="tp-shm-test-", dir=parent))
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def stream(shm_base: str) -> Iterator[Stream]:
    s = make_stream(shm_base, strides={1: 4096, 2: 16384})
    try:
        yield s
    finally:
        s.close()
