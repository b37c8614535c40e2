"""Speed of a simulated fleet (issue 30 item 5), printed, not a timed test:

- one big fleet: 16 replicas x ``--big`` requests, FCFS + least-requests: requests per CPU-second of
  the loop (``sim_cpu_s``, preparation and capacity measurement not counted) and the process's peak RSS
  (measured right after it, before anything larger runs);
- cost per request at equal per-replica load: ``--per-replica`` requests per replica at 1, 4, 16, 64
  replicas (``--sizes``), FCFS + least-requests at ``--load`` x the fleet's capacity; loop CPU-us per
  request and its ratio to 1 replica;
- LEAP+RLS at hidden size ``--d`` (4096) on synthetic features: one anchored-RLS update of 8 requests at
  d + 1 parameters (``benchmarks/bench_leap.py``'s measurement), beside one p x p matvec measured in the
  same run: the update's p^2 bound is a constant number of such passes over P.

    python benchmarks/bench_fleet.py [--kernel reference|compiled] [--big 100000] [--per-replica 500]

``--kernel compiled`` asks for the compiled kernel; a fleet the kernel does not run says so on stderr and
runs on the reference engine.
"""

from __future__ import annotations

import os
import sys

for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):   # before numpy loads
    os.environ.setdefault(_name, "1")
os.environ["LEAP_BENCH_CHILD"] = "1"   # bench_leap's own re-exec (for its thread pinning) is done above

import argparse  # noqa: E402
import importlib.util  # noqa: E402
import resource  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.checks import bounded_int, split_list  # noqa: E402
from simulator.runner import KERNELS, RunConfig, execute, prepare  # noqa: E402


def fleet_run(trace: str, replicas: int, n: int, load: float, kernel: str) -> tuple[float, int]:
    """Loop CPU-s and requests of one FCFS + least-requests run of ``n`` requests (the trace tiled)."""
    config = RunConfig(trace=trace, load=load, replicas=replicas, tile=n, kernel=kernel,
                       router="least-requests" if replicas > 1 else "round-robin")
    _, result = execute(prepare(config))
    return float(result.sim_cpu_s), len(result.finish_s)


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench_leap():
    spec = importlib.util.spec_from_file_location("bench_leap", ROOT / "benchmarks" / "bench_leap.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def matvec_ms(p: int, repeats: int, rng: np.random.Generator) -> float:
    """Median CPU-ms of one p x p float64 matvec (the unit of the RLS update's p^2 bound)."""
    P, x = rng.standard_normal((p, p)), rng.standard_normal(p)
    times = []
    for _ in range(repeats):
        c0 = time.thread_time()
        P @ x
        times.append(time.thread_time() - c0)
    return float(np.median(times) * 1e3)


def rls_row(d: int, repeats: int) -> str:
    """One anchored-RLS update of 8 requests at p = d + 1, in CPU-ms and in p x p matvecs."""
    p, rng = d + 1, np.random.default_rng(0)
    update = bench_leap().bench_rls(p, 8, repeats, rng)["cpu_median_ms"]
    unit = matvec_ms(p, repeats, rng)
    return (f"LEAP+RLS at d = {d} (p = {p}), synthetic features, 8 requests per update: {update:.1f} CPU-ms per "
            f"update (median of {repeats}); one p x p matvec {unit:.2f} CPU-ms; update = {update / unit:.1f} matvecs")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--kernel", choices=KERNELS, default="reference")
    ap.add_argument("--trace", default="sharegpt")
    ap.add_argument("--big", type=bounded_int(1, 10_000_000), default=100_000,
                    help="requests of the 16-replica run")
    ap.add_argument("--per-replica", type=bounded_int(1, 100_000), default=500)
    ap.add_argument("--sizes", default="1,4,16,64", help="fleet sizes of the cost-per-request rows")
    ap.add_argument("--load", type=float, default=1.0, help="multiple of the fleet's FCFS capacity")
    ap.add_argument("--d", type=bounded_int(8, 16384), default=4096, help="LEAP hidden size")
    ap.add_argument("--repeats", type=bounded_int(3, 1000), default=20)
    args = ap.parse_args(argv)
    sizes = [bounded_int(1, 4096)(s) for s in split_list("--sizes", args.sizes)]
    print(f"kernel {args.kernel}, trace {args.trace}, FCFS + least-requests (round-robin at 1 replica), "
          f"load {args.load:g}x the fleet's capacity")
    cpu, n = fleet_run(args.trace, 16, args.big, args.load, args.kernel)
    print(f"16 replicas x {n:,} requests: loop {cpu:.1f} CPU-s, {n / cpu:,.0f} requests/CPU-s; "
          f"peak RSS {peak_rss_mib():.0f} MiB")
    base = None
    for replicas in sizes:
        cpu, n = fleet_run(args.trace, replicas, args.per_replica * replicas, args.load, args.kernel)
        per = cpu / n * 1e6
        base = per if base is None else base
        print(f"{replicas:>3} replicas x {args.per_replica} requests ({n:,}): {per:.0f} CPU-us per request, "
              f"{per / base:.2f} x the first size")
    print(rls_row(args.d, args.repeats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
