#!/usr/bin/env bash
# The GPU benchmark of the Jacobian engine (benchmarks/gpu.py), one short prepared run: at most
# 8 minutes (the script keeps to a 440 s budget; the timeout stops it at 480 s, and the JSON it
# rewrites after every step keeps what was measured). On a CPU-only machine it runs on the CPU.
#   benchmarks/gpu.sh --json results/benchmarks/gpu.json   # the paper's pass and projection
#   benchmarks/gpu.sh --tiny                                # seconds on a CPU (the tests)
# Python: $REPDIAG_PYTHON, else .venv/bin/python, else python3 (benchmarks/python_env.sh).
source "$(dirname "$0")/python_env.sh"  # $python, the root as working folder, offline
exec timeout --signal=INT --kill-after=15 "${REPDIAG_GPU_BENCH_TIMEOUT_S:-480}" \
    "$python" benchmarks/gpu.py "$@"
