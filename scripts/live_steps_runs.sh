#!/usr/bin/env bash
# The step-clocked live runs in traces/live/ (docs/semantics.md "Step clock"): vLLM scheduled by
# the project's scheduler, each request submitted just before a given engine step (Poisson in
# steps, seed 0, at a load of the live capacity in requests per step), output lengths forced to
# the recorded ones (capped), per-request admit/first-token/finish steps recorded. No decision
# depends on the host's speed, so runs may share the machine; `simulate --arrivals steps` replays
# each one request by request. Resumable at run granularity: finished runs are skipped, a run cut
# short restarts from its first step (rerun the same command). Two engines (CPU=0 and CPU=1) may
# work through one list in opposite orders: a run the other engine holds is skipped.
#
#   bash scripts/live_steps_runs.sh                           # alpaca200 then lmsys200, all runs
#   WORKLOADS=lmsys bash scripts/live_steps_runs.sh fcfs-0.8  # only this run
#   N=40 CAPACITY_FROM=traces/live/alpaca200-steps-capacity.json WORKLOADS=alpaca \
#       bash scripts/live_steps_runs.sh fcfs-1.3 oracle-1.3   # a small set at the 200's capacity
#   KV_BLOCKS=88 N=40 CAPACITY_FROM=traces/live/alpaca200-steps-capacity.json WORKLOADS=alpaca \
#       bash scripts/live_steps_runs.sh fcfs-1.3 oracle-1.3 leap-1.3   # a KV cache of 88 blocks of
#       # KV_BLOCK_SIZE (32) tokens, small enough to preempt: alpaca40-steps-kv88-*.parquet
#   PREFIX_CACHING=on KV_BLOCKS=128 N=60 CAPACITY_FROM=traces/live/alpaca200-steps-capacity.json \
#       WORKLOADS=sharegpt-turns bash scripts/live_steps_runs.sh fcfs-1.3 oracle-1.3   # vLLM's prefix
#       # caching on over those blocks (leap-serve --prefix-caching): sharegpt-turns60-steps-kv128-prefix-*
#       # (without PREFIX_CACHING the bound cache runs with caching off, as the kv88 runs were recorded)
#   nohup setsid bash scripts/live_steps_runs.sh > /tmp/steps.log 2>&1 &
#   CPU=0 WORKLOADS=lmsys nohup setsid bash scripts/live_steps_runs.sh > /tmp/steps0.log 2>&1 &
#
# Same engine settings as scripts/live_runs.sh: 64 resident, 16 decode slots, wait cap 128, token
# budget 2048, forced lengths capped at MAXLEN (256). The LEAP read-out is out of sample for the
# workload: trained on lmsys for alpaca, on alpaca for lmsys.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/live_env.sh"
OUTDIR="${OUTDIR:-traces/live}"
WORKLOADS="${WORKLOADS:-alpaca lmsys}"
KV=()                                  # KV_BLOCKS=N: a bound KV cache (live/kv_cache.py), runs named -kvN-
[ -n "${KV_BLOCKS:-}" ] && KV=(--kv-blocks "$KV_BLOCKS" --kv-block-size "${KV_BLOCK_SIZE:-32}" --kv-space-gib 1
                               --prefix-caching "${PREFIX_CACHING:-off}")
PC=""; [ "${PREFIX_CACHING:-off}" = on ] && PC="-prefix"   # runs with vLLM's prefix caching: -kvN-prefix-

declare -A READOUT_TRAIN=([alpaca]=lmsys [lmsys]=alpaca [sharegpt-turns]=lmsys)
# name -> policy predictor load
declare -A RUNS=(
  [fcfs-1.3]="fcfs none 1.3" [leap-1.3]="countdown leap 1.3"
  [leap-rls-1.3]="countdown leap-rls 1.3" [oracle-1.3]="countdown oracle 1.3"
  [fcfs-0.8]="fcfs none 0.8" [leap-0.8]="countdown leap 0.8"
  [leap-rls-0.8]="countdown leap-rls 0.8" [oracle-0.8]="countdown oracle 0.8"
  [mlfq-1.3]="mlfq none 1.3" [slack-mlfq-1.3]="slack-mlfq leap-rls 1.3"   # their settings' defaults
)
ORDER=(fcfs-1.3 leap-1.3 leap-rls-1.3 oracle-1.3 fcfs-0.8 leap-0.8 leap-rls-0.8 oracle-0.8)
[ $# -gt 0 ] && ORDER=("$@")
[ "${ORDER[*]}" = capacity ] && ORDER=()          # `... live_steps_runs.sh capacity`: measure only
for name in ${ORDER[@]+"${ORDER[@]}"}; do
  [ -n "${RUNS[$name]:-}" ] || { echo "unknown run $name (choose from ${!RUNS[*]} capacity)" >&2; exit 2; }
done

for wl in $WORKLOADS; do
  [ -n "${READOUT_TRAIN[$wl]:-}" ] || { echo "unknown workload $wl (alpaca, lmsys or sharegpt-turns)" >&2; exit 2; }
  COMMON=(--from "traces/$wl.parquet" --requests "$N" --force-lengths --max-length "$MAXLEN"
          --max-resident 64 --decode-slots 16 --wait-cap 128 --threads "$CPU" --seed 0 --clock steps)
  readout="$OUTDIR/leap_readout_${READOUT_TRAIN[$wl]}.npz"
  [ -f "$readout" ] || taskset -c "$CPU" "$PY" -m live.readout --train "${READOUT_TRAIN[$wl]}" --out "$readout"

  # the live FCFS capacity in requests per step: all N queued at step 0, completions per step over
  # the saturated window; measured once per workload, kept beside the runs
  capfile="${CAPACITY_FROM:-$OUTDIR/$wl$N-steps-capacity.json}"
  if [ ! -f "$capfile" ]; then
    echo "== $wl$N capacity ($(date -u +%H:%M:%S))"
    taskset -c "$CPU" "$PY" -m live.serve "${COMMON[@]}" --policy fcfs --predictor none --capacity measure \
        | tail -n 1 > "$capfile.$$.tmp" && mv "$capfile.$$.tmp" "$capfile"
  fi
  capacity="$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["capacity_req_per_step"])' "$capfile")"
  echo "== $wl$N: live FCFS capacity $capacity req/step ($capfile)"

  for name in ${ORDER[@]+"${ORDER[@]}"}; do
    read -r policy predictor load <<<"${RUNS[$name]}"
    out="$OUTDIR/$wl$N-steps${KV_BLOCKS:+-kv$KV_BLOCKS$PC}-$name.parquet"
    if [ -f "$out" ] && [ ! -d "$out.parts" ]; then echo "== $name: done ($out)"; continue; fi
    extra=()
    case "$predictor" in leap|leap-rls) extra=(--readout "$readout");; esac
    if [ -e "$out" ] || [ -d "$out.parts" ]; then extra+=(--overwrite); fi   # a cut-short run starts over
    echo "== $wl$N $name: $policy + $predictor at ${load}x -> $out ($(date -u +%H:%M:%S))"
    # a failed run (or one another engine is recording: its output is locked) does not stop the rest
    taskset -c "$CPU" "$PY" -m live.serve "${COMMON[@]}" --policy "$policy" --predictor "$predictor" \
        --arrivals poisson --load "${load}x" --capacity "$capacity" --out "$out" "${extra[@]}" ${KV[@]+"${KV[@]}"} \
        || echo "== $wl$N $name: FAILED (exit $?), continuing"
  done
done
