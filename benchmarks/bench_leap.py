"""Benchmark of LEAP's CPU side at paper scale (d = 4096 by default) with synthetic features.

Prints:
- single-request prediction latency (median, p95) and throughput on one core: raw fp16/fp32 feature
  vector -> folded float32 dot product -> clip -> square (``LinearReadout.predict_one``);
- batched throughput (``LinearReadout.predict_batch``) for several batch sizes;
- one anchored-RLS update of 8 requests at d + 1 parameters (median, p95, min over repeats, in
  steady state: each update includes applying the previous update's deferred downdate), next to the
  textbook numpy formulation for reference;
- RLS state memory (P bytes);
- the cost-model constants in predictors/leap.py next to what was measured.

It re-executes itself with OMP/OPENBLAS/MKL_NUM_THREADS=1 so every figure is single-threaded.
A script, not a test: ``python benchmarks/bench_leap.py [--d 4096] [--quick] [--json]``.
"""

from __future__ import annotations

import os
import sys

_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
                "NUMEXPR_NUM_THREADS")

if os.environ.get("LEAP_BENCH_CHILD") != "1":                 # pin BLAS to one thread before numpy loads
    _env = dict(os.environ, LEAP_BENCH_CHILD="1", **{v: "1" for v in _THREAD_VARS})
    os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *sys.argv[1:]], _env)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from core.readout import LinearReadout  # noqa: E402
from predictors.leap import RLS_FIXED_S, RLS_S_PER_BD2, AnchoredRLS, prediction_cpu_s, rls_update_cpu_s  # noqa: E402


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def make_readout(d: int, rng: np.random.Generator) -> LinearReadout:
    return LinearReadout(mean=rng.standard_normal(d), scale=rng.uniform(0.5, 2.0, d),
                         theta=np.r_[rng.standard_normal(d) * 0.05, 14.0], cap=2048)


def bench_single(readout: LinearReadout, xs: np.ndarray) -> dict:
    predict_one = readout.predict_one
    for x in xs[:2000]:                                     # warm up
        predict_one(x)
    clock = time.perf_counter_ns
    lat = np.empty(len(xs))
    for i, x in enumerate(xs):
        t0 = clock()
        predict_one(x)
        lat[i] = clock() - t0
    start, cpu = time.perf_counter(), time.thread_time()
    for x in xs:
        predict_one(x)
    elapsed, cpu = time.perf_counter() - start, time.thread_time() - cpu
    return {"median_us": float(np.median(lat) / 1e3), "p95_us": float(np.percentile(lat, 95) / 1e3),
            "p99_us": float(np.percentile(lat, 99) / 1e3), "per_s": len(xs) / elapsed,
            "per_cpu_s": len(xs) / cpu if cpu > 0 else float("nan")}


def bench_batched(readout: LinearReadout, X: np.ndarray, sizes=(64, 512, 4096)) -> dict:
    out = {}
    for size in sizes:
        batch = X[:size]
        readout.predict_batch(batch)
        reps = max(3, 20000 // size)
        start = time.perf_counter()
        for _ in range(reps):
            readout.predict_batch(batch)
        out[str(size)] = size * reps / (time.perf_counter() - start)
    return out


def make_rls(p: int, rng: np.random.Generator) -> AnchoredRLS:
    B = rng.standard_normal((p, 16))
    P = 1e-4 * (B @ B.T) / p
    P[np.diag_indices_from(P)] += 1e-2
    return AnchoredRLS(np.zeros(p), P)


def bench_rls(p: int, batch: int, repeats: int, rng: np.random.Generator) -> dict:
    rls = make_rls(p, rng)
    Us = [np.c_[rng.standard_normal((batch, p - 1)), np.ones(batch)] for _ in range(repeats + 2)]
    ys = [rng.uniform(1, 45, batch) for _ in range(repeats + 2)]
    rls.update(Us[0], ys[0])                                # first update: no pending downdate yet
    rls.update(Us[1], ys[1])
    times, cpus = [], []
    for U, y in zip(Us[2:], ys[2:]):
        t0, c0 = time.perf_counter(), time.thread_time()
        rls.update(U, y)
        times.append(time.perf_counter() - t0)
        cpus.append(time.thread_time() - c0)
    t0 = time.perf_counter()
    rls.flush()
    flush_s = time.perf_counter() - t0
    times, cpus = np.array(times), np.array(cpus)
    return {"median_ms": float(np.median(times) * 1e3), "mean_ms": float(times.mean() * 1e3),
            "p95_ms": float(np.percentile(times, 95) * 1e3), "min_ms": float(times.min() * 1e3),
            "cpu_median_ms": float(np.median(cpus) * 1e3), "cpu_mean_ms": float(cpus.mean() * 1e3),
            "flush_ms": flush_s * 1e3, "state_bytes": rls.nbytes, "P_bytes": int(p * p * 8)}


def bench_rls_textbook(p: int, batch: int, repeats: int, rng: np.random.Generator) -> dict:
    """V = P U^T; G = V (I + U V)^-1; theta += G (y - U theta); P -= G V^T (numpy, temporaries)."""
    P = make_rls(p, rng)._P
    theta = np.zeros(p)
    times = []
    for _ in range(repeats):
        U = np.c_[rng.standard_normal((batch, p - 1)), np.ones(batch)]
        y = rng.uniform(1, 45, batch)
        t0 = time.perf_counter()
        V = P @ U.T
        G = np.linalg.solve(np.eye(batch) + U @ V, V.T).T
        theta += G @ (y - U @ theta)
        P -= G @ V.T
        times.append(time.perf_counter() - t0)
    return {"median_ms": float(np.median(times) * 1e3), "min_ms": float(min(times) * 1e3)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, default=4096, help="feature dimension (default 4096, as Qwen3-8B)")
    ap.add_argument("--n", type=int, default=60000, help="single-request predictions to time")
    ap.add_argument("--repeats", type=int, default=24, help="timed RLS updates (a multiple of 4 "
                    "covers whole read-only/fold cycles)")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.repeats = 10000, 8
    rng = np.random.default_rng(0)
    d = args.d
    readout = make_readout(d, rng)
    X16 = rng.standard_normal((args.n, d)).astype(np.float16)
    X32 = X16.astype(np.float32)
    res = {
        "machine": f"{_cpu_name()}, {os.cpu_count()} logical CPUs, numpy {np.__version__}, "
                   f"threads pinned to 1, python {platform.python_version()}",
        "d": d,
        "single_fp32": bench_single(readout, X32),
        "single_fp16": bench_single(readout, X16[: max(args.n // 4, 2000)]),
        "single_fp16_d576": bench_single(make_readout(576, rng),
                                         rng.standard_normal((20000, 576)).astype(np.float16)),
        "batched_per_s": bench_batched(readout, X32),
        "rls_update_b8": bench_rls(d + 1, 8, args.repeats, rng),
        "rls_update_b8_textbook": bench_rls_textbook(d + 1, 8, max(3, args.repeats // 3), rng),
        "rls_update_b8_d577": bench_rls(577, 8, args.repeats * 4, rng),
        "model": {"prediction_cpu_s(d)": prediction_cpu_s(d), "prediction_cpu_s(576)": prediction_cpu_s(576),
                  "RLS_FIXED_S": RLS_FIXED_S, "RLS_S_PER_BD2": RLS_S_PER_BD2,
                  "rls_update_cpu_s(8, d+1)": rls_update_cpu_s(8, d + 1),
                  "rls_update_cpu_s(8, 577)": rls_update_cpu_s(8, 577)},
    }
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    s, s16, b = res["single_fp32"], res["single_fp16"], res["batched_per_s"]
    r, rt, r5 = res["rls_update_b8"], res["rls_update_b8_textbook"], res["rls_update_b8_d577"]
    print(f"machine: {res['machine']}")
    print(f"d = {d}")
    print(f"single request (fp32 feature): median {s['median_us']:.2f} us, p95 {s['p95_us']:.2f} us, "
          f"p99 {s['p99_us']:.2f} us, {s['per_s']:,.0f} predictions/s on one core "
          f"({s['per_cpu_s']:,.0f} per CPU-second; target >= 58,000/s, p95 < 1 ms)")
    print(f"single request (fp16 feature): median {s16['median_us']:.2f} us, p95 {s16['p95_us']:.2f} us, "
          f"{s16['per_s']:,.0f} predictions/s ({s16['per_cpu_s']:,.0f} per CPU-second)")
    s5 = res["single_fp16_d576"]
    print(f"single request (fp16 feature, d = 576): median {s5['median_us']:.2f} us, p95 {s5['p95_us']:.2f} us, "
          f"{s5['per_s']:,.0f} predictions/s")
    print("batched: " + ", ".join(f"batch {k}: {v:,.0f}/s" for k, v in b.items()))
    print(f"RLS update of 8 at {d + 1} parameters: wall median {r['median_ms']:.1f} ms, mean {r['mean_ms']:.1f} ms, "
          f"p95 {r['p95_ms']:.1f} ms, min {r['min_ms']:.1f} ms; CPU median {r['cpu_median_ms']:.1f} ms, "
          f"mean {r['cpu_mean_ms']:.1f} ms (target < 20 ms); flush of a pending downdate {r['flush_ms']:.1f} ms")
    print(f"  textbook numpy formulation (P -= G V^T with temporaries): median {rt['median_ms']:.1f} ms, "
          f"min {rt['min_ms']:.1f} ms")
    print(f"RLS update of 8 at 577 parameters (SmolLM2-135M): median {r5['median_ms']:.2f} ms, "
          f"mean {r5['mean_ms']:.2f} ms, p95 {r5['p95_ms']:.2f} ms, CPU mean {r5['cpu_mean_ms']:.2f} ms")
    print(f"RLS state: P {r['P_bytes'] / 2**20:.1f} MiB (float64, {d + 1}^2), held {r['state_bytes'] / 2**20:.1f} MiB")
    m = res["model"]
    print(f"cost model in predictors/leap.py: prediction_cpu_s({d}) = {m['prediction_cpu_s(d)'] * 1e6:.2f} us, "
          f"prediction_cpu_s(576) = {m['prediction_cpu_s(576)'] * 1e6:.2f} us; "
          f"rls_update_cpu_s(8, {d + 1}) = {m['rls_update_cpu_s(8, d+1)'] * 1e3:.1f} ms, "
          f"rls_update_cpu_s(8, 577) = {m['rls_update_cpu_s(8, 577)'] * 1e3:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
