"""``leap-serve``'s flags: the parser, and the checks that need no file (one line and exit 2 before
anything is read or an engine starts)."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from pathlib import Path

from capture import CaptureError
from core.bench_result import add_result_flags, check_save_result, goodput_slos
from core.checks import MAX_NUMPY_SEED, bounded_int
from core.errors import OneLineParser
from live import kv_cache, prechecks, stepclock
from live.config import predicts_nothing
from live.fleet import check_fleet_flags
from routers import MAX_REPLICAS, ROUTERS


def build_parser(description: str | None) -> argparse.ArgumentParser:
    from capture.model import DEFAULT_MODEL_DIR

    p = OneLineParser(prog="leap-serve", description=description,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--from", dest="source", required=True, metavar="TRACE",
                   help="recorded trace to take the requests from (path or bundled name)")
    p.add_argument("--model", default=str(DEFAULT_MODEL_DIR), help="local HF model directory")
    p.add_argument("--requests", type=int, metavar="N", help="first N requests (default all)")
    p.add_argument("--sample", action="store_true",
                   help="with --requests: a seeded random sample (--seed) instead of the first N")
    p.add_argument("--force-lengths", action="store_true",
                   help="generate exactly each request's recorded output_tokens (ignore_eos)")
    p.add_argument("--max-length", type=int, metavar="L",
                   help="cap on the forced length (or the max_tokens of unforced requests)")
    p.add_argument("--arrivals", metavar="poisson|FILE.csv",
                   help="arrival process; omit with --capacity measure to only measure")
    p.add_argument("--clock", choices=stepclock.CLOCKS, default="seconds",
                   help="arrival clock: seconds (wall clock) or engine steps (live.stepclock)")
    p.add_argument("--load", metavar="X", help="arrival rate as a multiple of the live capacity, e.g. 0.8x")
    p.add_argument("--rate", type=float, metavar="REQ_S", help="arrival rate in requests per second")
    p.add_argument("--capacity", metavar="measure|REQ_S",
                   help="live capacity for --load: measure it now (and cache it), or give it; "
                        "default: the cached measurement of this workload and engine setting")
    p.add_argument("--policy", default="fcfs")
    p.add_argument("--predictor", default="none")
    p.add_argument("--scheduler", choices=["live", "vllm"], default=None,
                   help="live: the project's scheduler through vLLM's scheduler_cls (default where live/ "
                        "imports; needed for any policy but fcfs and for decode slots); vllm: vLLM's own")
    p.add_argument("--readout", metavar="FILE.npz",
                   help="LEAP read-out for --predictor leap/leap-rls (python -m live.readout)")
    p.add_argument("--layer", type=int, metavar="K", help="tapped layer (must match the read-out)")
    p.add_argument("--wait-cap", type=int, default=128, metavar="STEPS",
                   help="live scheduler: force a resident request after this many steps without a decode (0 = off)")
    p.add_argument("--head-weights", metavar="FILE.npz", help="ssjf head weights (default: the shipped ones)")
    p.add_argument("--fcfs-admission", action="store_true",
                   help="admit FCFS even with an arrival-stage predictor (oracle, ssjf)")
    p.add_argument("--decode-slots", type=int, metavar="N",
                   help="decodes per step (live scheduler only; vLLM's own decodes all residents)")
    p.add_argument("--max-resident", type=int, default=64, help="vLLM max_num_seqs")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--max-model-len", type=int, metavar="N",
                   help="default: the source trace's max_model_len")
    p.add_argument("--kv-space-gib", type=int, default=4, help="VLLM_CPU_KVCACHE_SPACE")
    kv_cache.add_kv_flags(p)
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="default: the source trace's dtype")
    p.add_argument("--executor", choices=["uni", "mp"], default="uni")
    p.add_argument("--threads", default=None, metavar="CPUS",
                   help="pin the engine to these CPUs, e.g. 1 (one core) or 0-1")
    p.add_argument("--probe-every", type=int, default=4, metavar="N",
                   help="time the drift probe after every N-th engine step (0 disables)")
    p.add_argument("--replicas", type=bounded_int(1, MAX_REPLICAS, "replicas of a live fleet"), default=1,
                   help="with --clock steps: this many engines in this process, stepped in lockstep, one "
                        "core each from --threads (live.fleet)")
    p.add_argument("--router", default=None, metavar="NAME",
                   help=f"how a live fleet routes each arrival: {', '.join(ROUTERS)} (default round-robin)")
    p.add_argument("--seed", type=bounded_int(0, MAX_NUMPY_SEED), default=0)
    p.add_argument("--out", metavar="FILE.parquet", help="serving trace (e.g. traces/live/NAME.parquet)")
    p.add_argument("--resume", action="store_true", help="continue a crashed run (new segment)")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--flush-every", type=int, default=16, metavar="N")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--server", metavar="URL",
                   help="drive a running vllm serve with the leap_sched plugin over HTTP instead of an "
                        "in-process engine (live.server_run; its settings must match these flags)")
    add_result_flags(p, "write the run's figures under vllm bench serve's result keys and units (ms), "
                     "read back from the serving trace (live.serve_metrics)")
    return p


def _positive(args, *names):
    for name in names:
        v = getattr(args, name)
        if v is not None and v < 1:
            raise CaptureError(f"--{name.replace('_', '-')} must be >= 1, got {v}")



@dataclass(frozen=True)
class Flags:
    """What the flags mean once checked: the load multiple, a given capacity, whether to measure it, the output."""

    load: float | None
    given_capacity: float | None
    measure: bool
    out: Path | None
    slos: dict[str, float] = field(default_factory=dict)   # --goodput, ms


def check_flags(args) -> Flags:
    """Every check of the flags alone, in the order the user reads them."""
    stepclock.check_clock_flags(args)
    kv_cache.check_kv_flags(args)
    check_fleet_flags(args)
    _positive(args, "requests", "max_length", "max_resident", "max_num_batched_tokens",
              "kv_space_gib", "flush_every", "decode_slots", "max_model_len")
    if args.probe_every < 0:
        raise CaptureError("--probe-every must be >= 0")
    if args.sample and args.requests is None:
        raise CaptureError("--sample needs --requests N")
    load = None
    if args.load is not None:
        from core.arrivals import parse_load
        try:
            load = parse_load(args.load)
        except ValueError as e:
            raise CaptureError(str(e)) from None
    if args.rate is not None and not (math.isfinite(args.rate) and args.rate > 0):
        raise CaptureError(f"--rate {args.rate}: must be a positive number of requests per second")
    if load is not None and args.rate is not None:
        raise CaptureError("give --load or --rate, not both")
    measure = args.capacity == "measure"
    given_capacity = None
    if args.capacity is not None and not measure:
        try:
            given_capacity = float(args.capacity)
        except ValueError:
            raise CaptureError(f"--capacity {args.capacity!r}: expected 'measure' or requests per second") from None
        if not (math.isfinite(given_capacity) and given_capacity > 0):
            raise CaptureError(f"--capacity {args.capacity}: must be positive")
    if args.arrivals is None:
        if not measure:
            raise CaptureError("--arrivals poisson|FILE.csv is required (or --capacity measure alone)")
        if load is not None or args.rate is not None or args.out:
            raise CaptureError("--load/--rate/--out need --arrivals")
    else:
        if args.arrivals != "poisson":
            if not args.arrivals.lower().endswith(".csv"):
                raise CaptureError(f"--arrivals {args.arrivals!r}: expected 'poisson' or a .csv file")
            if not Path(args.arrivals).is_file():
                raise CaptureError(f"--arrivals {args.arrivals}: no such file")
        elif load is None and args.rate is None:
            raise CaptureError("--arrivals poisson needs --load X (times the capacity) or --rate R")
        if not args.out:
            raise CaptureError("--out FILE.parquet is required with --arrivals")
    if measure and args.resume:
        raise CaptureError("--resume serves at the first run's rate: omit --capacity measure (the "
                           "cached capacity is used) or give --capacity REQ_S")
    if measure and not predicts_nothing(args.policy, args.predictor):
        raise CaptureError("--capacity measure: the capacity that loads refer to is FCFS's; measure "
                           "it with --policy fcfs --predictor none")
    if args.threads:
        from capture.backend_vllm import parse_cpu_list
        parse_cpu_list(args.threads)
    out = Path(args.out) if args.out else None
    if out is not None:
        from capture.store import check_output_trace
        check_output_trace(out, "--out")
        parts = out.with_name(out.name + ".parts")
        if (out.exists() or parts.exists()) and not (args.resume or args.overwrite):
            raise CaptureError(f"{out} (or its .parts) exists; use --resume to continue or --overwrite")
    prechecks.check_resume(args.resume, out)
    prechecks.check_arrivals_file(args.arrivals, args.clock)
    slos = goodput_slos(args.goodput)
    check_save_result(args.save_result)
    if (args.goodput is not None or args.save_result is not None) and out is None:
        raise CaptureError("--goodput and --save-result summarise a served run: they need --arrivals and --out")
    return Flags(load, given_capacity, measure, out, slos)
