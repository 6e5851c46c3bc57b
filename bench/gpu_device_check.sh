#!/usr/bin/env bash
# The one script a GPU session runs for issue #20 (frames straight to the GPU), about 2-4 min.
#
# Where: a host with an NVIDIA GPU whose system python3 already has cupy-cuda13x, torch, numpy,
# pyarrow, pytest, pytest-timeout, psutil, prometheus-client, rich and pillow, and no internet.
# tensorpool's other runtime dependencies travel as wheels in the git-ignored folder .whl/
# (ignored via .git/info/exclude: `/.whl/`). Fetch them on a machine with internet, from the
# repository root (versions as in .venv: `.venv/bin/pip show pyaeron posix_ipc`):
#
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 -d .whl pyaeron==0.1.0 posix-ipc==1.3.2
#
# (about 0.4 MiB). Run, from the repository root: `bash bench/gpu_device_check.sh`.
# Results go to $OUT (default /tmp/tp-gpu-check): nvidia-smi.txt, gpu-unit.log, gpu-tests.log,
# bench.log, gpu.json, consume.log. Exit status: that of the GPU tests.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/tp-gpu-check}
PY=${PY:-python3}
SITE=${SITE:-/tmp/site}
mkdir -p "$OUT"
{ nvidia-smi -L; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; } \
  2>&1 | tee "$OUT/nvidia-smi.txt"
if ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl
fi
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c 'import cupy, numpy, pyaeron, tensorpool; print("cupy", cupy.__version__, "numpy", numpy.__version__)' \
  2>&1 | tee "$OUT/versions.txt"
df -h /dev/shm 2>&1 | tee -a "$OUT/versions.txt"

# 1. what needs no GPU (the bookkeeping core, options, the missing-extra error): seconds
timeout 60 "$PY" -m pytest -q -p no:cacheprovider tests/unit/gpu 2>&1 | tee "$OUT/gpu-unit.log"
# 2. the GPU tests: real producers in other processes
timeout 150 "$PY" -m pytest -m gpu -q -rs -p no:cacheprovider --timeout 120 \
  tests/integration/test_gpu_delivery.py 2>&1 | tee "$OUT/gpu-tests.log"
rc=${PIPESTATUS[0]}
# 3. the benchmark table (docs/benchmarks/gpu.md)
timeout 150 "$PY" -m bench.bench_gpu --seconds 1.5 --json "$OUT/gpu.json" 2>&1 | tee "$OUT/bench.log"
# 4. the CLI: `tensorpool consume --device cuda:0` against a live producer, 3 s
work=$(mktemp -d /tmp/tp-gpu-cli-XXXXXX)
"$PY" -m tensorpool.transport.aeronmd --dir "$work/aeron" >"$work/md.log" 2>&1 &
md=$!
sleep 1
common=(--aeron-dir "$work/aeron" --shm-base-dir "$work/shm" --stream-id 7)
timeout 10 "$PY" -m tensorpool produce "${common[@]}" --shape 480,640 --dtype uint16 --rate 500 \
  --duration 6 >"$work/produce.log" 2>&1 &
prod=$!
timeout 10 "$PY" -m tensorpool consume "${common[@]}" --device cuda:0 --duration 4 --batch 16 \
  2>&1 | tee "$OUT/consume.log"
wait "$prod"
kill "$md" 2>/dev/null
wait "$md" 2>/dev/null
rm -rf "$work"
echo "gpu tests exit status: $rc" | tee -a "$OUT/gpu-tests.log"
exit "$rc"
