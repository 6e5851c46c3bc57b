"""#20 what works without a GPU: option parsing, the missing-extra error (API, CLI, benchmark),
row spans of device copies, and the address ranges of real mapped pools.

CuPy is made unimportable (``sys.modules["cupy"] = None``) where a test needs the extra to be
missing, so these tests mean the same on a GPU host with ``tensorpool[gpu]`` installed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench import SKIPPED
from tensorpool.gpu.cuda import MISSING_EXTRA, GpuUnavailable, parse_device
from tensorpool.gpu.delivery import DeviceDelivery, pool_ranges, row_span
from tensorpool.shm import EpochLayout, SuperblockFields, create_region

REPO = Path(__file__).resolve().parents[3]
NO_CUPY = "import sys; sys.modules['cupy'] = None; "


@pytest.mark.parametrize(("text", "ordinal"), [("cuda", 0), ("cuda:0", 0), ("cuda:3", 3), (2, 2)])
def test_device_names_parse(text: str | int, ordinal: int) -> None:
    assert parse_device(text) == ordinal


@pytest.mark.parametrize("text", ["cpu", "cuda:", "cuda:-1", "cuda:x", "gpu0", -1, True, None])
def test_bad_device_names_are_refused(text: object) -> None:
    with pytest.raises(ValueError, match="device"):
        parse_device(text)  # type: ignore[arg-type]


def test_bad_options_fail_before_cuda_is_touched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(ValueError, match="cuda:N"):
        DeviceDelivery("cpu")
    with pytest.raises(ValueError, match="on_register_failure"):
        DeviceDelivery("cuda:0", policy="retry")  # type: ignore[arg-type]


def test_missing_extra_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(GpuUnavailable) as info:
        DeviceDelivery("cuda:0")
    assert str(info.value) == MISSING_EXTRA
    assert "pip install 'tensorpool[gpu]'" in MISSING_EXTRA and "\n" not in MISSING_EXTRA


def _run_without_cupy(code: str) -> subprocess.CompletedProcess[str]:
    path = os.environ.get("PYTHONPATH")  # a GPU host's carried wheels (/tmp/site) stay visible
    env = {**os.environ, "PYTHONPATH": str(REPO) + (os.pathsep + path if path else "")}
    return subprocess.run(
        [sys.executable, "-c", NO_CUPY + code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env=env,
    )


def test_cli_consume_device_without_the_extra_exits_with_one_line() -> None:
    got = _run_without_cupy(
        "from tensorpool.cli import main; raise SystemExit(main(['consume', '--device', 'cuda:0']))"
    )
    assert got.returncode == 2, got
    lines = got.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'tensorpool[gpu]'" in lines[0], got.stderr
    assert "Traceback" not in got.stderr


def test_cli_consume_bad_device_exits_with_one_line() -> None:
    got = _run_without_cupy(
        "from tensorpool.cli import main; raise SystemExit(main(['consume', '--device', 'cpu']))"
    )
    assert got.returncode == 2, got
    assert got.stderr.strip().splitlines() == [
        "tensorpool consume: error: --device: device must be 'cuda' or 'cuda:N', got 'cpu'"
    ]


def test_bench_gpu_without_the_extra_exits_with_one_line() -> None:
    got = _run_without_cupy(
        "import runpy; sys.argv = ['bench_gpu.py', '--seconds', '0.1']; "
        "runpy.run_path('bench/bench_gpu.py', run_name='__main__')"
    )
    assert got.returncode == SKIPPED, got  # `python -m bench` lists it as skipped
    lines = got.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'tensorpool[gpu]'" in lines[0], got.stderr


def test_row_span_of_frame_layouts() -> None:
    c = np.zeros((480, 640), np.uint16)
    assert row_span(c.shape, c.strides, c.itemsize) == c.nbytes
    f = np.asfortranarray(c)
    assert row_span(f.shape, f.strides, f.itemsize) == c.nbytes
    padded = np.zeros((4, 16), np.float32)[:, :10]  # rows of 64 bytes, 40 used
    assert row_span(padded.shape, padded.strides, 4) == 3 * 64 + 40
    assert row_span((0, 5), (20, 4), 4) == 0
    assert row_span((), (), 8) == 8


def test_pool_ranges_name_the_mapping_and_leave_it_closable(tmp_path: Path) -> None:
    layout = EpochLayout(str(tmp_path), "tensorpool", "p", 7)
    region = create_region(
        layout.pool_path(1),
        SuperblockFields.payload_pool(
            epoch=7, stream_id=3, pool_id=1, nslots=4, stride_bytes=4096, now_ns=1
        ),
    )
    try:
        (got,) = pool_ranges([region])
        assert got.path == region.path and got.epoch == 7 and got.length == region.size
        assert got.address == np.frombuffer(region.mmap, np.uint8).ctypes.data
        assert got.address % os.sysconf("SC_PAGE_SIZE") == 0
    finally:
        assert region.close() is not False  # no buffer export left behind
