"""The prefix-cache router study (docs/results.md "Routing with a prefix cache"): the Mooncake
conversation trace (its hash_ids as prefix identity) on fleets with KV blocks (``--kv-blocks
profile``, prefix caching on), every cache-aware router and round-robin, FCFS replicas, with 95%
t-intervals over seeds.

    python -m experiments.prefix_study --replicas 4,16 --per-replica 200 --seeds 5 > prefix.md

Seed s replays the window of N = per-replica x replicas consecutive Mooncake requests starting at an
offset drawn from ``default_rng(s)`` (requests, hash_ids and timestamps together, so the window keeps
the trace's own prefix sharing), its timestamps divided by replicas / 4 (the same load per replica
at every fleet size). The compiled kernel (byte-identical to the reference), one run after another.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from core.io import data_dir
from simulator.config import EngineConfig
from simulator.runner import RunConfig, execute, prepare
from simulator.workload import ArrivalSpec

ROUTERS = ("round-robin", "least-requests", "prefix-affinity", "precise-prefix", "kv-utilization", "queue-depth",
           "vllm-dp", "weighted", "kv-cost")
METRICS = ("prefix_hit_rate", "p50_ttft_ms", "p99_ttft_ms", "p50_tpot_ms", "p99_tpot_ms", "p50_e2el_ms", "p99_e2el_ms")
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def window(lines: list[str], n: int, seed: int, scale: float) -> str:
    start = int(np.random.default_rng(seed).integers(0, len(lines) - n + 1))
    rows = [json.loads(x) for x in lines[start:start + n]]
    t0 = rows[0]["timestamp"]
    for r in rows:
        r["timestamp"] = (r["timestamp"] - t0) / scale
    return "".join(json.dumps(r) + "\n" for r in rows)


def run(router: str, replicas: int, seed: int, lines: list[str], per_replica: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="prefix_study_") as folder:
        path = Path(folder) / "mooncake_window.jsonl"
        path.write_text(window(lines, per_replica * replicas, seed, replicas / 4.0))
        config = RunConfig(trace=str(path), predictor="none", policy="fcfs", load=None, seed=seed, replicas=replicas,
                           router=router, arrivals=ArrivalSpec("recorded"),
                           engine_config=EngineConfig(kv_blocks="profile"))
        summary, _ = execute(prepare(config))
    return {m: float(summary.get(m) or 0.0) for m in METRICS}


def interval(values: list[float]) -> str:
    x = np.asarray(values, dtype=np.float64)
    half = T_975.get(len(x) - 1, 1.96) * float(x.std(ddof=1)) / np.sqrt(len(x)) if len(x) > 1 else float("nan")
    return f"{x.mean():.3g} ± {half:.2g}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--replicas", default="4,16")
    p.add_argument("--per-replica", type=int, default=200)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--routers", default=",".join(ROUTERS))
    p.add_argument("--json", type=Path, help="every run's figures (rewritten after each run; reused on rerun)")
    args = p.parse_args(argv)
    lines = [x for x in (data_dir() / "arrivals" / "mooncake_conversation_trace.jsonl").read_text().splitlines() if x]
    done = json.loads(args.json.read_text()) if args.json and args.json.is_file() else {}
    for replicas in [int(r) for r in args.replicas.split(",")]:
        print(f"**{replicas} replicas** ({args.per_replica * replicas} requests a run, FCFS, --kv-blocks profile)\n")
        print("| router | hit rate | TTFT p50 (s) | TTFT p99 (s) | TPOT p50 (ms) | TPOT p99 (ms) | E2EL p50 (s) | E2EL p99 (s) |")
        print("|---|---|---|---|---|---|---|---|")
        for router in args.routers.split(","):
            runs = []
            for seed in range(args.seeds):
                key = f"{replicas}|{router}|{seed}|{args.per_replica}"
                if key not in done:
                    done[key] = run(router, replicas, seed, lines, args.per_replica)
                    if args.json:
                        args.json.write_text(json.dumps(done, indent=1, sort_keys=True))
                runs.append(done[key])
            scale = {"ttft": 1e-3, "e2el": 1e-3}
            cells = [interval([r[m] * next((v for k, v in scale.items() if k in m), 1.0) for r in runs])
                     for m in METRICS]
            print(f"| {router} | " + " | ".join(cells) + " |", flush=True)
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
