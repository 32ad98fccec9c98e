#!/usr/bin/env bash
# The whole binding workflow on a GPU (benchmarks/gpu_e2e.py): a reduced paper config through
# the Snakemake DAG with --resources gpu=N, its checks and timings. One short prepared run: at
# most 9 minutes (the timeout stops it; snakemake's outputs stay in the work folder).
#   benchmarks/gpu_e2e.sh --json benchmarks/measured/gpu-e2e-<card>.json
#   benchmarks/gpu_e2e.sh --tiny       # the same DAG at test size on the CPU (the tests)
# Python: $REPDIAG_PYTHON, else .venv/bin/python, else python3 (benchmarks/python_env.sh).
source "$(dirname "$0")/python_env.sh"  # $python, the root as working folder, offline
exec timeout --signal=INT --kill-after=15 "${REPDIAG_GPU_E2E_TIMEOUT_S:-540}" \
    "$python" benchmarks/gpu_e2e.py "$@"
