"""Serving runs (``leap-serve``, ``traces/live/``) as simulator inputs: the engine settings the
live scheduler ran with, the recorded trace the requests came from, and that trace's feature
columns joined onto the served requests (a serving trace carries no hidden states of its own).
"""

from __future__ import annotations

import numpy as np

from core.trace import Trace, TraceError, load_trace
from simulator.config import EngineConfig


def serving_meta(trace: Trace) -> dict:
    meta = (trace.metadata or {}).get("serving")
    if not isinstance(meta, dict):
        raise ValueError(f"trace {trace.name!r} is not a serving run (no serving metadata)")
    return meta


def is_serving(trace: Trace) -> bool:
    return isinstance((trace.metadata or {}).get("serving"), dict)


def serving_engine_config(trace: Trace) -> EngineConfig:
    """The live run's engine settings: resident cap, decode slots, wait cap, the token budget shared
    by decodes and prefill chunks, chunked prefill as vLLM V1 ran it, a bound KV cache."""
    s = serving_meta(trace)
    args = ((trace.metadata or {}).get("backend_details") or {}).get("engine_args") or {}
    chunked = args.get("enable_chunked_prefill", True)
    try:
        budget = s.get("max_num_batched_tokens") or args.get("max_num_batched_tokens") or 2048
        return EngineConfig(max_resident=int(s["max_resident"]), decode_slots=int(s["decode_slots"]),
                            prefill_token_budget=int(budget),
                            wait_cap=int(s.get("wait_cap") or 0), chunked_prefill=bool(chunked),
                            decodes_in_budget=True, **_kv_bound(s))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"trace {trace.name!r}: serving metadata lacks an engine setting ({exc})") from None


def _kv_bound(s: dict) -> dict:
    """A live run whose KV cache was bound (``leap-serve --kv-blocks``, ``live/kv_cache.py``): the
    same blocks (docs/semantics.md "KV blocks"); none for a run with the engine's own cache."""
    if s.get("kv_blocks_bound") is None:
        return {}
    return {"kv_blocks": int(s["kv_blocks_bound"]), "kv_block_size": int(s["kv_block_size"]),
            "prefix_caching": bool(s.get("prefix_caching", False))}   # the live runs switch it off


#: Source traces given by path (``leap-validate --source PATH``), by content hash.
GIVEN_SOURCES: dict[str, Trace] = {}


def source_trace(trace: Trace) -> Trace:
    """The recorded trace the serving run took its requests from (serving.source_trace), checked
    by content hash: its features (feat_last, text_embedding) feed the simulator's predictors."""
    src = serving_meta(trace).get("source_trace") or {}
    name, sha = src.get("name"), src.get("sha256")
    if not name or not sha:
        raise ValueError(f"trace {trace.name!r}: serving.source_trace names no trace and hash")
    if sha in GIVEN_SOURCES:   # leap-validate --source PATH: found by its content hash
        return GIVEN_SOURCES[sha]
    try:
        source = load_trace(name)
    except TraceError:
        raise ValueError(f"trace {trace.name!r}: its source trace {name!r} is not available here "
                         "(give its file with --source PATH)") from None
    if source.content_hash != sha:
        raise ValueError(f"trace {trace.name!r}: source trace {name!r} here has content hash "
                         f"{source.content_hash[:12]}, the run was served from {sha[:12]}: not the same requests")
    return source


def source_rows(trace: Trace, source: Trace, ids: list) -> np.ndarray:
    """Row in ``source`` of each served request id (same prompt length checked)."""
    where = {rid: i for i, rid in enumerate(source.request_id.tolist())}
    missing = [rid for rid in ids if rid not in where]
    if missing:
        raise ValueError(f"trace {trace.name!r}: request {missing[0]!r} is not in its source trace {source.name!r}")
    return np.array([where[rid] for rid in ids], dtype=np.int64)


def with_source_features(trace: Trace) -> Trace:
    """``trace`` (a serving run) with the feature columns it lacks taken from its source trace, row by
    row through request_id: what the simulator's learned predictors read for each served request."""
    import pyarrow as pa

    from core.trace import FEATURE_COLUMNS, trace_content_hash

    source = source_trace(trace)
    missing = [c for c in FEATURE_COLUMNS if c in source.table.column_names and c not in trace.table.column_names]
    if not missing:
        return trace
    rows = source_rows(trace, source, trace.table.column("request_id").to_pylist())
    prompt = trace.prompt_tokens.astype(np.int64)
    if not np.array_equal(source.prompt_tokens[rows].astype(np.int64), prompt):
        i = int(np.flatnonzero(source.prompt_tokens[rows] != prompt)[0])
        raise ValueError(f"trace {trace.name!r}: request {trace.request_id[i]!r} has {prompt[i]} prompt tokens, "
                         f"its source {source.name!r} {source.prompt_tokens[rows][i]}")
    picked = source.table.take(pa.array(rows))
    table = trace.table
    for name in missing:
        table = table.append_column(name, picked.column(name))
    return Trace(name=trace.name, path=trace.path, table=table, metadata=trace.metadata,
                 content_hash=trace_content_hash(table, trace.metadata), steps=trace.steps)
