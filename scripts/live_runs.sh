#!/usr/bin/env bash
# The live serving runs in traces/live/: vLLM (CPU build) scheduled by the project's own scheduler
# (live/, loaded through vLLM's scheduler_cls), open-loop Poisson arrivals at two loads of the
# measured live FCFS capacity, output lengths forced to the recorded ones (capped), so that each
# run and its simulation serve identical work. Resumable: rerun the same command after a kill.
#
#   bash scripts/live_runs.sh                       # capacity (once, cached), then every run
#   bash scripts/live_runs.sh fcfs-0.8 leap-0.8     # only these runs
#   nohup setsid bash scripts/live_runs.sh > ~/.cache/leap-sched/live.log 2>&1 &
#
# Timing runs need an otherwise idle, pinned core: CPU (default 1) is the engine's only core;
# keep everything else off it (e.g. taskset -c 0 for other work). Each run records a drift probe
# (steps.probe_s, serving.probe) so a contended run can be recognised and rejected.
#
# Workload: the first N (200) AlpacaEval requests of traces/alpaca.parquet, lengths forced to the
# recorded output_tokens capped at MAXLEN (256); 64 resident, 16 decode slots, wait cap 128;
# the LEAP read-out is trained on lmsys (out of sample for alpaca).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/live_env.sh"
OUTDIR="${OUTDIR:-traces/live}"
READOUT="${READOUT:-$OUTDIR/leap_readout_lmsys.npz}"

COMMON=(--from traces/alpaca.parquet --requests "$N" --force-lengths --max-length "$MAXLEN"
        --max-resident 64 --decode-slots 16 --wait-cap 128 --threads "$CPU" --seed 0)

[ -f "$READOUT" ] || taskset -c "$CPU" "$PY" -m live.readout --train lmsys --out "$READOUT"

# name -> policy predictor load
declare -A RUNS=(
  [fcfs-0.8]="fcfs none 0.8" [leap-0.8]="countdown leap 0.8"
  [fcfs-1.3]="fcfs none 1.3" [leap-1.3]="countdown leap 1.3"
  [leap-rls-0.8]="countdown leap-rls 0.8" [leap-rls-1.3]="countdown leap-rls 1.3"
  [oracle-0.8]="countdown oracle 0.8" [oracle-1.3]="countdown oracle 1.3"
  [ssjf-0.8]="countdown ssjf 0.8" [ssjf-1.3]="countdown ssjf 1.3"
)
ORDER=(fcfs-0.8 leap-0.8 fcfs-1.3 leap-1.3 leap-rls-0.8 leap-rls-1.3 oracle-0.8 oracle-1.3 ssjf-0.8 ssjf-1.3)
[ $# -gt 0 ] && ORDER=("$@")

# the live FCFS capacity the loads refer to: measured once (all N queued at t=0, completions per
# second over the saturated window), kept beside the runs
CAPFILE="$OUTDIR/alpaca$N-capacity.json"
if [ ! -f "$CAPFILE" ]; then
  echo "== capacity ($(date -u +%H:%M:%S))"
  "$PY" -m live.serve "${COMMON[@]}" --policy fcfs --predictor none --capacity measure \
      | tail -n 1 > "$CAPFILE.tmp" && mv "$CAPFILE.tmp" "$CAPFILE"
fi
CAPACITY="$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["capacity_req_s"])' "$CAPFILE")"
echo "== live FCFS capacity $CAPACITY req/s"

for name in "${ORDER[@]}"; do
  [ -n "${RUNS[$name]:-}" ] || { echo "unknown run $name (choose from ${!RUNS[*]})" >&2; exit 2; }
  read -r policy predictor load <<<"${RUNS[$name]}"
  out="$OUTDIR/alpaca$N-$name.parquet"
  if [ -f "$out" ] && [ ! -d "$out.parts" ]; then echo "== $name: done ($out)"; continue; fi
  extra=()
  case "$predictor" in leap|leap-rls) extra=(--readout "$READOUT");; esac
  [ -d "$out.parts" ] && extra+=(--resume)
  echo "== $name: $policy + $predictor at ${load}x -> $out ($(date -u +%H:%M:%S))"
  "$PY" -m live.serve "${COMMON[@]}" --policy "$policy" --predictor "$predictor" \
      --arrivals poisson --load "${load}x" --capacity "$CAPACITY" --out "$out" "${extra[@]}"
done
