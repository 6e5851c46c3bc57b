"""#13.7: a reader that goes away (`tensorpool ... | head -1`) ends a command quietly.

Each case runs the real `tensorpool` command in a subprocess whose stdout is a pipe with no
reader left (its read end is closed before the command starts), so the command's first write
fails with EPIPE deterministically: no traceback, no "Exception ignored" on stderr, exit 141.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tensorpool.cli import EXIT_BROKEN_PIPE
from tensorpool.specs.generated.wire import FrameDescriptorEncoder


def _descriptor_hex() -> str:
    buf = bytearray(FrameDescriptorEncoder.encoded_length())
    n = FrameDescriptorEncoder.encode(
        buf, 0, stream_id=1, epoch=1, seq=1, header_index=0, timestamp_ns=1, meta_version=None
    )
    return bytes(buf[:n]).hex()


def run_with_closed_stdout(*argv: str) -> subprocess.CompletedProcess[str]:
    """Run `python -m tensorpool ARGV` with stdout a pipe whose reader is already gone."""
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run(
            [sys.executable, "-m", "tensorpool", *argv],
            stdin=subprocess.DEVNULL,
            stdout=w,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(w)


@pytest.mark.parametrize(
    ("argv", "status"),
    [
        # argparse swallows write errors itself, so `--help` ends with its usual 0
        pytest.param(("--help",), 0, id="help"),
        pytest.param(
            ("driver", "status", "--status-file", "/nonexistent/status.json"),
            EXIT_BROKEN_PIPE,
            id="status",
        ),
        pytest.param(
            ("driver", "status", "--json", "--status-file", "/nonexistent/status.json"),
            EXIT_BROKEN_PIPE,
            id="status-json",
        ),
        pytest.param(("tap", "--hex", "DESCRIPTOR"), EXIT_BROKEN_PIPE, id="tap-hex"),
    ],
)
def test_closed_stdout_exits_quietly(argv: tuple[str, ...], status: int) -> None:
    """#13.7: no BrokenPipe traceback from any command; status 141 (128 + SIGPIPE)."""
    argv = tuple(_descriptor_hex() if a == "DESCRIPTOR" else a for a in argv)
    done = run_with_closed_stdout(*argv)
    assert "Traceback" not in done.stderr, done.stderr
    assert "BrokenPipe" not in done.stderr, done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr
    assert done.returncode == status, (done.returncode, done.stderr)
