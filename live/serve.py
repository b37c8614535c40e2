"""leap-serve: an online (open-loop) serving run of vLLM, recorded as a serving trace.

    leap-serve --from traces/lmsys.parquet --requests 200 --force-lengths --max-length 128 \\
        --max-resident 64 --threads 1 --capacity measure                  # measure + cache capacity
    leap-serve --from traces/lmsys.parquet --requests 200 --force-lengths --max-length 128 \\
        --max-resident 64 --threads 1 --arrivals poisson --load 0.8x --out traces/live/lmsys-0.8x.parquet

Requests are the first N (or a seeded sample) of a recorded trace, re-tokenized from the trace's
prompt source (or its prompt_text) with the serving model's chat template and checked against the
recorded prompt_tokens. They arrive by a Poisson process (``--load`` x the measured live capacity,
or ``--rate``) or at the timestamps of a CSV, and are submitted to vLLM's step loop as the clock
passes their arrival time. ``--force-lengths`` makes each request generate exactly its recorded
output length (ignore_eos, min_tokens = max_tokens = L), so that the real run and its simulation
serve identical work.

Capacity: the live saturated throughput of this workload on this engine setting (all requests
queued at t = 0, completions per second until fewer than ``--max-resident`` remain), cached in
``$LEAP_CACHE_DIR/live_capacity.json`` keyed by the workload and the engine settings but not the
policy, so the loads of every policy's runs are multiples of one (FCFS) capacity.

Resume after a crash (``--resume``): finished requests are kept (parts folder, as in recording);
an open-loop run's timing cannot be continued, so the unfinished requests are served again as a
new run segment whose schedule keeps their planned offsets, shifted so that the first of them
arrives at once. The segment is the ``run`` column of the request and steps tables and
``serving.segments`` in the metadata; times within a segment share one clock, and arrival_s /
wall_start_s are shifted back onto the planned time axis (segments overlap in time there).
Compare real and simulated runs per segment.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from capture import CaptureError
from capture.record import host_description
from core.checks import MAX_NUMPY_SEED, bounded_int
from core.cli import OneLineParser, run_command
from live import prechecks, server_run, stepclock
from live.serve_records import first_estimates, read_sched_parts, scheduler_stats, serve_table, write_sched_part

CAPACITY_FILE = "live_capacity.json"
SERVE_TIMING = ("open loop: each request is submitted at the first engine-step boundary after its "
                "planned arrival (planned_arrival_s); arrival_s is the actual submission offset "
                "from the start of the run segment, shifted onto the planned time axis (see "
                "serving.segments); ttft_s, e2e_s and token_times_s are seconds from the "
                "request's submission; all timings are on this host, in eager mode")


def serve_parser() -> argparse.ArgumentParser:
    from capture.model import DEFAULT_MODEL_DIR

    p = OneLineParser(prog="leap-serve", description=__doc__,
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
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="default: the source trace's dtype")
    p.add_argument("--executor", choices=["uni", "mp"], default="uni")
    p.add_argument("--threads", default=None, metavar="CPUS",
                   help="pin the engine to these CPUs, e.g. 1 (one core) or 0-1")
    p.add_argument("--probe-every", type=int, default=4, metavar="N",
                   help="time the drift probe after every N-th engine step (0 disables)")
    p.add_argument("--seed", type=bounded_int(0, MAX_NUMPY_SEED), default=0)
    p.add_argument("--out", metavar="FILE.parquet", help="serving trace (e.g. traces/live/NAME.parquet)")
    p.add_argument("--resume", action="store_true", help="continue a crashed run (new segment)")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--flush-every", type=int, default=16, metavar="N")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--server", metavar="URL",
                   help="drive a running vllm serve with the leap_sched plugin over HTTP instead of an "
                        "in-process engine (live.server_run; its settings must match these flags)")
    return p


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
        if (args.policy, args.predictor) != ("fcfs", "none"):
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
            sync_updates=args.clock == "steps")
    except (ValueError, TypeError) as e:
        raise CaptureError(f"live scheduler: {e}") from None


def scheduler_engine_args(config) -> dict:
    """vLLM engine kwargs selecting the scheduler (none for vLLM's own)."""
    return {} if config is None else dict(config.to_engine_args())


# --------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class ServeRequest:
    request_id: str
    domain: str
    prompt_id: str
    prompt_token_ids: tuple
    source_output_tokens: int
    length: int            # forced length, or the max_tokens cap when not forced
    reference_output_tokens: int | None
    prompt_text: str = ""  # raw user prompt (no template): the live text-encoder baseline's input


def _source_prompts(meta: dict, table, ids, tok, log) -> tuple[dict[str, list[int]], dict[str, str]]:
    """Prompt token ids (and raw texts) of the chosen requests: from prompt_text where the trace
    carries it, else re-read from the trace's prompt source; each checked against the recorded
    prompt_tokens."""
    texts = {}
    have_text = "prompt_text" in table.column_names
    col = table.column("prompt_text").to_pylist() if have_text else [None] * table.num_rows
    rid_col = table.column("request_id").to_pylist()
    pos = {r: i for i, r in enumerate(rid_col)}
    for rid in ids:
        if col[pos[rid]] is not None:
            texts[rid] = col[pos[rid]]
    missing = [r for r in ids if r not in texts]
    if missing:
        sources = meta.get("prompt_sources") or (meta.get("run_config") or {}).get("prompt_sources")
        if not sources:
            raise CaptureError("source trace has no prompt_text and no prompt_sources in its metadata; "
                               "its prompts cannot be recovered")
        from capture.prompts import load_prompts

        by_id = {p.request_id: p.text for p in load_prompts(list(sources))}
        for r in missing:
            if r not in by_id:
                raise CaptureError(f"request {r}: not found in the prompt source(s) {', '.join(sources)}")
            texts[r] = by_id[r]
    out = {}
    recorded = table.column("prompt_tokens").to_pylist()
    for rid in ids:
        got = tok.apply_chat_template([{"role": "user", "content": texts[rid]}],
                                      add_generation_prompt=True, tokenize=True, return_dict=False)
        got = list(got.tolist() if hasattr(got, "tolist") else got)
        if len(got) != recorded[pos[rid]]:
            raise CaptureError(f"request {rid}: re-tokenized prompt has {len(got)} tokens, the trace "
                               f"recorded {recorded[pos[rid]]} (another model, template or prompt source?)")
        out[rid] = got
    return out, texts


def kv_blocks_estimate(cfg: dict, dtype: str, kv_space_gib: int, block_size: int = 128) -> int:
    """KV blocks vLLM-cpu makes of VLLM_CPU_KVCACHE_SPACE: space / (2 x layers x kv heads x head
    dim x dtype bytes x block size). Checked against the engine's own count after it starts."""
    heads = cfg.get("num_attention_heads")
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    nbytes = {"float32": 4, "bfloat16": 2, "float16": 2}[dtype]
    per_block = 2 * cfg["num_hidden_layers"] * kv_heads * head_dim * nbytes * block_size
    return int(kv_space_gib * 2**30 // per_block)


def check_kv(reqs: list[ServeRequest], max_resident: int, blocks: int, block_size: int,
             kv_space_gib: int, how: str) -> int:
    """Refuse a resident cap the KV cache cannot hold: the ``max_resident`` largest requests at
    their full length (prompt + output) must fit, else vLLM preempts and the cap is not honoured."""
    need = sorted((math.ceil((len(r.prompt_token_ids) + r.length) / block_size) for r in reqs),
                  reverse=True)[:max_resident]
    if sum(need) > blocks:
        raise CaptureError(f"--max-resident {max_resident}: the {len(need)} largest requests need "
                           f"{sum(need)} KV blocks of {block_size} tokens at full length, the engine has "
                           f"{blocks} ({how}, --kv-space-gib {kv_space_gib}); lower --max-resident or "
                           "--max-length, or raise --kv-space-gib")
    return sum(need)


# --------------------------------------------------------------------------- capacity cache


def capacity_key(desc: dict) -> str:
    return hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:24]


def read_capacity(key: str) -> dict | None:
    from core.io import cache_dir

    f = cache_dir() / CAPACITY_FILE
    try:
        return json.loads(f.read_text()).get(key)
    except (OSError, ValueError):
        return None


def write_capacity(key: str, entry: dict) -> None:
    from core.io import atomic_write_json, cache_dir

    f = cache_dir() / CAPACITY_FILE
    try:
        data = json.loads(f.read_text())
    except (OSError, ValueError):
        data = {}
    data[key] = entry
    atomic_write_json(f, data)


# --------------------------------------------------------------------------- main


def _positive(args, *names):
    for name in names:
        v = getattr(args, name)
        if v is not None and v < 1:
            raise CaptureError(f"--{name.replace('_', '-')} must be >= 1, got {v}")


def serve_main(argv) -> int:
    args = serve_parser().parse_args(argv)
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    log = (lambda *a: None) if args.quiet else (lambda *a: print(*a, file=sys.stderr, flush=True))
    t_start = time.time()

    # ---- flags that need no file
    stepclock.check_clock_flags(args)
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
    if measure and (args.policy, args.predictor) != ("fcfs", "none"):
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
    live = live_config(args)
    engine_overrides = scheduler_engine_args(live)
    served = server_run.check_server(args)      # --server: reachable, running the plugin (its settings)

    # ---- source trace and model
    from core.trace import TraceError, load_trace

    try:
        src = load_trace(args.source)
    except TraceError as e:
        raise CaptureError(str(e)) from None
    if live is not None and args.force_lengths:
        # max_tokens = the true length here: the arrival prior is the simulator's (half the
        # workload's cap), never half of max_tokens
        import dataclasses

        live = dataclasses.replace(live, prior_tokens=src.output_cap / 2.0)
        engine_overrides = scheduler_engine_args(live)
    from capture.model import check_model_dir, model_revision, read_config

    model_dir = check_model_dir(args.model)
    cfg = read_config(model_dir)
    meta = src.metadata
    dtype = args.dtype or meta.get("dtype") or "float32"
    max_model_len = args.max_model_len or int(meta.get("max_model_len") or 8192)
    n_all = len(src)
    n = min(args.requests or n_all, n_all)
    if args.sample and n < n_all:
        rows = np.sort(np.random.default_rng(args.seed).choice(n_all, size=n, replace=False))
    else:
        rows = np.arange(n)
    table = src.table
    rid_col = table.column("request_id").to_pylist()
    ids = [rid_col[i] for i in rows]
    prechecks.check_prompt_text(args.source, meta, table.column_names, [
        table.column("prompt_text")[int(i)].as_py() for i in rows] if "prompt_text" in table.column_names else [])
    prechecks.check_readout(live, model_dir, args.kv_space_gib, dtype)
    try:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(str(model_dir))
    except Exception as e:  # noqa: BLE001
        raise CaptureError(f"cannot load the tokenizer from {model_dir}: {e}") from None
    template = getattr(tok, "chat_template", None) or ""
    tsha = hashlib.sha256(template.encode()).hexdigest()
    if meta.get("chat_template_sha256") and meta["chat_template_sha256"] != tsha:
        raise CaptureError(f"{args.source}: recorded with another chat template than {model_dir}'s")
    prompt_ids, prompt_texts = _source_prompts(meta, table, ids, tok, log)
    out_col = table.column("output_tokens").to_pylist()
    cap_col = table.column("max_tokens").to_pylist()
    dom_col = table.column("domain").to_pylist()
    pid_col = table.column("prompt_id").to_pylist()
    ref_col = (table.column("reference_output_tokens").to_pylist()
               if "reference_output_tokens" in table.column_names else [None] * n_all)
    reqs = []
    for i, rid in zip(rows, ids):
        length = int(out_col[i]) if args.force_lengths else int(cap_col[i])
        if args.max_length is not None:
            length = min(length, args.max_length)
        total = len(prompt_ids[rid]) + length
        if total > max_model_len:
            raise CaptureError(f"request {rid}: prompt {len(prompt_ids[rid])} + length {length} tokens "
                               f"exceeds max_model_len {max_model_len} (cap it with --max-length)")
        reqs.append(ServeRequest(rid, dom_col[i], pid_col[i], tuple(prompt_ids[rid]), int(out_col[i]),
                                 length, ref_col[i], prompt_texts[rid]))
    est_blocks = kv_blocks_estimate(cfg, dtype, args.kv_space_gib)
    kv_need = check_kv(reqs, args.max_resident, est_blocks, 128, args.kv_space_gib,
                       "estimated from the model config before the engine starts")

    sampling = dict(meta.get("sampling") or {})
    sampling = {k: sampling.get(k, d) for k, d in
                (("temperature", 0.7), ("top_p", 0.9), ("repetition_penalty", 1.1))}
    from capture.backend_vllm import parse_cpu_list

    threads_n = len(parse_cpu_list(args.threads)) if args.threads else None
    workload = {
        "source_trace": src.name, "source_sha256": src.content_hash,
        "requests_sha256": hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16],
        "requests": n, "forced_lengths": args.force_lengths, "max_length": args.max_length,
    }
    engine_desc = {
        "model_revision": model_revision(model_dir), "dtype": dtype, "max_model_len": max_model_len,
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
    rate = args.rate if args.rate is not None else (load * capacity if load is not None and capacity else None)
    planned = None
    arrivals_desc = None
    if args.arrivals is not None and not (measure and load is not None):
        planned, arrivals_desc = stepclock.planned_arrivals(args, n, rate)

    if args.server is not None:
        return server_run.run_against_server(args, served, server_run.ServerWorkload(
            reqs, planned, arrivals_desc, rate, load, capacity, capacity_how, live, workload, src, cfg, model_dir,
            template, tsha, sampling, dtype, max_model_len, [int(i) for i in rows] if args.sample else f"first {n}",
            t_start), log)

    # ---- engine
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        raise CaptureError(f"vllm is not importable ({e}); use the capture venv") from None
    from capture.backend import GenRequest
    from capture.backend_vllm import VLLMBackend

    def params_for(req: ServeRequest):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        forced = dict(min_tokens=req.length, ignore_eos=True) if args.force_lengths else {}
        if live is not None and live.predictor == "ssjf":
            from live import PROMPT_TEXT_KEY
            forced["extra_args"] = {PROMPT_TEXT_KEY: req.prompt_text}
        return SamplingParams(temperature=sampling["temperature"], top_p=sampling["top_p"],
                              repetition_penalty=sampling["repetition_penalty"],
                              max_tokens=req.length, output_kind=RequestOutputKind.DELTA,
                              detokenize=False, **forced)

    store = None
    run_config = None
    if out is not None:
        from capture.store import PartStore

        store = PartStore(out)
        store.lock()  # before the engine starts: a second process on this output exits at once
        run_config = {**workload, **engine_desc, "policy": args.policy, "predictor": args.predictor,
                      "arrivals": arrivals_desc if planned is not None else args.arrivals,
                      "load": load, "seed": args.seed, "probe_every": args.probe_every,
                      **({"clock": "steps"} if args.clock == "steps" else {})}
        if planned is not None:
            run_config[stepclock.rate_key(args.clock)] = rate
    be = VLLMBackend(model_dir, last_layers=[], decode_layers=[], decode_every=0, dtype=dtype,
                     seed=args.seed, max_model_len=max_model_len, max_num_seqs=args.max_resident,
                     max_num_batched_tokens=args.max_num_batched_tokens,
                     kv_space_gib=args.kv_space_gib, threads=args.threads, executor=args.executor,
                     probe_every=args.probe_every, engine_overrides=engine_overrides, log=log)
    try:
        if live is not None:
            import live as live_pkg

            try:
                live_pkg.attach(be.engine)   # hook <-> scheduler channel (LEAP predictors)
            except ValueError as e:
                raise CaptureError(f"live scheduler: {e}") from None
        if be.kv_blocks and be.kv_blocks != est_blocks:
            log(f"engine has {be.kv_blocks} KV blocks (estimate {est_blocks})")
            check_kv(reqs, args.max_resident, be.kv_blocks, be.block_size or 128, args.kv_space_gib,
                     "reported by the engine")
        quiet = be.engine.collective_rpc("ct_probe", args=(20, True))[0]
        quiet_probe, quiet_mem_probe = quiet["probe_s"], quiet["probe_mem_s"]
        by_id = {r.request_id: r for r in reqs}
        gen_reqs = [GenRequest(r.request_id, list(r.prompt_token_ids)) for r in reqs]
        if measure:
            log(f"measuring the live capacity: {n} requests queued at t=0, {args.max_resident} resident")
            res = be.saturated_capacity(gen_reqs, lambda g: params_for(by_id[g.request_id]),
                                        args.max_resident)
            res.update({"workload": workload, "engine": engine_desc,
                        "measured": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                        "quiet_probe_median_s": float(np.median(quiet_probe))})
            write_capacity(key, res)
            capacity, capacity_how = stepclock.capacity_of(res, args.clock), "measured"
            log(f"capacity {res['capacity_req_s']:.4f} req/s, {res['capacity_req_per_step']:.5f} req/step "
                f"({res['completions_in_window']} completions in {res['window_s']:.1f}s, "
                f"{res['window_steps']} steps saturated; makespan {res['makespan_s']:.1f}s, "
                f"{res['generated_tokens']} tokens)")
            print(json.dumps({"key": key, **{
                k: res[k] for k in ("capacity_req_s", "capacity_req_per_step", "saturated", "window_s",
                                    "window_steps", "completions_in_window", "requests", "makespan_s",
                                    "makespan_steps", "generated_tokens", "steps")}}))
            if args.arrivals is None:
                return 0
            if load is not None:
                rate = load * capacity
                run_config[stepclock.rate_key(args.clock)] = rate
                planned, arrivals_desc = stepclock.planned_arrivals(args, n, rate)
                run_config["arrivals"] = arrivals_desc
        serving = {"mode": "open-loop", "arrivals": arrivals_desc, "load": load,
                   "rate_req_s": rate, "capacity_req_s": capacity, "capacity_source": capacity_how,
                   "capacity_key": key, "policy": args.policy, "predictor": args.predictor,
                   "max_resident": args.max_resident,
                   "decode_slots": live.decode_slots if live is not None else args.max_resident,
                   "scheduler": "live" if live is not None else "vllm",
                   "wait_cap": live.wait_cap if live is not None else None,
                   "ordered_admission": live.orders_admission if live is not None else False,
                   "readout": _file_ref(args.readout), "layer": live.hook_layer if live is not None else None,
                   "head_weights": _file_ref(args.head_weights),
                   "prior_tokens": live.prior_tokens if live is not None else None,
                   "max_num_batched_tokens": args.max_num_batched_tokens,
                   "forced_lengths": args.force_lengths, "max_length": args.max_length,
                   "source_trace": {"name": src.name, "sha256": src.content_hash,
                                    "rows": [int(i) for i in rows] if args.sample else f"first {n}"},
                   "seed": args.seed, "threads": threads_n, "kv_blocks": be.kv_blocks,
                   "kv_blocks_needed_at_cap": kv_need, **stepclock.serving_fields(args.clock, capacity, rate)}
        return _serve_run(args, be, store, out, run_config, reqs, planned, params_for, serving,
                          (quiet_probe, quiet_mem_probe), src, cfg, model_dir, template, tsha, sampling, dtype,
                          max_model_len, t_start, log)
    finally:
        be.close()


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


def _serve_run(args, be, store, out, run_config, reqs, planned, params_for, serving, quiet_probe,
               src, cfg, model_dir, template, tsha, sampling, dtype, max_model_len, t_start, log):
    from capture.backend import GenRequest
    from capture.finalize import finalize
    from capture.model import model_id
    from capture.schema import steps_table
    from capture.vllm_ext import PROBE_MEM_ELEMENTS, PROBE_MEM_EVERY
    if args.resume and out.exists() and not store.dir.exists():
        from capture.store import read_meta
        if read_meta(out).get("run_config") == run_config:
            log(f"{out} is up to date ({len(reqs)} requests)")
            return 0
    fresh = not store.exists()
    store.open(run_config, resume=args.resume)
    try:
        done = store.done_ids("gen")
        steps_clock = serving["clock"] == "steps"   # arrival steps, never shifted (no resume)
        todo = [(planned[i].item(), r) for i, r in enumerate(reqs) if r.request_id not in done]
        shift = todo[0][0] if todo and not steps_clock else 0.0
        segment = {"run": store.run, "requests": len(todo), "schedule_shift_s": shift}
        _write_json(store.dir / f"segment-{store.run:03d}.json", segment)
        planned_of = {r.request_id: None if steps_clock else float(planned[i]) for i, r in enumerate(reqs)}
        by_id = {r.request_id: r for r in reqs}
        log(f"{len(reqs)} requests, {len(done)} already served; segment {store.run}: {len(todo)} at "
            + (f"{serving['rate_req_per_step'] or 0:.5f} req/step" if steps_clock
               else f"{serving['rate_req_s'] or 0:.4f} req/s") + f" ({serving['arrivals']})")
        info = be.info()
        _write_json(store.dir / "backend.json", info)
        stats = {"requests": 0, "generated_tokens": 0, "wall_s": 0.0, "backend": "vllm",
                 "executor": info.get("executor"), "engine_startup_s": be.startup_s,
                 "segment_shift_s": shift}
        step_no = {"n": 0}

        def on_steps(rows):
            for r in rows:
                r["run"] = store.run
                r["run_step"] = step_no["n"]
                r["wall_start_s"] = r["wall_start_s"] + shift
                step_no["n"] += 1
            store.write("steps", steps_table(rows))

        def on_finished(fins):
            estimates = first_estimates(be.engine, by_id)
            store.write("gen", serve_table(fins, by_id, planned_of, store.run, shift, estimates))
            stats["requests"] += len(fins)
            stats["generated_tokens"] += sum(f.output_tokens for f in fins)
            _write_json(store.dir / f"run-{store.run:03d}.json", stats)

        schedule = [(p - shift, GenRequest(r.request_id, list(r.prompt_token_ids)), params_for(r))
                    for p, r in todo]
        if schedule:
            res = (be.serve_steps if steps_clock else be.serve)(schedule, on_finished, on_steps,
                                                                 flush_n=args.flush_every)
            stats.update(wall_s=res["wall_s"], engine_steps=res["steps"], ticks=res.get("ticks"))
            if not steps_clock:
                lag = np.asarray(res["submit_lag_s"])
                stats["submit_lag_s"] = {"median": float(np.median(lag)), "p99": float(np.quantile(lag, 0.99)),
                                         "max": float(lag.max())}
            _write_json(store.dir / f"run-{store.run:03d}.json", stats)

        sched = scheduler_stats(be.engine)
        if sched:
            write_sched_part(store, sched)
        sched_table = read_sched_parts(store)
        if sched_table is not None:  # side tables before the trace (finalize writes it last)
            from capture.store import atomic_write_table
            from core.trace import side_table_path
            atomic_write_table(sched_table, side_table_path(out, "sched"),
                               {"schema_version": 1, "table": "sched", "trace": out.name,
                                "source": "live scheduler leap_stats(), one row per entry; run = segment"})
        steps = store.read("steps")
        probes = np.array([], dtype=float)
        if steps is not None and "probe_s" in steps.column_names:
            probes = np.array([v for v in steps.column("probe_s").to_pylist() if v is not None])
        quiet_probe, quiet_mem_probe = quiet_probe
        q = np.asarray(quiet_probe, dtype=float)
        mem = np.array([v for v in steps.column("probe_mem_s").to_pylist() if v is not None], dtype=float) \
            if steps is not None and "probe_mem_s" in steps.column_names else np.array([], dtype=float)
        qm = np.asarray(quiet_mem_probe, dtype=float)
        serving["probe"] = {
            "every_steps": args.probe_every, "workload": "2 x 192x192 fp32 torch.mm on the engine's threads",
            "before_run_median_s": float(np.median(q)),
            "measured": int(len(probes)),
            **({"median_s": float(np.median(probes)), "p90_s": float(np.quantile(probes, 0.9)),
                "max_s": float(probes.max()), "cv": float(probes.std() / probes.mean()),
                "median_over_before_run": float(np.median(probes) / np.median(q))}
               if len(probes) else {}),
            "memory": {
                "every_steps": args.probe_every * PROBE_MEM_EVERY,
                "workload": f"sum over a {PROBE_MEM_ELEMENTS * 4 // 2**20} MiB fp32 buffer (beyond the L3: "
                            "DRAM bandwidth)",
                "before_run_median_s": float(np.median(qm)), "measured": int(len(mem)),
                **({"median_s": float(np.median(mem)), "p90_s": float(np.quantile(mem, 0.9)),
                    "median_over_before_run": float(np.median(mem) / np.median(qm)),
                    "p90_over_before_run": float(np.quantile(mem, 0.9) / np.median(qm)),
                    "overhead_share_of_step_s": float(mem.sum() / max(sum(
                        v for v in steps.column("step_s").to_pylist() if v is not None), 1e-12))}
                   if len(mem) else {}),
            },
        }
        serving["segments"] = [json.loads(f.read_text()) for f in sorted(store.dir.glob("segment-*.json"))]
        serving["segments"] = [s for s in serving["segments"] if s["requests"] or s["run"] == store.run]
        meta = {
            "schema_version": 1,
            "model_id": model_id(model_dir),
            "model_revision": run_config["model_revision"],
            "layers": {},
            "num_layers": cfg["num_hidden_layers"],
            "hidden_size": cfg["hidden_size"],
            "dtype": dtype,
            "sampling": {**sampling, "seed": args.seed,
                         "forced_lengths": "ignore_eos, min_tokens = max_tokens = L" if args.force_lengths else None},
            "max_tokens": max(r.length for r in reqs),
            "max_model_len": max_model_len,
            "chat_template": template,
            "chat_template_sha256": tsha,
            "prompt_sources": src.metadata.get("prompt_sources"),
            "capture_date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "host": host_description(),
            "timing": stepclock.STEP_TIMING if steps_clock else SERVE_TIMING,
            "decode_every_k": 0,
            "decode_layers": [],
            "run_config": run_config,
            "complete": True,
            "planned_requests": len(reqs),
            "serving": serving,
            "text_encoder": None,
        }
        finalize(store, reqs, meta, info, hidden=cfg["hidden_size"], log=log)
    except BaseException:
        if fresh and store.dir.is_dir() and not store.done_ids("gen"):
            store.discard()
        raise
    from core.trace import TraceError, load_trace
    try:
        load_trace(out)
    except TraceError as e:  # a bug, not bad input: the writer broke the contract
        raise RuntimeError(f"the serving trace does not validate: {e}") from None
    log(f"wrote {out} ({len(reqs)} requests) in {time.time() - t_start:.0f}s")
    return 0


def _file_ref(path: str | None) -> str | None:
    """A file by name and content hash: no machine path in shared metadata."""
    if path is None:
        return None
    p = Path(path)
    return f"{p.name}@sha256:{hashlib.sha256(p.read_bytes()).hexdigest()[:12]}"


def _write_json(path: Path, obj) -> None:
    from core.io import atomic_write_bytes

    atomic_write_bytes(path, json.dumps(obj).encode())


def main(argv=None) -> int:
    """``leap-serve``: one line and exit 2 on bad input, like every command (``core.cli``)."""
    return run_command(serve_main, argv, "leap-serve", interrupt_hint="rerun with --resume to continue")


if __name__ == "__main__":
    sys.exit(main())
