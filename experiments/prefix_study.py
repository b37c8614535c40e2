"""The prefix-cache study (docs/results.md "Routing with a prefix cache"): routers x orders inside the
replicas on fleets with KV blocks (``--kv-blocks profile``, prefix caching on), with 95% t-intervals
over seeds.

    python -m experiments.prefix_study --replicas 4,16 --per-replica 200 --seeds 5 > prefix.md
    python -m experiments.prefix_study --trace sharegpt-turns --replicas 2 --policies fcfs,countdown,hrrn

``--trace mooncake`` (the default): seed s replays the window of N = per-replica x replicas consecutive
Mooncake conversation requests (their hash_ids as prefix identity) starting at an offset drawn from
``default_rng(s)`` (requests, hash_ids and timestamps together, so the window keeps the trace's own
prefix sharing), its timestamps divided by replicas / 4 (the same load per replica at every fleet
size). ``--trace sharegpt-turns``: the bundled multi-turn set (60 requests of 19 ShareGPT
conversations, their prefix_hashes and hidden states), Poisson arrivals at ``--load`` x the fleet's
FCFS capacity, drawn by the seed. Countdown needs a length predictor (``--predictor``, leap-rls):
Mooncake has no hidden states, so countdown has no row there. Policies without a compiled form
(hrrn) run on the reference engine, the rest on the compiled kernel (byte-identical to it).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from core.io import data_dir
from policies import POLICIES
from simulator.config import EngineConfig
from simulator.runner import RunConfig, execute, prepare
from simulator.workload import ArrivalSpec

ROUTERS = ("round-robin", "least-requests", "prefix-affinity", "precise-prefix", "kv-utilization", "queue-depth",
           "vllm-dp", "weighted", "kv-cost")
TRACES = ("mooncake", "sharegpt-turns")
#: policies that order by a length predictor: they run with ``--predictor`` (the rest with none)
PREDICTED = ("countdown",)
METRICS = ("prefix_hit_rate", "p50_ttft_ms", "p99_ttft_ms", "p50_tpot_ms", "p99_tpot_ms", "p50_e2el_ms", "p99_e2el_ms")
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def window(lines: list[str], n: int, seed: int, scale: float) -> str:
    start = int(np.random.default_rng(seed).integers(0, len(lines) - n + 1))
    rows = [json.loads(x) for x in lines[start:start + n]]
    t0 = rows[0]["timestamp"]
    for r in rows:
        r["timestamp"] = (r["timestamp"] - t0) / scale
    return "".join(json.dumps(r) + "\n" for r in rows)


def summary_figures(config: RunConfig) -> dict:
    summary, _ = execute(prepare(config))
    return {m: float(summary.get(m) or 0.0) for m in METRICS}


def run(args: argparse.Namespace, lines: list[str], router: str, policy: str, replicas: int, seed: int) -> dict:
    """One run's figures: ``policy`` (with ``args.predictor`` when it orders by length) behind ``router``."""

    def config(trace: str, load: float | None, arrivals: str) -> RunConfig:
        return RunConfig(trace=trace, predictor=args.predictor if policy in PREDICTED else "none", policy=policy,
                         load=load, arrivals=ArrivalSpec(arrivals), seed=seed, replicas=replicas, router=router,
                         engine_config=EngineConfig(kv_blocks=args.kv_blocks, kv_block_size=args.block_size))

    if args.trace == "sharegpt-turns":
        return summary_figures(config("sharegpt-turns", args.load, "poisson"))
    with tempfile.TemporaryDirectory(prefix="prefix_study_") as folder:
        path = Path(folder) / "mooncake_window.jsonl"
        path.write_text(window(lines, args.per_replica * replicas, seed, replicas / 4.0))
        return summary_figures(config(str(path), None, "recorded"))


def interval(values: list[float]) -> str:
    x = np.asarray(values, dtype=np.float64)
    half = T_975.get(len(x) - 1, 1.96) * float(x.std(ddof=1)) / np.sqrt(len(x)) if len(x) > 1 else float("nan")
    return f"{x.mean():.3g} ± {half:.2g}"


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The flags, checked before any run: one line naming the bad flag, exit 2."""
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--trace", choices=TRACES, default="mooncake")
    p.add_argument("--replicas", default="4,16")
    p.add_argument("--per-replica", type=int, default=200, help="mooncake: requests per replica in a window")
    p.add_argument("--load", type=float, default=1.3, help="sharegpt-turns: Poisson rate, x the fleet's FCFS capacity")
    p.add_argument("--kv-blocks", type=lambda x: x if x == "profile" else int(x), default="profile",
                   help="blocks per replica (profile: what the GPU memory holds)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--routers", default=",".join(ROUTERS))
    p.add_argument("--policies", default="fcfs", help="comma list, e.g. fcfs,countdown,hrrn")
    p.add_argument("--predictor", default="leap-rls", help="the length predictor of " + ", ".join(PREDICTED))
    p.add_argument("--json", type=Path, help="every run's figures (rewritten after each run; reused on rerun)")
    args = p.parse_args(argv)
    bad = [x for x in args.routers.split(",") if x not in ROUTERS]
    if bad:
        p.error(f"--routers: unknown {bad[0]!r} (choose from {', '.join(ROUTERS)})")
    bad = [x for x in args.policies.split(",") if x not in POLICIES]
    if bad:
        p.error(f"--policies: unknown {bad[0]!r} (choose from {', '.join(POLICIES)})")
    if args.trace == "mooncake" and any(x in PREDICTED for x in args.policies.split(",")):
        p.error(f"--policies {args.policies} --trace mooncake: {', '.join(PREDICTED)} needs a length predictor and "
                "Mooncake has no hidden states (use --trace sharegpt-turns)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    mooncake = data_dir() / "arrivals" / "mooncake_conversation_trace.jsonl"
    lines = [x for x in mooncake.read_text().splitlines() if x] if args.trace == "mooncake" else []
    done = json.loads(args.json.read_text()) if args.json and args.json.is_file() else {}
    for replicas in [int(r) for r in args.replicas.split(",")]:
        size = f"{args.per_replica * replicas} requests" if lines else f"60 requests, Poisson at {args.load}x"
        print(f"**{args.trace}, {replicas} replicas** ({size} a run, --kv-blocks {args.kv_blocks} of {args.block_size} tokens)\n")
        print("| router | order | hit rate | TTFT p50 (s) | TTFT p99 (s) | TPOT p50 (ms) | TPOT p99 (ms) | E2EL p50 (s) "
              "| E2EL p99 (s) |")
        print("|---|---|---|---|---|---|---|---|---|")
        for router in args.routers.split(","):
            for policy in args.policies.split(","):
                order = f"{policy} + {args.predictor}" if policy in PREDICTED else policy
                runs = []
                for seed in range(args.seeds):
                    key = (f"{replicas}|{router}|{seed}|{args.per_replica}" if lines else f"turns|{args.load}|{replicas}|"
                           f"{router}|{seed}|{args.kv_blocks}x{args.block_size}") + ("" if policy == "fcfs" else f"|{order}")
                    if key not in done:
                        done[key] = run(args, lines, router, policy, replicas, seed)
                        if args.json:
                            args.json.write_text(json.dumps(done, indent=1, sort_keys=True))
                    runs.append(done[key])
                cells = [interval([r[m] * (1e-3 if "ttft" in m or "e2el" in m else 1.0) for r in runs]) for m in METRICS]
                print(f"| {router} | {order} | " + " | ".join(cells) + " |", flush=True)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
