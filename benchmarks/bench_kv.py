"""KV blocks on against off: requests per CPU-second of the simulation loop, single engine and fleet.

Sharegpt tiled to ``--requests``, at ``--load`` x capacity, KV blocks off, then on (``--kv-blocks``,
no prefix caching: what the compiled kernel models) on the compiled kernel and, for the single
engine, on the reference too; the fleet (``--replicas`` with least-requests) compiled only. Each
run's summary gives its preemptions; KV on and off compiled are timed in the same process, one
after the other (a shared machine: compare the ratios of one run, not absolute figures across runs).

    python benchmarks/bench_kv.py [--requests 20000] [--kv-blocks 2000] [--replicas 16] [--load 1.3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simulator.config import EngineConfig  # noqa: E402
from simulator.runner import RunConfig, execute, prepare  # noqa: E402


def timed(policy: str, predictor: str, kv: int | str | None, kernel: str, args, replicas: int = 1):
    """(loop CPU-s, completed, preemptions) of one run."""
    config = EngineConfig(kv_blocks=kv, prefix_caching=False if kv is not None else None)
    summary, _ = execute(prepare(RunConfig(trace="sharegpt", tile=args.requests, policy=policy, predictor=predictor,
                                           load=args.load, kernel=kernel, engine_config=config, replicas=replicas,
                                           router="least-requests")))
    return float(summary["sim_cpu_s"]), int(summary["completed"]), int(summary.get("preemptions", 0))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--kv-blocks", default="2000", help="blocks of 16 tokens per engine, or 'profile'")
    ap.add_argument("--replicas", type=int, default=16)
    ap.add_argument("--load", type=float, default=1.3)
    args = ap.parse_args()
    kv = args.kv_blocks if args.kv_blocks == "profile" else int(args.kv_blocks)
    print(f"sharegpt tiled to {args.requests:,} requests, load {args.load}x, --kv-blocks {kv} --prefix-caching off")
    print("| row | requests | loop CPU-s | requests/CPU-s | preemptions | x KV off |")
    print("|---|---|---|---|---|---|")
    rows = [("single engine, FCFS", "fcfs", "none", 1), ("single engine, countdown + oracle", "countdown", "oracle", 1),
            (f"{args.replicas} replicas, FCFS + least-requests", "fcfs", "none", args.replicas)]
    for label, policy, predictor, replicas in rows:
        kernels = ("compiled", "reference") if replicas == 1 else ("compiled",)
        off = timed(policy, predictor, None, "compiled", args, replicas)
        print(f"| {label}, KV off, compiled | {off[1]:,} | {off[0]:.2f} | {off[1] / off[0]:,.0f} | - | - |")
        for kernel in kernels:
            on = timed(policy, predictor, kv, kernel, args, replicas)
            print(f"| {label}, KV on, {kernel} | {on[1]:,} | {on[0]:.2f} | {on[1] / on[0]:,.0f} | {on[2]:,} "
                  f"| {on[0] / off[0]:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
