"""Simulator speed: simulated requests per CPU-second of the simulation loop, and peak memory.

Replays 4,000 requests of the default trace at 1.0x capacity with FCFS and with countdown + the
oracle (target: >= 5,000 requests per CPU-second). Figures are medians over --repeat runs; the
machine is shared, so compare ratios from one run rather than absolute numbers across runs.
A trace with fewer requests than ``--requests`` is tiled: whole copies of it, each shuffled with a
fixed seed (ids suffixed ``#copy``), cut to the count, written to a temporary trace file (request
columns only; the oracle needs no features). The same arguments replay the same requests.

    python benchmarks/bench_simulator.py [--trace NAME] [--requests 4000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.trace import REQUIRED_COLUMNS, bundled_trace_names, load_trace, tile_trace  # noqa: E402
from simulator.runner import RunConfig, execute, prepare  # noqa: E402

TILE_SEED = 0


def tiled_trace(name: str, requests: int, folder: Path) -> tuple[str, int]:
    """The trace itself when it has enough requests, else the path of a tiled copy (the project's
    one tiling, :func:`core.trace.tile_trace`, each copy shuffled); and its size."""
    import pyarrow.parquet as pq

    trace = load_trace(name)
    n = len(trace)
    if requests <= n:
        return name, n
    table = tile_trace(trace, requests, shuffle_seed=TILE_SEED).table.select(list(REQUIRED_COLUMNS))
    path = folder / f"{trace.name}-x{requests}.parquet"
    pq.write_table(table.replace_schema_metadata(trace.table.schema.metadata), path)
    return str(path), n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = next(t for t in ("sharegpt", "sharegpt-lengths") if t in bundled_trace_names())
    ap.add_argument("--trace", default=default)
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--load", type=float, default=1.0)
    args = ap.parse_args()
    if args.requests < 1 or args.repeat < 1 or not args.load > 0:
        ap.error("--requests and --repeat must be >= 1 and --load > 0")
    with tempfile.TemporaryDirectory(prefix="bench-sim-") as folder:
        return bench(args, *tiled_trace(args.trace, args.requests, Path(folder)))


def bench(args, trace: str, trace_requests: int) -> int:
    cases = [("fcfs", "none"), ("countdown", "oracle")]
    tiled = f" (tiled from {trace_requests:,})" if trace != args.trace else ""
    print(f"trace {args.trace}, {args.requests} requests{tiled}, load {args.load}x, engine qwen3-8b-h100")
    for policy, predictor in cases:
        rates, steps, peaks = [], 0, []
        for _ in range(args.repeat):
            prepared = prepare(RunConfig(trace=trace, predictor=predictor, policy=policy, load=args.load,
                                         requests=args.requests))
            tracemalloc.start()
            summary, result = execute(prepared)
            peaks.append(tracemalloc.get_traced_memory()[1])
            tracemalloc.stop()
            # tracemalloc slows Python; time a clean run for the rate
            prepared = prepare(RunConfig(trace=trace, predictor=predictor, policy=policy, load=args.load,
                                         requests=args.requests))
            summary, result = execute(prepared)
            rates.append(summary["completed"] / result.sim_cpu_s)
            steps = result.steps
        print(f"  {policy:9s} + {predictor:6s}: {statistics.median(rates):8.0f} requests/CPU-s "
              f"(min {min(rates):.0f}, max {max(rates):.0f}; {steps} steps, "
              f"{statistics.median(rates) * steps / args.requests:,.0f} steps/CPU-s); "
              f"peak traced memory {max(peaks) / 2**20:.1f} MiB")
    print(f"  process peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
