#!/usr/bin/env bash
# Interleaved wall-clock serving runs with host-speed checks, for gains with confidence intervals
# (leap-validate --profile-from CALIBRATION reports real_gain_vs_fcfs_ci95, docs/validation.md).
#
#   bash scripts/live_interleaved.sh                    # calibration, then F L R O F L R O F L R O
#   N=100 REPEATS=2 POLICIES="fcfs leap oracle" bash scripts/live_interleaved.sh   # a reduced set
#   WORKLOAD=lmsys N=100 SET=lmsys100-1.3 bash scripts/live_interleaved.sh   # the second workload
#   nohup setsid bash scripts/live_interleaved.sh > ~/.cache/leap-sched/interleaved.log 2>&1 &
#
# Order: one calibration of the host (leap-serve calibrate, a few minutes), then for each repeat
# each policy in turn, each run preceded by a short check of the host's speed against the
# calibration (a subset of its grid, < 30 s), and one final check after the last run (so every
# run has a check before and after it). Resumable: rerun the same command after a kill; finished
# runs are kept, an unfinished run gets a fresh check and resumes (--resume, a new segment).
#
# The engine is pinned to CPU (default 1) with taskset and --threads; keep everything else off it.
# Load: LOAD x the live FCFS capacity. The workload's committed capacity (alpaca:
# traces/live/alpaca200-capacity.json; lmsys: lmsys200-steps-capacity.json) was measured in another
# session; unless CAPACITY is given it is rescaled to this host by the calibration (capacity x the
# committed FCFS 1.3x run of that session: its median step time over the calibration's profile for
# the same steps), so that LOAD means the same queueing pressure. LEAP's read-out is trained on the
# other workload (as in live_steps_runs.sh): the predictor never saw the prompts it schedules.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/live_env.sh"
REPEATS="${REPEATS:-3}"
LOAD="${LOAD:-1.3}"
POLICIES=(${POLICIES:-fcfs leap leap-rls oracle})
OUTDIR="${OUTDIR:-traces/live/interleaved}"
CALDIR="${CALDIR:-traces/live/calibration}"
WORKLOAD="${WORKLOAD:-alpaca}"
declare -A READOUT_TRAIN=([alpaca]=lmsys [lmsys]=alpaca)
declare -A CAPACITY_RUN=([alpaca]="alpaca200-capacity.json alpaca200-fcfs-1.3.parquet"
                         [lmsys]="lmsys200-steps-capacity.json lmsys200-steps-fcfs-1.3.parquet")
[ -n "${READOUT_TRAIN[$WORKLOAD]:-}" ] || { echo "unknown WORKLOAD $WORKLOAD (alpaca or lmsys)" >&2; exit 2; }
READOUT="${READOUT:-traces/live/leap_readout_${READOUT_TRAIN[$WORKLOAD]}.npz}"
SET="${SET:-$WORKLOAD$N-$LOAD}"
CAL="$CALDIR/$SET"
mkdir -p "$OUTDIR" "$CALDIR"

declare -A POLICY=([fcfs]="fcfs none" [leap]="countdown leap" [leap-rls]="countdown leap-rls"
                   [oracle]="countdown oracle")
for p in "${POLICIES[@]}"; do
  [ -n "${POLICY[$p]:-}" ] || { echo "unknown policy $p (choose from ${!POLICY[*]})" >&2; exit 2; }
done
calibrate() { taskset -c "$CPU" "$PY" -m live.calibrate --threads "$CPU" --quiet "$@"; }
# step-clocked recordings (leap-serve --clock steps) on the same core go first: wait them out
yield_core() {
  [ "${YIELD:-1}" = 1 ] || return 0   # YIELD=0: share the core (the checks then measure the sharing)
  while pgrep -f "live_steps_runs.sh" > /dev/null \
      || pgrep -af "live.serve|leap-serve" | grep -- "--clock steps" | grep -q -- "--threads $CPU\b"; do
    echo "   a step-clocked recording holds CPU $CPU; waiting ($(date -u +%H:%M:%S))"; sleep 30
  done
}

if [ ! -f "$CAL.calibration.json" ]; then
  yield_core
  echo "== calibration $CAL ($(date -u +%H:%M:%S))"
  calibrate --out "$CAL" --overwrite
fi
if [ -z "${CAPACITY:-}" ]; then
  read -r capfile caprun <<<"${CAPACITY_RUN[$WORKLOAD]}"
  CAPACITY="$("$PY" - "$CAL.calibration.json" "traces/live/$capfile" "traces/live/$caprun" <<'EOF'
import json, sys
from core.trace import load_trace
from experiments.serving_replay import step_time_ratio
from simulator.profiles.calibration import load_calibration
base = json.load(open(sys.argv[2]))["capacity_req_s"]
ratio = step_time_ratio(load_trace(sys.argv[3]), load_calibration(sys.argv[1]).profile())
print(f"{base * ratio:.4f}")
EOF
)"
fi
echo "== live FCFS capacity on this host: $CAPACITY req/s; load ${LOAD}x"

COMMON=(--from "traces/$WORKLOAD.parquet" --requests "$N" --force-lengths --max-length "$MAXLEN"
        --max-resident 64 --decode-slots 16 --wait-cap 128 --threads "$CPU" --seed 0 --quiet)
for r in $(seq 1 "$REPEATS"); do
  for p in "${POLICIES[@]}"; do
    read -r policy predictor <<<"${POLICY[$p]}"
    name="$WORKLOAD$N-$p-$LOAD-r$r"
    out="$OUTDIR/$name.parquet"
    if [ -f "$out" ] && [ ! -d "$out.parts" ]; then echo "== $name: done"; continue; fi
    yield_core
    echo "== check before $name ($(date -u +%H:%M:%S))"
    calibrate --check "$CAL" --run "$name" --out "$CALDIR/$name.check" --overwrite
    extra=()
    case "$predictor" in leap|leap-rls) extra=(--readout "$READOUT");; esac
    [ -d "$out.parts" ] && extra+=(--resume)
    echo "== $name: $policy + $predictor at ${LOAD}x -> $out ($(date -u +%H:%M:%S))"
    taskset -c "$CPU" "$PY" -m live.serve "${COMMON[@]}" --policy "$policy" --predictor "$predictor" \
        --arrivals poisson --load "${LOAD}x" --capacity "$CAPACITY" --out "$out" "${extra[@]}"
  done
done
if [ ! -f "$CALDIR/$SET-final.check.calibration.json" ]; then
  echo "== final check ($(date -u +%H:%M:%S))"
  calibrate --check "$CAL" --out "$CALDIR/$SET-final.check" --overwrite
fi
echo "== done ($(date -u +%H:%M:%S))"
