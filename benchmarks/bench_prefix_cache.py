"""Prefix caching's cost: the Mooncake conversation trace (its hash_ids as prefix identity, recorded
arrivals) on a fleet with KV blocks (``--kv-blocks profile``), prefix caching on vs off, in CPU
seconds per run, with the hit rate and TTFT / TPOT percentiles each run printed. KV blocks are not
compiled yet, so both run on the reference engine (the fallback note is printed once).

    python benchmarks/bench_prefix_cache.py [--requests 3000] [--replicas 4] [--router round-robin]
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
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--router", default="round-robin")
    args = ap.parse_args()
    from core.io import data_dir
    from experiments.cli import main as simulate

    trace = args.trace or str(data_dir() / MOONCAKE)
    seconds = {}
    for mode in ("off", "on"):
        with tempfile.TemporaryDirectory() as out:
            argv = ["--trace", trace, "--arrivals", "recorded", "--requests", str(args.requests), "--replicas",
                    str(args.replicas), "--router", args.router, "--kv-blocks", "profile", "--prefix-caching", mode,
                    "--predictor", "none", "--quiet", "--json", "--jobs", "1", "--out", out]
            printed = io.StringIO()
            t = cpu_s()
            with contextlib.redirect_stdout(printed):
                assert simulate(argv) == 0
            seconds[mode] = cpu_s() - t
            s = json.loads(printed.getvalue().strip().splitlines()[-1])
            print(f"cache {mode:3}: {seconds[mode]:6.1f} CPU-s  hit rate {s.get('prefix_hit_rate') or 0:.3f}  "
                  f"TTFT p50/p99 {s['p50_ttft_ms'] / 1e3:.2f}/{s['p99_ttft_ms'] / 1e3:.2f} s  "
                  f"TPOT p50/p99 {s['p50_tpot_ms']:.1f}/{s['p99_tpot_ms']:.1f} ms  preemptions {s['preemptions']}")
    print(f"{args.requests} Mooncake requests, {args.replicas} replicas, {args.router}: cache on / off = "
          f"{seconds['on'] / seconds['off']:.2f}x CPU; peak RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
