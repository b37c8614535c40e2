"""Start-up cost of a public lengths-only trace tiled to a large count: import (parse + validate),
tile (+ validate), and the run's preparation (predictor bound, arrivals, engine built), in CPU
seconds, and the process's peak RSS. The simulation loop itself is not run (that is the engine's
speed: ``bench_simulator.py``).

    python benchmarks/bench_public_trace.py [--trace FILE] [--requests 1000000] [--predictor none,oracle]
"""

from __future__ import annotations

import argparse
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.trace import (  # noqa: E402
    import_trace,  # noqa: E402
    load_trace,
    tile_trace,
)

AZURE_CONV = Path("arrivals") / "AzureLLMInferenceTrace_conv.csv"   # in the shared data folder (core.io.data_dir)


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=None, help="default: the Azure conversation trace in the shared data")
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--predictor", default="none,oracle")
    args = ap.parse_args()
    if args.trace is None:
        from core.io import data_dir  # $LEAP_DATA_DIR, else <checkout>/../shared/data
        args.trace = str(data_dir() / AZURE_CONV)
    from simulator.runner import RunConfig, prepare  # the simulator's import time counts as start-up
    from simulator.workload import ArrivalSpec
    t = cpu_s()
    print(f"interpreter + imports (numpy, pyarrow, simulator): {t:.2f} CPU-s")
    trace = import_trace(args.trace)
    print(f"import {Path(args.trace).name}: {len(trace):,} requests, {cpu_s() - t:.3f} CPU-s")
    t = cpu_s()
    tiled = tile_trace(trace, args.requests)
    print(f"tile to {len(tiled):,}: {cpu_s() - t:.2f} CPU-s")
    for name in args.predictor.split(","):
        t = cpu_s()
        config = RunConfig(trace=args.trace, tile=args.requests, predictor=name,
                           policy="fcfs" if name == "none" else "countdown", load=None,
                           arrivals=ArrivalSpec("recorded"))
        prepared = prepare(config, trace=load_trace(args.trace))
        print(f"prepare {name} (tile + predictor + arrivals + engine): {cpu_s() - t:.2f} CPU-s, "
              f"{len(prepared.workload):,} requests")
        del prepared
    print(f"total {cpu_s():.2f} CPU-s (process); peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
