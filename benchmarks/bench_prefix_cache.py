"""Prefix caching's cost: the Mooncake conversation trace (its hash_ids as prefix identity, recorded
arrivals) on a fleet with KV blocks (``--kv-blocks profile``), in CPU seconds per run, with the hit
rate and TTFT / TPOT percentiles each run printed: prefix caching on vs off on one kernel (default
compiled), or (``--kernels``) the cache-on run on the reference and the compiled kernel. A warm-up
run of 20 requests first, untimed, so the kernel's compile (or load from numba's cache) is not counted.

    python benchmarks/bench_prefix_cache.py [--requests 3000] [--replicas 4] [--router round-robin] [--kernels]
    python benchmarks/bench_prefix_cache.py --requests 0 --replicas 16 --router weighted --kernels   # issue 40
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import resource
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MOONCAKE = Path("arrivals") / "mooncake_conversation_trace.jsonl"   # in the shared data folder


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=None, help="default: the Mooncake conversation trace in the shared data")
    ap.add_argument("--requests", type=int, default=3000, help="0: the whole trace")
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--router", default="round-robin")
    ap.add_argument("--kernel", default="compiled", choices=("compiled", "reference"))
    ap.add_argument("--kernels", action="store_true", help="the cache on, on both kernels (instead of on vs off)")
    args = ap.parse_args()
    from core.io import data_dir

    trace = args.trace or str(data_dir() / MOONCAKE)
    runs = [("on", "reference"), ("on", "compiled")] if args.kernels else [("off", args.kernel), ("on", args.kernel)]
    simulate_once(trace, 20, args, *runs[-1])   # warm-up: the kernel compiled or loaded, the trace read
    seconds = {}
    for mode, kernel in runs:
        seconds[mode, kernel], s = simulate_once(trace, args.requests, args, mode, kernel)
        print(f"cache {mode:3} {kernel:9}: {seconds[mode, kernel]:7.1f} CPU-s  hit rate "
              f"{s.get('prefix_hit_rate') or 0:.3f}  TTFT p50/p99 {s['p50_ttft_ms'] / 1e3:.2f}/"
              f"{s['p99_ttft_ms'] / 1e3:.2f} s  TPOT p50/p99 {s['p50_tpot_ms']:.1f}/{s['p99_tpot_ms']:.1f} ms  "
              f"preemptions {s['preemptions']}  completed {s['completed']}")
    (a, b) = (seconds[r] for r in runs)
    label = "compiled / reference" if args.kernels else f"{args.kernel}: cache on / off"
    print(f"{args.requests or 'all'} Mooncake requests, {args.replicas} replicas, {args.router}: {label} = "
          f"{b / a:.2f}x CPU; peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    return 0


def simulate_once(trace: str, requests: int, args, mode: str, kernel: str) -> tuple[float, dict]:
    """One ``simulate`` run: (its CPU seconds, its summary)."""
    from experiments.cli import main as simulate

    with tempfile.TemporaryDirectory() as out:
        argv = ["--trace", trace, "--arrivals", "recorded", "--replicas", str(args.replicas), "--router", args.router,
                "--kv-blocks", "profile", "--prefix-caching", mode, "--kernel", kernel, "--predictor", "none",
                "--quiet", "--json", "--jobs", "1", "--out", out] + (["--requests", str(requests)] if requests else [])
        printed = io.StringIO()
        t = cpu_s()
        with contextlib.redirect_stdout(printed):
            assert simulate(argv) == 0
        return cpu_s() - t, json.loads(printed.getvalue().strip().splitlines()[-1])


if __name__ == "__main__":
    raise SystemExit(main())
