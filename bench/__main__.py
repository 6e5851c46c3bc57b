"""`python -m bench [NAME ...]`: run the benchmarks, each in its own process.

With no names every `bench_*.py` runs in turn; `python -m bench ipc shm` runs two.
Extra options after `--` go to each benchmark (e.g. `-- --quick` where supported).
Each prints its own markdown table; results and commands are kept in docs/benchmarks.md.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench import SKIPPED


def main(argv: list[str]) -> int:
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    here = Path(__file__).parent
    available = sorted(p.stem.removeprefix("bench_") for p in here.glob("bench_*.py"))
    names = argv or available
    unknown = [n for n in names if n not in available]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; available: {available}", file=sys.stderr)
        return 2
    failed = []
    skipped = []
    for name in names:
        print(f"\n## bench_{name}\n", flush=True)
        rc = subprocess.call([sys.executable, "-m", f"bench.bench_{name}", *extra])
        if rc == SKIPPED:
            skipped.append(name)
        elif rc:
            failed.append(name)
    if skipped:
        print(f"skipped (not available on this host): {skipped}", file=sys.stderr)
    if failed:
        print(f"failed: {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
