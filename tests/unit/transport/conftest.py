"""Shared fixtures: one real embedded media driver per test module, fresh stream ids per test."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from tensorpool.transport import AeronContext

_stream_ids = itertools.count(7001)


@pytest.fixture(scope="module")
def aeron_ctx() -> Iterator[AeronContext]:
    with AeronContext() as ctx:
        yield ctx


@pytest.fixture
def stream_id() -> int:
    """A stream id no other test in this session uses, so tests never see each other's data."""
    return next(_stream_ids)
