"""``--preset recorded``: the engine settings a recording ran with, read from its metadata.

vLLM V1 as recorded (``backend_details.engine_args``): ``max_num_seqs`` running requests at most
(-> max resident; vLLM decodes every running request each step, so decode slots = max_num_seqs
and no wait cap is needed), ``max_num_batched_tokens`` tokens per step shared by decodes and
prefill chunks (-> prefill token budget, decodes counted against it), chunked prefill as the
recording had it (V1 default: on). Settings vLLM itself would refuse are refused here too, before
any run: a token budget below max_num_seqs, a budget below max_model_len without chunked prefill,
a KV cache (kv_blocks x kv_block_size) that cannot hold one max_model_len sequence. A serving
run (``leap-serve``, metadata ``serving``) gets the live scheduler's own caps instead.
"""

from __future__ import annotations

from typing import overload

from core.trace import Trace
from simulator.engine import EngineConfig
from simulator.serving import is_serving, serving_engine_config

VLLM_DEFAULT_MAX_NUM_SEQS = 256
VLLM_DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048


def _engine_args(trace: Trace) -> dict:
    meta = trace.metadata or {}
    details = meta.get("backend_details") or {}
    args = details.get("engine_args") if isinstance(details, dict) else None
    if meta.get("backend") != "vllm" or not isinstance(args, dict):
        raise ValueError(f"--preset recorded: trace {trace.name!r} has no recorded vLLM engine settings "
                         "(metadata backend_details.engine_args)")
    return args


@overload
def _positive(trace: Trace, source: dict, key: str, default: int) -> int: ...
@overload
def _positive(trace: Trace, source: dict, key: str, default: None) -> int | None: ...
def _positive(trace: Trace, source: dict, key: str, default: int | None) -> int | None:
    """``source[key]`` (else ``default``) as a positive integer; anything else is refused."""
    value = source.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 1:
        raise ValueError(f"--preset recorded: trace {trace.name!r}: recorded {key} {value!r} is not a positive integer")
    return int(value)


def recorded_engine_config(trace: Trace) -> EngineConfig:
    """The EngineConfig of the recording's own vLLM settings; refuses settings that contradict. A
    serving run (``leap-serve``) ran the project's scheduler inside vLLM: its resident cap, decode
    slots and wait cap are the live scheduler's (:func:`simulator.serving.serving_engine_config`)."""
    if is_serving(trace):
        _engine_args(trace)
        return serving_engine_config(trace)
    args = _engine_args(trace)
    details = trace.metadata["backend_details"]
    seqs = _positive(trace, args, "max_num_seqs", VLLM_DEFAULT_MAX_NUM_SEQS)
    budget = _positive(trace, args, "max_num_batched_tokens", VLLM_DEFAULT_MAX_NUM_BATCHED_TOKENS)
    chunked = args.get("enable_chunked_prefill", True)
    if not isinstance(chunked, bool):
        raise ValueError(f"--preset recorded: trace {trace.name!r}: recorded enable_chunked_prefill {chunked!r} "
                         "is not true/false")
    where = f"--preset recorded: trace {trace.name!r}: recorded settings contradict each other:"
    if budget < seqs:
        raise ValueError(f"{where} max_num_batched_tokens {budget} < max_num_seqs {seqs}")
    model_len = _positive(trace, args, "max_model_len", None)
    if model_len is not None and not chunked and budget < model_len:
        raise ValueError(f"{where} max_num_batched_tokens {budget} < max_model_len {model_len} without chunked prefill")
    blocks = _positive(trace, details, "kv_blocks", None)
    block_size = _positive(trace, details, "kv_block_size", None)
    if model_len is not None and blocks is not None and block_size is not None and blocks * block_size < model_len:
        raise ValueError(f"{where} KV cache {blocks} x {block_size} tokens < max_model_len {model_len}")
    return EngineConfig(max_resident=seqs, decode_slots=seqs, prefill_token_budget=budget, wait_cap=0,
                        chunked_prefill=chunked, decodes_in_budget=True)


def recorded_window(trace: Trace) -> int:
    """The in-flight window of a closed-loop batch recording (``--arrivals closed``)."""
    window = closed_loop_window(trace)
    if window is None:
        raise ValueError(f"--arrivals closed: trace {trace.name!r} is not a closed-loop batch recording "
                         "(it is a serving run, or its arrival_s come from elsewhere); use --arrivals recorded, "
                         "or closed:N")
    return window


def closed_loop_window(trace: Trace) -> int | None:
    """The in-flight window of a closed-loop batch recording, or None for a serving recording (or a
    trace of timed arrivals from elsewhere). A batch recording of capture-traces also stores each
    request's submission offset as ``arrival_s``; it is still a closed loop (no serving metadata)."""
    meta = trace.metadata or {}
    if meta.get("serving"):
        return None
    details = meta.get("backend_details") or {}
    if meta.get("backend") != "vllm" or not isinstance(details, dict) or not isinstance(details.get("engine_args"), dict):
        if trace.arrival_s is not None:
            return None
        raise ValueError(f"--arrivals closed: trace {trace.name!r} has no recorded vLLM window "
                         "(not a capture-traces vLLM recording); give it as closed:N")
    if details.get("window"):
        return _positive(trace, details, "window", None)
    seqs = _positive(trace, details.get("engine_args") or {}, "max_num_seqs", 64)
    return seqs + max(4, seqs // 8)   # capture/backend_vllm.py's default window
