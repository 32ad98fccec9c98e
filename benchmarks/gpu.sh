#!/usr/bin/env bash
# The GPU benchmark of the Jacobian engine (benchmarks/gpu.py), one short prepared run: at most
# 8 minutes (the script keeps to a 440 s budget; the timeout stops it at 480 s, and the JSON it
# rewrites after every step keeps what was measured). On a CPU-only machine it runs on the CPU.
#   benchmarks/gpu.sh --json results/benchmarks/gpu.json   # the paper's pass and projection
#   benchmarks/gpu.sh --tiny                                # seconds on a CPU (the tests)
# Python: $REPDIAG_PYTHON, else .venv/bin/python, else python3.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${REPDIAG_PYTHON:-.venv/bin/python}
[ -x "$python" ] || python=python3
export HF_HUB_OFFLINE=1  # random weights only: never the network
export CUBLAS_WORKSPACE_CONFIG=${CUBLAS_WORKSPACE_CONFIG:-:4096:8}  # deterministic cuBLAS
exec timeout --signal=INT --kill-after=15 "${REPDIAG_GPU_BENCH_TIMEOUT_S:-480}" \
    "$python" benchmarks/gpu.py "$@"
