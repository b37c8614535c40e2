"""``capture-traces`` (no subcommand): record a trace with vLLM or transformers into Parquet.

The flags come in groups (model and prompts, features, sampling, engine, output); ``check_args``
checks them all against the model's config before anything is loaded or written, and ``record``
runs the recording: tokenize and filter the prompts, the prefill-feature pass, the generation
pass, then the final files (``capture.finalize``). A recording is resumable: finished requests
live in a parts folder (``capture.store.PartStore``) until the final files are written.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from core.checks import bounded_int, finite_float, output_path
from core.errors import OneLineParser
from core.io import atomic_write_bytes

from . import CaptureError

SCHEMA_VERSION = 1
DEFAULTS = dict(layer=24, mean_layer=10, entropy_layer=29, decode_layer=[10], decode_every=64,
                max_tokens=1024, temperature=0.7, top_p=0.9, repetition_penalty=1.1, seed=0)


def build_parser(description: str | None = None) -> OneLineParser:
    """The recording's flags, in groups."""
    p = OneLineParser(prog="capture-traces", description=description,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    what = p.add_argument_group("model and prompts")
    what.add_argument("--model", required=True, help="local HF model directory")
    what.add_argument("--prompts", action="append", required=True, metavar="SOURCE",
                      help="prompt source (repeatable): lmsys, sharegpt, alpaca, math, math500, gsm8k, "
                           "multilingual, mgsm, mgsm-XX, arena-nonlatin, arena, or a file: jsonl:PATH, "
                           "json:PATH, csv:PATH, parquet:PATH (formats: capture/prompts.py); "
                           "optional slice NAME@START:STOP")
    what.add_argument("--limit", type=int, metavar="N", help="first N prompts only")
    what.add_argument("--per-domain-limit", type=int, metavar="N",
                      help="at most N prompts per domain (in source order)")

    features = p.add_argument_group("features")
    features.add_argument("--layer", type=int, action="append", metavar="K",
                          help="decoder block (0-based) whose output at the last prompt token is recorded; "
                               "repeatable: the first goes to feat_last, others to feat_last_lK "
                               f"(default {DEFAULTS['layer']})")
    features.add_argument("--mean-layer", type=int, default=DEFAULTS["mean_layer"], metavar="K",
                          help="block for feat_mean (prefill pass); -1 disables")
    features.add_argument("--entropy-layer", type=int, default=DEFAULTS["entropy_layer"], metavar="K",
                          help="block for feat_entropy_pooled (prefill pass); -1 disables")
    features.add_argument("--decode-layer", type=int, action="append", metavar="K",
                          help="block sampled during decode into NAME.decode.parquet (repeatable; "
                               f"default {DEFAULTS['decode_layer']})")
    features.add_argument("--decode-every", type=int, default=DEFAULTS["decode_every"], metavar="K",
                          help="sample decode features every K generated tokens (0 disables)")
    features.add_argument("--no-prefill-features", action="store_true",
                          help="skip feat_mean / feat_entropy_pooled / text_embedding")
    features.add_argument("--prefill-device", choices=["auto", "cpu", "cuda"], default="auto",
                          help="where the fp32 prefill-feature pass runs (auto: the GPU if torch sees "
                               "one); it runs before generation and frees its memory for the engine")

    sampling = p.add_argument_group("sampling")
    sampling.add_argument("--max-tokens", type=int, default=DEFAULTS["max_tokens"], metavar="M")
    sampling.add_argument("--temperature", type=finite_float(0.0), default=DEFAULTS["temperature"])
    sampling.add_argument("--top-p", type=finite_float(0.0, 1.0), default=DEFAULTS["top_p"])
    sampling.add_argument("--repetition-penalty", type=finite_float(0.0), default=DEFAULTS["repetition_penalty"])
    sampling.add_argument("--seed", type=bounded_int(0, 2**63 - 1), default=DEFAULTS["seed"])

    engine = p.add_argument_group("engine")
    engine.add_argument("--backend", choices=["vllm", "transformers"], default="vllm")
    engine.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    engine.add_argument("--max-model-len", type=int, default=8192)
    engine.add_argument("--max-num-seqs", type=int, default=64, help="vLLM max_num_seqs / HF batch size")
    engine.add_argument("--max-num-batched-tokens", type=int, default=2048)
    engine.add_argument("--kv-space-gib", type=int, default=4, help="VLLM_CPU_KVCACHE_SPACE")
    engine.add_argument("--executor", choices=["uni", "mp"], default="uni",
                        help="vLLM: uni = engine and model in one process (default; frees a core on "
                             "CPU hosts), mp = vLLM's multiprocess layout (front-end/engine overlap)")
    engine.add_argument("--threads", default=None,
                        help="vLLM: VLLM_CPU_OMP_THREADS_BIND (e.g. 0-1); transformers: torch threads")

    output = p.add_argument_group("output")
    output.add_argument("--out", required=True, type=output_path, metavar="FILE.parquet")
    output.add_argument("--resume", action="store_true",
                        help="continue an interrupted (or extend a finished) recording")
    output.add_argument("--overwrite", action="store_true", help="replace an existing trace")
    output.add_argument("--finalize-partial", action="store_true",
                        help="with --resume: generate nothing, write the final files from the requests "
                             "recorded so far (metadata complete=false); a later --resume continues")
    output.add_argument("--keep-prompt-text", choices=["auto", "never"], default="auto",
                        help="auto: text only for registry-sourced sets (ShareGPT, GSM8K)")
    output.add_argument("--flush-every", type=int, default=32, metavar="N",
                        help="write a part file every N finished requests (or every 20 s)")
    output.add_argument("--quiet", action="store_true")
    return p


def _sha(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


def check_args(args):
    """Every flag against the model's config and the output path, before anything is loaded or
    written: bad input -> CaptureError (one line, exit 2). Returns (model_dir, model config)."""
    from .model import check_model_dir, read_config
    from .store import check_output_flags

    check_output_flags(args)
    model_dir = check_model_dir(args.model)
    cfg = read_config(model_dir)
    nl = cfg.get("num_hidden_layers")
    hidden = cfg.get("hidden_size")
    if not isinstance(nl, int) or not isinstance(hidden, int):
        raise CaptureError(f"{model_dir}/config.json lacks num_hidden_layers / hidden_size")
    args.layer = args.layer or [DEFAULTS["layer"]]
    args.decode_layer = args.decode_layer if args.decode_layer is not None else DEFAULTS["decode_layer"]
    if len(set(args.layer)) != len(args.layer):
        raise CaptureError("--layer given twice with the same value")
    for name, ks in (("--layer", args.layer), ("--decode-layer", args.decode_layer)):
        for k in ks:
            if not 0 <= k < nl:
                raise CaptureError(f"{name} {k} out of range: the model has {nl} decoder layers (0..{nl - 1})")
    for name in ("mean_layer", "entropy_layer"):
        k = getattr(args, name)
        if k == -1:
            setattr(args, name, None)
        elif not 0 <= k < nl:
            raise CaptureError(f"--{name.replace('_', '-')} {k} out of range: 0..{nl - 1} (or -1)")
    for flag in ("max_tokens", "max_num_seqs", "max_num_batched_tokens", "kv_space_gib", "flush_every"):
        if getattr(args, flag) < 1:
            raise CaptureError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.temperature < 0 or not 0 < args.top_p <= 1 or args.repetition_penalty <= 0:
        raise CaptureError("bad sampling parameters (temperature >= 0, 0 < top-p <= 1, repetition-penalty > 0)")
    if args.limit is not None and args.limit < 1:
        raise CaptureError("--limit must be >= 1")
    if args.decode_every < 0:
        raise CaptureError("--decode-every must be >= 0")
    if args.max_model_len <= args.max_tokens:
        raise CaptureError("--max-model-len must exceed --max-tokens")
    if args.threads and args.backend == "vllm":
        from .backend_vllm import parse_cpu_list
        parse_cpu_list(args.threads)
    elif args.threads and not (args.threads.isdigit() and int(args.threads) >= 1):
        raise CaptureError(f"--threads {args.threads!r}: the transformers backend takes a thread count >= 1")
    from .store import check_output_trace

    out = Path(args.out)
    check_output_trace(out, "--out")
    parts = out.with_name(out.name + ".parts")
    if (out.exists() or parts.exists()) and not (args.resume or args.overwrite):
        raise CaptureError(f"{out} (or its .parts) exists; use --resume to continue or --overwrite")
    return model_dir, cfg


def _load_tokenizer(model_dir):
    """(tokenizer, its chat template); bad environment or model -> CaptureError."""
    try:
        from transformers import AutoTokenizer
    except ImportError as e:
        raise CaptureError(f"transformers is not importable ({e}); use the capture venv "
                           "(scripts/setup_capture_env.sh)") from None
    try:
        tok = AutoTokenizer.from_pretrained(str(model_dir))
    except Exception as e:  # noqa: BLE001
        raise CaptureError(f"cannot load the tokenizer from {model_dir}: {e}") from None
    template = getattr(tok, "chat_template", None)
    if not template:
        raise CaptureError(f"{model_dir}: the tokenizer has no chat template")
    return tok, template


def _tokenized(args, tok, prompts):
    """(prompt, chat-templated token ids) of the prompts that fit max_model_len - max_tokens, cut
    to --limit, and the ids of those skipped as too long."""
    max_prompt = args.max_model_len - args.max_tokens
    items, skipped = [], []
    for p in prompts:
        ids = tok.apply_chat_template(p.messages(),
                                      add_generation_prompt=True, tokenize=True, return_dict=False)
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        ids = list(ids)
        if len(ids) > max_prompt:
            skipped.append(p.request_id)
            continue
        items.append((p, ids))
    if args.limit is not None:
        items = items[: args.limit]
    if not items:
        raise CaptureError("no prompts left after filtering (all longer than max-model-len - max-tokens)")
    return items, skipped


def _feature_layers(args) -> dict[str, int]:
    """Feature column -> tapped decoder block."""
    layers = {"feat_last": args.layer[0]}
    for k in args.layer[1:]:
        layers[f"feat_last_l{k}"] = k
    if not args.no_prefill_features and args.mean_layer is not None:
        layers["feat_mean"] = args.mean_layer
    if not args.no_prefill_features and args.entropy_layer is not None:
        layers["feat_entropy_pooled"] = args.entropy_layer
    return layers


def _sampling(args) -> dict:
    return {"temperature": args.temperature, "top_p": args.top_p,
            "repetition_penalty": args.repetition_penalty, "seed": args.seed}


def _run_config(args, model_dir, layers, template) -> dict:
    """The settings a resumed recording must share with the one it continues."""
    from .model import model_revision

    return {
        "model_revision": model_revision(model_dir), "backend": args.backend, "dtype": args.dtype,
        "layers": layers, "decode_layers": sorted(set(args.decode_layer)) if args.decode_every else [],
        "decode_every_k": args.decode_every, "sampling": _sampling(args), "max_tokens": args.max_tokens,
        "chat_template_sha256": _sha(template), "max_model_len": args.max_model_len,
        "prefill_features": not args.no_prefill_features, "keep_prompt_text": args.keep_prompt_text,
    }


def _up_to_date(args, store, run_config, items) -> bool:
    """With --resume on a finished trace: True when it already holds exactly these requests under
    the same settings (nothing to do)."""
    if not (args.resume and store.out.exists() and not store.dir.exists()):
        return False
    import pyarrow.parquet as pq

    from .store import read_meta

    if read_meta(store.out).get("run_config") != run_config:
        return False
    have = set(pq.read_table(store.out, columns=["request_id"]).column(0).to_pylist())
    return have == {p.request_id for p, _ in items}


def record(args) -> int:
    t_start = time.time()
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    model_dir, cfg = check_args(args)
    from .prompts import load_prompts

    prompts = load_prompts(args.prompts, per_domain_limit=args.per_domain_limit)
    if not prompts:
        raise CaptureError(f"no prompts selected by --prompts {' '.join(args.prompts)} (an empty file or slice?)")
    log = (lambda *a: None) if args.quiet else (lambda *a: print(*a, file=sys.stderr, flush=True))
    tok, template = _load_tokenizer(model_dir)
    items, skipped = _tokenized(args, tok, prompts)
    layers = _feature_layers(args)
    prefill = not args.no_prefill_features
    run_config = _run_config(args, model_dir, layers, template)

    from .store import PartStore

    store = PartStore(Path(args.out))
    store.lock()
    if _up_to_date(args, store, run_config, items):
        log(f"{args.out} is up to date ({len(items)} requests)")
        return 0
    with store.segment(run_config, resume=args.resume):
        done_gen = store.done_ids("gen")
        done_feat = store.done_ids("feat")
        todo_gen = [(p, ids) for p, ids in items if p.request_id not in done_gen]
        todo_feat = [(p, ids) for p, ids in items if p.request_id not in done_feat] if prefill else []
        log(f"{len(items)} prompts ({len(skipped)} too long skipped); to generate {len(todo_gen)}, "
            f"prefill features {len(todo_feat)} (run {store.run})")

        # reference lengths in the serving model's tokens
        ref_len = {}
        for p, _ in todo_gen:
            if p.reference:
                ref_len[p.request_id] = len(tok(p.reference, add_special_tokens=False)["input_ids"])

        planned = len(items)
        if args.finalize_partial:
            if not args.resume:
                raise CaptureError("--finalize-partial needs --resume")
            todo_gen, todo_feat = [], []
            done = done_gen & done_feat if prefill else done_gen
            items = [(p, ids) for p, ids in items if p.request_id in done]
            if not items:
                raise CaptureError(f"{args.out}: nothing recorded yet")

        # ---- prefill-only pass (transformers): feat_mean, feat_entropy_pooled, text_embedding
        if todo_feat:
            from .features import run_prefill_pass
            from .schema import feat_table

            def write_feat(cols):
                store.write("feat", feat_table(cols, cfg["hidden_size"]))

            run_prefill_pass(model_dir, [(p.request_id, ids, p.text) for p, ids in todo_feat],
                             mean_layer=layers.get("feat_mean"),
                             entropy_layer=layers.get("feat_entropy_pooled"), check_layers=[args.layer[0]],
                             write_part=write_feat, threads=_hf_threads(args),
                             device=args.prefill_device, log=log)

        # ---- generation pass
        if todo_gen:
            backend_info = _generate(args, store, model_dir, cfg, todo_gen, ref_len, log)
        else:
            backend_info = _load_run_info(store)

        # ---- finalize
        from .finalize import finalize

        meta = _metadata(args, model_dir, cfg, run_config, template, skipped,
                         complete=len(items) == planned, planned=planned)
        finalize(store, [p for p, _ in items], meta, backend_info, hidden=cfg["hidden_size"], log=log)
        log(f"wrote {args.out} ({len(items)} requests) in {time.time() - t_start:.0f}s")
        return 0


def _metadata(args, model_dir, cfg, run_config, template, skipped, *, complete: bool, planned: int) -> dict:
    """The trace's metadata (docs/traces.md) for this recording."""
    from .model import model_id
    from .prompts import source_name
    from .schema import PREFIX_BLOCK

    meta = {
        "schema_version": SCHEMA_VERSION,
        "model_id": model_id(model_dir),
        "model_source": _model_source(model_dir),
        "model_revision": run_config["model_revision"],
        "layers": run_config["layers"],
        "layer_semantics": "0-based decoder block output (residual stream) = HF hidden_states[k+1]; "
                           "for the last block, before the final norm",
        "num_layers": cfg["num_hidden_layers"],
        "hidden_size": cfg["hidden_size"],
        "dtype": args.dtype,
        "feature_dtype": "float16",
        "sampling": run_config["sampling"],
        "max_tokens": args.max_tokens,
        "max_model_len": args.max_model_len,
        "chat_template": template,
        "chat_template_sha256": run_config["chat_template_sha256"],
        "prompt_sources": [source_name(spec) for spec in args.prompts],
        "per_domain_limit": args.per_domain_limit,
        "limit": args.limit,
        "skipped_long_prompts": len(skipped),
        "capture_date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": host_description(),
        "timing": ("closed loop: requests are submitted to the engine as earlier ones finish, "
                   "keeping about max_num_seqs (+1/8) in flight; ttft_s, e2e_s and token_times_s "
                   "are seconds from a request's submission; arrival_s is its submission "
                   "offset from the start of its run (metadata.runs; no arrival process); all "
                   "timings are on the recording host (`host`), in eager mode"),
        "decode_every_k": args.decode_every,
        "decode_layers": run_config["decode_layers"],
        "run_config": run_config,
        "complete": complete,
        "planned_requests": planned,
        "prefix_block_size": PREFIX_BLOCK,   # the prefix_hashes column (capture/schema.py)
    }
    if run_config["prefill_features"]:
        from .features import encoder_info

        meta["text_encoder"] = encoder_info()
    else:
        meta["text_encoder"] = None
    return meta


def _model_source(model_dir):
    f = Path(model_dir) / "leap_source.json"
    try:
        return json.loads(f.read_text()) if f.exists() else None
    except (OSError, ValueError):
        return None


def _hf_threads(args):
    """torch threads for the transformers passes, default 1 (on a shared small box more threads
    than free cores make OpenMP spin and run several times slower). With the vLLM backend
    ``--threads`` is a CPU list: the prefill pass runs in this process before the engine starts, so
    the process is pinned to those CPUs here already, one thread each (read as a count, "0" gave
    torch its default of one thread per core and two pinned recorders thrashed in this pass)."""
    if args.threads and args.backend == "vllm":
        from .backend_vllm import parse_cpu_list
        cpus = parse_cpu_list(args.threads)
        os.sched_setaffinity(0, cpus)
        return len(cpus)
    if args.threads:
        return int(args.threads)
    return 1


def host_description() -> str:
    """A coarse description of the recording machine (CPU model, core count, OS, architecture):
    enough to read the timings, nothing that names the machine (no host name, no kernel build)."""
    cpu = platform.processor() or ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}; {os.cpu_count()} cpus; {platform.system()} {platform.machine()}"


def _load_run_info(store):
    f = store.dir / "backend.json"
    return json.loads(f.read_text()) if f.exists() else None


def _generate(args, store, model_dir, cfg, todo, ref_len, log):
    from .backend import Backend, GenRequest
    from .schema import dec_table, gen_table, steps_table

    keep = args.keep_prompt_text == "auto"
    by_id = {p.request_id: p for p, _ in todo}
    reqs = [GenRequest(p.request_id, ids) for p, ids in todo]
    dec_layers = sorted(set(args.decode_layer)) if args.decode_every else []
    if args.backend == "vllm":
        try:
            import vllm  # noqa: F401
        except ImportError as e:
            raise CaptureError(f"vllm is not importable ({e}); use the capture venv") from None
        from .backend_vllm import VLLMBackend

        be: Backend = VLLMBackend(model_dir, last_layers=args.layer, decode_layers=dec_layers,
                         decode_every=args.decode_every, dtype=args.dtype, seed=args.seed,
                         max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                         max_num_batched_tokens=args.max_num_batched_tokens,
                         kv_space_gib=args.kv_space_gib, threads=args.threads,
                         executor=args.executor, log=log)
    else:
        from .backend_hf import HFBackend

        be = HFBackend(model_dir, last_layers=args.layer, decode_layers=dec_layers,
                       decode_every=args.decode_every, dtype=args.dtype, seed=args.seed,
                       batch_size=args.max_num_seqs, threads=_hf_threads(args), log=log)
    info = be.info()
    info["run_started"] = time.time()
    atomic_write_bytes(store.dir / "backend.json", json.dumps(info).encode())
    sampling = {"temperature": args.temperature, "top_p": args.top_p,
                "repetition_penalty": args.repetition_penalty, "max_tokens": args.max_tokens}
    names = list({**{"feat_last": args.layer[0]}, **{f"feat_last_l{k}": k for k in args.layer[1:]}})
    hidden = cfg["hidden_size"]
    stats: dict[str, Any] = {"generated_tokens": 0, "requests": 0, "wall_s": 0.0, "backend": info.get("backend"),
             "executor": info.get("executor"), "engine_startup_s": getattr(be, "startup_s", None)}
    t0 = time.perf_counter()
    step_state = {"n": 0}

    def on_steps(rows):
        for r in rows:
            r["run"] = store.run
            r["run_step"] = step_state["n"]
            step_state["n"] += 1
        store.write("steps", steps_table(rows))

    def on_finished(fins):
        # decode rows first, then the gen rows: a request counts as done only with its gen row
        if fins and any(f.decode for f in fins):
            store.write("dec", dec_table(fins, hidden))
        store.write("gen", gen_table(fins, by_id, ref_len, args.max_tokens, names, args.layer,
                                     hidden, keep))
        stats["requests"] += len(fins)
        stats["generated_tokens"] += sum(f.output_tokens for f in fins)
        stats["wall_s"] = time.perf_counter() - t0
        _write_run_stats(store, stats)

    try:
        res = be.run(reqs, sampling, on_finished, on_steps, flush_n=args.flush_every)
    finally:
        be.close()
    stats["wall_s"] = res["wall_s"]
    _write_run_stats(store, stats)
    return info


def _write_run_stats(store, stats):
    atomic_write_bytes(store.dir / f"run-{store.run:03d}.json", json.dumps(stats).encode())
