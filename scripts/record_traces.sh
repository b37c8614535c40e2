#!/usr/bin/env bash
# Re-record every bundled trace in traces/ (resumable: rerun the same command after a kill).
#
#   bash scripts/record_traces.sh                 # all traces, in order
#   bash scripts/record_traces.sh lmsys alpaca    # only these
#   bash scripts/record_traces.sh --finalize-partial   # before the work tree goes: write what is
#                                                 # done so far as (partial) traces to commit
#   nohup setsid bash scripts/record_traces.sh > ~/.cache/leap-sched/record.log 2>&1 &
#   # two recorders on a 2-core box, one core each (unpinned they thrash: capture/README.md):
#   EXTRA="--threads 0" nohup setsid bash scripts/record_traces.sh sharegpt > ~/.cache/leap-sched/a.log 2>&1 &
#   EXTRA="--threads 1" nohup setsid bash scripts/record_traces.sh math multilingual > ~/.cache/leap-sched/b.log 2>&1 &
#   # or split multilingual between the cores: name its shards multilingual-s0 / multilingual-s1
#   # (one per recorder); the recorder that finishes last merges them into multilingual.parquet
#
# Environment: PY (python of the capture venv, default .venv-capture/bin/python), MODEL (model
# directory, default ~/.cache/leap-sched/smollm2-135m-instruct as made by
# scripts/setup_capture_env.sh), OUTDIR (default traces/), EXTRA (more flags for every trace,
# e.g. "--threads 0-1" or, on a GPU box with another model, "--dtype bfloat16 --max-num-seqs 256
# --layer 30 --mean-layer 11 --entropy-layer 35").
#
# Settings (chosen from a measurement on 64 AlpacaEval prompts, see capture/README.md):
#   temperature 0.7, top-p 0.9, repetition penalty 1.1, one global seed 0, cap M = 1024;
#   feat_last = block 24 (25/30 depth), feat_mean = block 10, entropy pooling on block 29;
#   decode features: block 10 every 64 tokens (128: alpaca/math/multilingual), 24 lmsys+sharegpt 
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PY:-$ROOT/.venv-capture/bin/python}"
MODEL="${MODEL:-$HOME/.cache/leap-sched/smollm2-135m-instruct}"
OUTDIR="${OUTDIR:-$ROOT/traces}"
EXTRA="${EXTRA:-}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

COMMON=(--model "$MODEL" --backend vllm --max-tokens 1024 --temperature 0.7 --top-p 0.9
        --repetition-penalty 1.1 --seed 0 --layer 24 --mean-layer 10 --entropy-layer 29
        --decode-every 64 --decode-layer 10 --resume)

MODE=()
if [ "${1:-}" = "--finalize-partial" ]; then   # write what is recorded so far, generate nothing
    MODE=(--finalize-partial); shift
fi
WANT=" $* "

rec() {  # rec NAME ARGS...
    local name="$1"; shift
    if [ "$WANT" != "  " ] && [[ "$WANT" != *" $name "* ]]; then return 0; fi
    if [ ${#MODE[@]} -gt 0 ] && [ ! -e "$OUTDIR/$name.parquet" ] && [ ! -d "$OUTDIR/$name.parquet.parts" ]; then
        return 0
    fi
    echo "=== $(date -u +%FT%TZ) $name ${MODE[*]}"
    # shellcheck disable=SC2086
    "$PY" -m capture.cli "${COMMON[@]}" --out "$OUTDIR/$name.parquet" "$@" "${MODE[@]}" $EXTRA
}

rec lmsys --prompts lmsys --decode-layer 24   # LEAP-layer decode features too: training data for the refresh experiment
rec sharegpt --prompts sharegpt@0:1600 --decode-layer 24
# Multi-turn: 15 ShareGPT conversations, 3-4 turns each (60 requests, outputs capped at 128 tokens
# to record in minutes on one core), turn k's prompt = the history + the new
# message (capture/multiturn.py); no text in the trace (it is tokens, prefix hashes, lengths).
rec sharegpt-turns --prompts sharegpt-turns@0:60 --max-tokens 128 --keep-prompt-text never
# The remaining traces sample decode features every 128 tokens to keep traces/ near 80 MB.
rec alpaca --prompts alpaca --decode-every 128
# Sources are interleaved in slices, so that a partial recording (a run cut short) still covers
# every source: vLLM admits requests in submission order.
MATH=(); for i in 0 1 2 3 4; do MATH+=(--prompts "math500@$((i*100)):$((i*100+100))" --prompts "gsm8k@$((i*120)):$((i*120+120))"); done
rec math "${MATH[@]}" --decode-every 128
mgsm() {  # mgsm SLICE... -> the --prompts flags of those slices (each: 22 per MGSM language, 27 Arena)
    local i lg
    for i in "$@"; do for lg in bn de es fr ja ru sw te th zh; do printf -- '--prompts\nmgsm-%s@%d:%d\n' "$lg" $((i*22)) $((i*22+22)); done
        printf -- '--prompts\narena-nonlatin@%d:%d\n' $((i*27)) $((i*27+27)); done
}
mapfile -t MGSM < <(mgsm 0 1 2 3 4)
if [[ "$WANT" != *" multilingual-s"* ]]; then
    rec multilingual "${MGSM[@]}" --decode-every 128
fi
# The same trace in two shards, one per core or machine, recorded only when named (one recorder
# each); whichever finishes last merges them into multilingual.parquet and removes the shards.
complete() {  # complete TRACE: the file exists and its metadata does not say complete=false
    [ -f "$1" ] && "$PY" -c 'import sys; from pathlib import Path; from capture.store import is_complete, read_meta
sys.exit(0 if is_complete(read_meta(Path(sys.argv[1]))) else 1)' "$1"
}
if [[ "$WANT" == *" multilingual-s0 "* || "$WANT" == *" multilingual-s1 "* ]] && ! complete "$OUTDIR/multilingual.parquet"; then
    mapfile -t S0 < <(mgsm 0 1 2 3); mapfile -t S1 < <(mgsm 4)
    rec multilingual-s0 "${S0[@]}" --decode-every 128
    rec multilingual-s1 "${S1[@]}" --decode-every 128
    SHARDS=("$OUTDIR"/multilingual-s0.parquet "$OUTDIR"/multilingual-s1.parquet)
    if [ -f "${SHARDS[0]}" ] && [ -f "${SHARDS[1]}" ] && [ ! -d "${SHARDS[0]}.parts" ] && [ ! -d "${SHARDS[1]}.parts" ]; then
        echo "=== $(date -u +%FT%TZ) merge multilingual"
        "$PY" -m capture.cli merge "$OUTDIR"/multilingual.parquet "${SHARDS[@]}"
        rm -f "${SHARDS[@]}" "$OUTDIR"/multilingual-s[01].decode.parquet "$OUTDIR"/multilingual-s[01].steps.parquet
    fi
fi
echo "=== $(date -u +%FT%TZ) all done"
