#!/usr/bin/env bash
# The whole binding workflow on a GPU (benchmarks/gpu_e2e.py): a reduced paper config through
# the Snakemake DAG with --resources gpu=N, its checks and timings. One short prepared run: at
# most 9 minutes (the timeout stops it; snakemake's outputs stay in the work folder).
#   benchmarks/gpu_e2e.sh --json benchmarks/measured/gpu-e2e-<card>.json
#   benchmarks/gpu_e2e.sh --tiny       # the same DAG at test size on the CPU (the tests)
# Python: $REPDIAG_PYTHON, else .venv/bin/python, else python3.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${REPDIAG_PYTHON:-.venv/bin/python}
[ -x "$python" ] || python=python3
export HF_HUB_OFFLINE=1  # random weights only: never the network
export CUBLAS_WORKSPACE_CONFIG=${CUBLAS_WORKSPACE_CONFIG:-:4096:8}  # deterministic cuBLAS
exec timeout --signal=INT --kill-after=15 "${REPDIAG_GPU_E2E_TIMEOUT_S:-540}" \
    "$python" benchmarks/gpu_e2e.py "$@"
