"""The fleet study (docs/results.md "Fleets"): routers x policies at several fleet sizes, each
against round-robin + FCFS on the same seed, with 95% t-intervals over seeds.

    python -m experiments.fleet_study --replicas 4,16 --per-replica 500 --seeds 5 --load 1.3 > fleet.md

What LEAP adds at the router (least-work on LEAP+RLS estimates, FCFS replicas), at the replica
(round-robin, countdown on LEAP+RLS), and at both; least-requests is the field's default and
oracle-work + oracle countdown the bound. Runs on the reference engine, one after another.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass

import numpy as np

from core.checks import bounded_int, split_list
from simulator.runner import RunConfig, execute, prepare


@dataclass(frozen=True)
class Arm:
    label: str
    router: str
    predictor: str
    policy: str


ARMS = (
    Arm("round-robin + FCFS (baseline)", "round-robin", "none", "fcfs"),
    Arm("least-requests + FCFS", "least-requests", "none", "fcfs"),
    Arm("LEAP at the replica: round-robin + countdown", "round-robin", "leap-rls", "countdown"),
    Arm("LEAP at the router: least-work + FCFS", "least-work", "leap-rls", "fcfs"),
    Arm("LEAP at both: least-work + countdown", "least-work", "leap-rls", "countdown"),
    Arm("bound: oracle-work + oracle countdown", "oracle-work", "oracle", "countdown"),
)
METRICS = ("mean_e2e_s", "p99_e2e_s", "mean_tpot_s", "p99_tpot_s")
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def run_arm(arm: Arm, trace: str, replicas: int, load: float, seed: int, per_replica: int) -> dict:
    """One run's figures (TPOT per request = (finish - first token) / (output tokens - 1)); the trace is
    tiled to ``per_replica`` x ``replicas`` requests, so every fleet size holds the same queue per replica."""
    config = RunConfig(trace=trace, predictor=arm.predictor, policy=arm.policy, load=load, seed=seed,
                       replicas=replicas, router=arm.router, kernel="reference", tile=per_replica * replicas)
    summary, result = execute(prepare(config))
    multi = result.output_tokens > 1
    tpot = (result.finish_s - result.first_token_s)[multi] / (result.output_tokens[multi] - 1)
    return {"mean_e2e_s": summary["mean_e2e_s"], "p99_e2e_s": summary["p99_e2e_s"],
            "mean_tpot_s": float(tpot.mean()), "p99_tpot_s": float(np.percentile(tpot, 99)),
            "balance": summary["replica_work_max_over_mean"]}


def interval(values: list[float]) -> tuple[float, float]:
    """Mean and 95% half-width (Student t over seeds)."""
    x = np.asarray(values, dtype=np.float64)
    if len(x) < 2:
        return float(x.mean()), float("nan")
    return float(x.mean()), T_975.get(len(x) - 1, 1.96) * float(x.std(ddof=1)) / np.sqrt(len(x))


def table(runs: dict, replicas: int, seeds: list[int]) -> list[str]:
    """Markdown rows: each arm's figures (mean over seeds) and change vs the baseline, paired by seed."""
    base = ARMS[0].label
    lines = [f"**{replicas} replicas**", "",
             "| arm | mean e2e (s) | vs base | p99 e2e (s) | vs base | mean TPOT (ms) | vs base | p99 TPOT (ms) "
             "| vs base | balance |", "|---|---|---|---|---|---|---|---|---|---|"]
    for arm in ARMS:
        cells = [arm.label]
        for metric in METRICS:
            scale = 1000.0 if "tpot" in metric else 1.0
            values = [runs[(replicas, arm.label, s)][metric] for s in seeds]
            mean, half = interval(values)
            cells.append(f"{mean * scale:.3g} ± {half * scale:.2g}")
            if arm.label == base:
                cells.append("-")
                continue
            change = [100.0 * (runs[(replicas, arm.label, s)][metric] / runs[(replicas, base, s)][metric] - 1)
                      for s in seeds]
            c_mean, c_half = interval(change)
            cells.append(f"{c_mean:+.1f}% ± {c_half:.1f}")
        balance = [runs[(replicas, arm.label, s)]["balance"] for s in seeds]
        cells.append(f"{np.mean(balance):.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="fleet_study", description=__doc__.splitlines()[0])
    p.add_argument("--trace", default="sharegpt")
    p.add_argument("--replicas", default="4,16", help="comma list of fleet sizes")
    p.add_argument("--load", type=float, default=1.3, help="multiple of the fleet's FCFS capacity")
    p.add_argument("--per-replica", type=bounded_int(1, 100_000), default=500,
                   help="requests per replica (the trace tiled to this x replicas)")
    p.add_argument("--seeds", type=bounded_int(2, 10), default=5)
    p.add_argument("--json", help="also write every run's figures here")
    args = p.parse_args(argv)
    sizes = [int(x) for x in split_list("--replicas", args.replicas)]
    seeds = list(range(args.seeds))
    runs: dict = {}
    started = time.process_time()
    for replicas in sizes:
        for seed in seeds:
            for arm in ARMS:
                runs[(replicas, arm.label, seed)] = run_arm(arm, args.trace, replicas, args.load, seed, args.per_replica)
                print(f"fleet_study: {replicas} {arm.router} {arm.predictor} {arm.policy} seed {seed}: "
                      f"{runs[(replicas, arm.label, seed)]}", file=sys.stderr, flush=True)
    print(f"Trace {args.trace} tiled to {args.per_replica} requests per replica, Poisson arrivals at {args.load:g}x the fleet's FCFS capacity, seeds "
          f"{seeds[0]}-{seeds[-1]}; figures are means over seeds ± 95% t-interval; 'vs base' is the change "
          "against round-robin + FCFS on the same seed (mean ± 95% t-interval over seeds); balance = outstanding "
          "true work per replica, max / mean, averaged over routings.\n")
    for replicas in sizes:
        print("\n".join(table(runs, replicas, seeds)) + "\n")
    print(f"({len(runs)} runs, {time.process_time() - started:.0f} CPU-s)", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"replicas": k[0], "arm": k[1], "seed": k[2], **v} for k, v in runs.items()], f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
