#!/usr/bin/env bash
# Interleaved wall-clock serving runs through a real `vllm serve` with the leap_sched plugin
# (leap-serve --server), with host-speed checks, for gains with confidence intervals as clients see
# them (leap-validate --profile-from CALIBRATION reports real_gain_vs_fcfs_ci95, docs/serving.md).
#
#   bash scripts/live_server_runs.sh                                  # calibration, then F L R F L R F L R
#   N=6 REPEATS=1 CPU=0 CLIENT_CPU=0 OUTDIR=/tmp/srv CAL=/tmp/cal/tiny CALDIR=/tmp/cal \
#       CALIBRATE_ARGS="--max-resident 8" bash scripts/live_server_runs.sh           # a tiny trial set
#   nohup setsid bash scripts/live_server_runs.sh > ~/.cache/leap-sched/server-runs.log 2>&1 &
#
# Order, as scripts/live_interleaved.sh: one calibration of the host (unless CAL exists), then for
# each repeat each policy in turn: a host-speed check (in-process, on CPU, no server running), a
# fresh `vllm serve` for the policy pinned to CPU (taskset, OpenMP threads bound to CPU), wait for
# /health, the run (leap-serve --server on CLIENT_CPU, the other core by default), stop the server
# (its whole process group; no engine process is left), next. One final check after the last run.
# Resumable: rerun the same command after a kill; finished runs are kept, an unfinished run gets a
# fresh check and server and resumes (--resume, a new segment).
#
# The server runs the in-process runs' engine settings (float32, token budget 2048, eager, no
# prefix caching, 64 resident, 16 decode slots, wait cap 128, the source trace's max_model_len,
# VLLM_CPU_KVCACHE_SPACE=4, seed 0, the arrival prior of half the workload's output cap) and the
# read-out READOUT for leap/leap-rls; leap-serve --server refuses a server that runs anything else
# (it reads the server's settings from the plugin's GET /leap_sched/settings).
set -euo pipefail
N="${N:-100}"
source "$(dirname "${BASH_SOURCE[0]}")/live_env.sh"
REPEATS="${REPEATS:-3}"
LOAD="${LOAD:-1.3}"
POLICIES=(${POLICIES:-fcfs leap leap-rls})
OUTDIR="${OUTDIR:-traces/live/server}"
CALDIR="${CALDIR:-traces/live/calibration}"
READOUT="${READOUT:-traces/live/leap_readout_lmsys.npz}"
SET="${SET:-alpaca$N-$LOAD}"
CAL="${CAL:-$CALDIR/$SET}"
SOURCE="${SOURCE:-traces/alpaca.parquet}"
CLIENT_CPU="${CLIENT_CPU:-$([ "$CPU" = 0 ] && echo 1 || echo 0)}"
PORT="${PORT:-8431}"
LOGDIR="${LOGDIR:-$HOME/.cache/leap-sched/server-logs}"   # server logs name machine paths: not in the repo
MODEL="${MODEL:-$("$PY" -c 'from capture.model import DEFAULT_MODEL_DIR; print(DEFAULT_MODEL_DIR)')}"
START_TIMEOUT_S="${START_TIMEOUT_S:-900}"
mkdir -p "$OUTDIR" "$CALDIR" "$LOGDIR"

declare -A POLICY=([fcfs]="fcfs none" [leap]="countdown leap" [leap-rls]="countdown leap-rls"
                   [oracle]="countdown oracle")
for p in "${POLICIES[@]}"; do
  [ -n "${POLICY[$p]:-}" ] || { echo "unknown policy $p (choose from ${!POLICY[*]})" >&2; exit 2; }
done
CALIBRATE_ARGS=(${CALIBRATE_ARGS:-})   # e.g. "--max-resident 8": a reduced grid (a tiny CAL for a trial)
calibrate() { taskset -c "$CPU" "$PY" -m live.calibrate --threads "$CPU" --quiet "${CALIBRATE_ARGS[@]}" "$@"; }

# ---- the server of one policy: start (own process group), wait for /health, stop (whole group)
SERVER_PGID=""
server_argv() {  # policy predictor -> the vllm serve argv, one per line (leap_sched.vllm.command)
  "$PY" - "$1" "$2" "$READOUT" "$MODEL" "$SOURCE" <<'EOF'
import sys
from core.trace import load_trace
from leap_sched.vllm.command import serve_argv
from live.config import LiveSchedulerConfig
policy, predictor, readout, model, source = sys.argv[1:]
src = load_trace(source)
cfg = LiveSchedulerConfig(policy=policy, predictor=predictor, max_resident=64, decode_slots=16, wait_cap=128,
                          readout=readout if predictor in ("leap", "leap-rls") else None,
                          prior_tokens=src.output_cap / 2.0)   # leap-serve --force-lengths' prior
argv = serve_argv(cfg, model, launcher="module")[1:]              # "-m vllm.entrypoints..." after python
argv += ["--dtype", "float32", "--max-model-len", str(int(src.metadata.get("max_model_len") or 8192)),
         "--max-num-batched-tokens", "2048", "--enforce-eager", "--no-enable-prefix-caching", "--seed", "0"]
print("\n".join(argv))
EOF
}
start_server() {  # policy predictor log
  local argv
  mapfile -t argv < <(server_argv "$1" "$2")
  VLLM_CPU_KVCACHE_SPACE=4 VLLM_CPU_OMP_THREADS_BIND="$CPU" OMP_NUM_THREADS=1 VLLM_USE_V2_MODEL_RUNNER=0 \
    TOKENIZERS_PARALLELISM=false setsid taskset -c "$CPU" "$PY" "${argv[@]}" --host 127.0.0.1 --port "$PORT" \
    > "$3" 2>&1 &
  local pid=$!
  # setsid makes the server its own process group (pgid = pid) once it has run: wait for that, so that
  # stop_server never signals this script's own group
  until [ "$(ps -o pgid= -p "$pid" | tr -d ' ')" = "$pid" ]; do
    kill -0 "$pid" 2> /dev/null || { echo "the server exited at once (log: $3)" >&2; tail -5 "$3" >&2; exit 1; }
    sleep 0.1
  done
  SERVER_PGID="$pid"
  local deadline=$((SECONDS + START_TIMEOUT_S))
  until curl -sf "http://127.0.0.1:$PORT/health" > /dev/null; do
    if ! kill -0 "$pid" 2> /dev/null; then
      echo "the server exited before /health (log: $3):" >&2; tail -5 "$3" >&2; SERVER_PGID=""; exit 1
    fi
    [ "$SECONDS" -lt "$deadline" ] || { echo "no /health within ${START_TIMEOUT_S}s (log: $3)" >&2; stop_server; exit 1; }
    sleep 1
  done
}
stop_server() {
  [ -n "$SERVER_PGID" ] || return 0
  [ "$SERVER_PGID" != "$(ps -o pgid= -p $$ | tr -d ' ')" ] || { echo "internal: server group is ours" >&2; exit 1; }
  kill -INT -- "-$SERVER_PGID" 2> /dev/null || true
  for _ in $(seq 1 120); do pgrep -g "$SERVER_PGID" > /dev/null || break; sleep 1; done
  if pgrep -g "$SERVER_PGID" > /dev/null; then kill -KILL -- "-$SERVER_PGID" 2> /dev/null || true; sleep 1; fi
  if pgrep -g "$SERVER_PGID" > /dev/null; then echo "server processes left: $(pgrep -g "$SERVER_PGID" | xargs)" >&2; exit 1; fi
  SERVER_PGID=""
}
trap stop_server EXIT
trap 'exit 130' INT TERM

if [ ! -f "$CAL.calibration.json" ]; then
  echo "== calibration $CAL ($(date -u +%H:%M:%S))"
  calibrate --out "$CAL" --overwrite
fi
if [ -z "${CAPACITY:-}" ]; then   # as live_interleaved.sh: the committed capacity rescaled to this host
  CAPACITY="$("$PY" - "$CAL.calibration.json" <<'EOF'
import json, sys
from core.trace import load_trace
from experiments.validate_serving import step_time_ratio
from simulator.profiles.calibration import load_calibration
base = json.load(open("traces/live/alpaca200-capacity.json"))["capacity_req_s"]
ratio = step_time_ratio(load_trace("traces/live/alpaca200-fcfs-1.3.parquet"), load_calibration(sys.argv[1]).profile())
print(f"{base * ratio:.4f}")
EOF
)"
fi
echo "== live FCFS capacity on this host: $CAPACITY req/s; load ${LOAD}x; server on CPU $CPU, client on CPU $CLIENT_CPU"

COMMON=(--from "$SOURCE" --requests "$N" --force-lengths --max-length "$MAXLEN" --max-resident 64
        --decode-slots 16 --wait-cap 128 --seed 0 --quiet)
for r in $(seq 1 "$REPEATS"); do
  for p in "${POLICIES[@]}"; do
    read -r policy predictor <<<"${POLICY[$p]}"
    name="alpaca$N-$p-$LOAD-server-r$r"
    out="$OUTDIR/$name.parquet"
    if [ -f "$out" ] && [ ! -d "$out.parts" ]; then echo "== $name: done"; continue; fi
    echo "== check before $name ($(date -u +%H:%M:%S))"
    calibrate --check "$CAL" --run "$name" --out "$CALDIR/$name.check" --overwrite
    extra=()
    case "$predictor" in leap|leap-rls) extra=(--readout "$READOUT");; esac
    [ -d "$out.parts" ] && extra+=(--resume)
    echo "== $name: server $policy + $predictor ($(date -u +%H:%M:%S))"
    start_server "$policy" "$predictor" "$LOGDIR/$name.log"
    echo "== $name: ${LOAD}x through http://127.0.0.1:$PORT -> $out ($(date -u +%H:%M:%S))"
    taskset -c "$CLIENT_CPU" "$PY" -m live.serve --server "http://127.0.0.1:$PORT" "${COMMON[@]}" \
        --policy "$policy" --predictor "$predictor" --arrivals poisson --load "${LOAD}x" --capacity "$CAPACITY" \
        --out "$out" "${extra[@]}"
    stop_server
    echo "== $name: done, server stopped ($(date -u +%H:%M:%S))"
  done
done
if [ ! -f "$CALDIR/$SET-server-final.check.calibration.json" ]; then
  echo "== final check ($(date -u +%H:%M:%S))"
  calibrate --check "$CAL" --out "$CALDIR/$SET-server-final.check" --overwrite
fi
echo "== done ($(date -u +%H:%M:%S))"
