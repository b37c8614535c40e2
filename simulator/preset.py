"""``--preset recorded``: the engine settings a recording ran with, read from its metadata.

vLLM V1 as recorded (``backend_details.engine_args``): ``max_num_seqs`` running requests at most
(-> max resident; vLLM decodes every running request each step, so decode slots = max_num_seqs
and no wait cap is needed), ``max_num_batched_tokens`` tokens per step shared by decodes and
prefill chunks (-> prefill token budget, decodes counted against it, chunked prefill on).
"""

from __future__ import annotations

from simulator.engine import EngineConfig
from simulator.trace import Trace


def _engine_args(trace: Trace) -> dict:
    meta = trace.metadata or {}
    details = meta.get("backend_details") or {}
    args = details.get("engine_args")
    if meta.get("backend") != "vllm" or not isinstance(args, dict):
        raise ValueError(f"--preset recorded: trace {trace.name!r} has no recorded vLLM engine settings")
    return args


def recorded_engine_config(trace: Trace) -> EngineConfig:
    args = _engine_args(trace)
    seqs = int(args.get("max_num_seqs", 256))
    return EngineConfig(max_resident=seqs, decode_slots=seqs,
                        prefill_token_budget=int(args.get("max_num_batched_tokens", 2048)),
                        wait_cap=0, chunked_prefill=True, decodes_in_budget=True)


def closed_loop_window(trace: Trace) -> int | None:
    """The in-flight window of a closed-loop batch recording, or None for a serving recording."""
    meta = trace.metadata or {}
    if meta.get("serving") or trace.arrival_s is not None and _has_arrivals(trace):
        return None
    details = meta.get("backend_details") or {}
    if details.get("window"):
        return int(details["window"])
    seqs = int((details.get("engine_args") or {}).get("max_num_seqs", 64))
    return seqs + max(4, seqs // 8)   # capture/backend_vllm.py's default window


def _has_arrivals(trace: Trace) -> bool:
    import numpy as np
    a = np.asarray(trace.arrival_s, dtype=np.float64)
    return bool(len(a)) and bool(np.isfinite(a).all())
