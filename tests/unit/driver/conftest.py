from __future__ import annotations

import pytest
from driver_helpers import Harness, make_config

from tensorpool.driver.core import DriverCore


@pytest.fixture
def harness() -> Harness:
    """A fresh core on the shared test config, clock at 0, lease ids from 1."""
    return Harness(DriverCore(make_config(), now_ns=0, lease_id_start=1))
