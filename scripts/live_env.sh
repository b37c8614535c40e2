# Sourced by the live recording scripts (live_runs.sh, live_steps_runs.sh, live_interleaved.sh):
# the checkout, the capture venv's python, the engine's core, the workload size, and the environment
# every live run needs (offline model hub, one BLAS thread). Each setting can be overridden.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PY:-$ROOT/.venv-capture/bin/python}"
CPU="${CPU:-1}"
N="${N:-200}"
MAXLEN="${MAXLEN:-256}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
