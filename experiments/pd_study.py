"""The P/D study (docs/results.md "Prefill/decode disaggregation"): the aggregated fleet of P + D
engines against the P/D fleet at the same engine count, each decode router x {FCFS, countdown on
LEAP+RLS} at the decode instances; paired by seed against aggregated round-robin + FCFS, 95%
t-intervals over seeds (experiments.fleet_study.interval). Reference engine, one run after another.

    python -m experiments.pd_study --prefill 2 --decode 6 --requests 800 --load 1.3 --seeds 5 > pd.md

``--arrivals FILE.csv`` replays recorded timestamps (the Azure traces) as the fleet study does: seed s
takes the window of consecutive arrivals from an offset drawn from ``default_rng(s)``
(``experiments.fleet_study.arrival_window``), stretched to ``--load`` x capacity.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from core.arrivals import read_timestamps_csv
from core.checks import bounded_int
from core.errors import OneLineParser, run_command
from core.trace import TraceError
from experiments.fleet_study import arrival_window, interval
from simulator.config import EngineConfig
from simulator.runner import RunConfig, execute, prepare
from simulator.workload import ArrivalSpec

SLO = (("ttft", 2000.0), ("tpot", 100.0))
METRICS = ("mean_e2e_s", "p99_e2e_s", "mean_ttft_ms", "p99_tpot_ms", "slo_attainment")
#: (label, decode router or None for the aggregated fleet, policy, predictor)
ARMS: list[tuple[str, str | None, str, str]] = [("aggregated round-robin, FCFS", None, "fcfs", "none"),
        ("aggregated round-robin, countdown + leap-rls", None, "countdown", "leap-rls")]
for _router in ("round-robin", "least-kv", "least-work", "least-predicted-kv"):
    _estimates = _router in ("least-work", "least-predicted-kv")   # the router reads LEAP+RLS's estimates
    ARMS.append((f"P/D {_router}, FCFS" + (" (leap-rls estimates)" if _estimates else ""), _router, "fcfs",
                 "leap-rls" if _estimates else "none"))
    ARMS.append((f"P/D {_router}, countdown + leap-rls", _router, "countdown", "leap-rls"))


def run(arm: tuple, args: argparse.Namespace, seed: int) -> dict:
    _, decode_router, policy, predictor = arm
    pd = {} if decode_router is None else {"prefill_replicas": args.prefill, "decode_replicas": args.decode,
                                           "decode_router": decode_router}
    with tempfile.TemporaryDirectory(prefix="pd_study_") as folder:
        arrivals = ArrivalSpec()
        if args.times is not None:      # the seed's window, read back by the engine's own CSV path
            path = Path(folder) / "arrivals.csv"
            window = arrival_window(args.times, args.requests, seed)
            path.write_text("arrival_s\n" + "".join(f"{float(t)!r}\n" for t in window))
            arrivals = ArrivalSpec("csv", path)
        config = RunConfig(trace=args.trace, predictor=predictor, policy=policy, load=args.load, seed=seed,
                           requests=args.requests, kernel="reference", goodput=SLO, arrivals=arrivals,
                           engine_config=EngineConfig(kv_blocks=args.kv_blocks),
                           replicas=1 if pd else args.prefill + args.decode, **pd)
        summary, _ = execute(prepare(config))
    return {m: summary[m] for m in METRICS}


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="pd-study")
    p.add_argument("--trace", default="sharegpt")
    p.add_argument("--prefill", type=bounded_int(1, 64), default=2)
    p.add_argument("--decode", type=bounded_int(1, 64), default=6)
    p.add_argument("--requests", type=bounded_int(1), default=800)
    p.add_argument("--load", type=float, default=1.3)
    p.add_argument("--seeds", type=bounded_int(2, 10), default=5)
    p.add_argument("--kv-blocks", type=bounded_int(1), help="KV blocks per engine (default: unbounded)")
    p.add_argument("--arrivals", type=Path, help="replay recorded timestamps (CSV) instead of Poisson arrivals")
    args = p.parse_args(argv)
    args.times = read_timestamps_csv(args.arrivals) if args.arrivals is not None else None
    how = "Poisson" if args.arrivals is None else f"{args.arrivals.name} windows"
    seeds = list(range(args.seeds))
    runs = {(arm[0], s): run(arm, args, s) for arm in ARMS for s in seeds}
    base = ARMS[0][0]
    print(f"{args.prefill}+{args.decode} engines, {args.trace} first {args.requests} requests, {how} at "
          f"{args.load}x capacity, KV blocks {args.kv_blocks or 'unbounded'}, seeds {seeds[0]}-{seeds[-1]}; SLO ttft 2000 ms, tpot 100 ms\n")
    print("| arm | " + " | ".join(METRICS) + " | mean e2e vs base |")
    print("|---|" + "---|" * (len(METRICS) + 1))
    for arm in ARMS:
        cells = [arm[0]]
        for metric in METRICS:
            mean, half = interval([runs[(arm[0], s)][metric] for s in seeds])
            cells.append(f"{mean:.4g} ± {half:.2g}")
        if arm[0] == base:
            cells.append("-")
        else:
            change = [100.0 * (runs[(arm[0], s)]["mean_e2e_s"] / runs[(base, s)]["mean_e2e_s"] - 1) for s in seeds]
            c_mean, c_half = interval(change)
            cells.append(f"{c_mean:+.1f}% ± {c_half:.1f}")
        print("| " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_command(main, sys.argv[1:], "pd-study", input_errors=(TraceError, ValueError, OSError)))
