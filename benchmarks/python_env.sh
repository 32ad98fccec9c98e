# Sourced by the GPU scripts (gpu.sh, gpu_e2e.sh): the repository root as the working folder,
# the Python to run ($REPDIAG_PYTHON, else .venv/bin/python, else python3) in $python, random
# weights only (never the network) and deterministic cuBLAS.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
python=${REPDIAG_PYTHON:-.venv/bin/python}
[ -x "$python" ] || python=python3
export HF_HUB_OFFLINE=1
export CUBLAS_WORKSPACE_CONFIG=${CUBLAS_WORKSPACE_CONFIG:-:4096:8}
