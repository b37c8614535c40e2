"""The plugin's settings, read from vLLM's own config and refused with one line before any work.

The ``leap`` entry of ``--additional-config`` holds :class:`live.config.LiveSchedulerConfig`'s
fields (``max_resident`` defaults to ``--max-num-seqs``) plus ``allow_untested_vllm`` and
``log_interval_s``. Everything the plugin cannot honour stops the engine at start-up: the
setting errors ``LiveSchedulerConfig`` refuses, a read-out for another model (hidden size, layer
count, model id), ordered admission with vLLM's priority policy, pipeline parallelism, an
executor other than vLLM's own ``uni`` (tensor parallel 1) or ``mp`` (tensor parallel > 1), and
a hook predictor without the worker extension (compiled or eager, any tensor parallel size: each
worker taps its layer before vLLM traces the model, live.worker_ext).
In vLLM's engine-core process a refusal is one line on stderr and exit status 2 (vLLM's front end
then reports that the engine core failed to start); where vLLM runs in the caller's process it is
a :class:`LiveConfigError`.
"""

from __future__ import annotations

import math
import multiprocessing
import sys
from contextlib import contextmanager
from dataclasses import fields

from leap_sched.vllm import CONFIG_KEY, WORKER_EXTENSION_CLS, executor_backend, executor_backends
from live.common import LiveConfigError
from live.config import LiveSchedulerConfig, model_id_of

#: Plugin-only keys of the ``leap`` entry (not scheduler settings).
PLUGIN_KEYS = {"allow_untested_vllm": False, "log_interval_s": 10.0}


@contextmanager
def refusing():
    """Turn a LiveConfigError into one stderr line + exit 2 inside vLLM's engine-core process."""
    try:
        yield
    except LiveConfigError as e:
        if multiprocessing.parent_process() is None:
            raise
        print(f"leap_sched: {e}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


def leap_entry(vllm_config) -> dict:
    extra = vllm_config.additional_config
    raw = extra.get(CONFIG_KEY) if isinstance(extra, dict) else None
    if raw is None:
        raise LiveConfigError(f"no {CONFIG_KEY!r} entry in --additional-config: pass "
                              f"--additional-config '{{\"{CONFIG_KEY}\": {{\"policy\": ..., \"predictor\": ...}}}}'")
    if not isinstance(raw, dict):
        raise LiveConfigError(f"--additional-config {CONFIG_KEY!r} must be a JSON object, got {type(raw).__name__}")
    return raw


def plugin_options(vllm_config) -> dict:
    raw = leap_entry(vllm_config)
    out = {k: raw.get(k, default) for k, default in PLUGIN_KEYS.items()}
    interval = out["log_interval_s"]
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not math.isfinite(interval) \
            or interval < 0:
        raise LiveConfigError(f"log_interval_s must be a number >= 0 (0 = only when idle), got {interval!r}")
    return out


def scheduler_config(vllm_config) -> LiveSchedulerConfig:
    """The scheduler's settings, checked against the engine and the model (LiveConfigError, one line)."""
    raw = {k: v for k, v in leap_entry(vllm_config).items() if k not in PLUGIN_KEYS}
    known = {f.name for f in fields(LiveSchedulerConfig)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise LiveConfigError(f"unknown {CONFIG_KEY} setting(s): {', '.join(unknown)} "
                              f"(known: {', '.join(sorted(known | set(PLUGIN_KEYS)))})")
    max_num_seqs = vllm_config.scheduler_config.max_num_seqs
    raw.setdefault("max_resident", max_num_seqs)
    cfg = LiveSchedulerConfig.from_dict(raw)
    if cfg.max_resident != max_num_seqs:
        raise LiveConfigError(f"max_resident ({cfg.max_resident}) differs from --max-num-seqs ({max_num_seqs}): "
                              "vLLM's resident cap is max_num_seqs; drop max_resident or make them equal")
    if cfg.orders_admission and vllm_config.scheduler_config.policy != "fcfs":
        raise LiveConfigError(f"--scheduling-policy {vllm_config.scheduler_config.policy}: ordered admission re-sorts "
                              "vLLM's fcfs waiting queue; leave the policy at fcfs or set ordered_admission false")
    parallel = vllm_config.parallel_config
    if parallel.pipeline_parallel_size > 1:
        raise LiveConfigError(f"pipeline parallel size {parallel.pipeline_parallel_size}: leap_sched supports "
                              "tensor parallel only (pipeline parallel size 1)")
    check_executor(vllm_config)
    if cfg.needs_hook:
        check_hook_setup(vllm_config, cfg)
    return cfg


def check_executor(vllm_config) -> None:
    """vLLM's own executor: ``uni`` (tensor parallel 1: the model, and so the hook, in the engine-core
    process beside the scheduler, which hands the hook its channel in-process) or ``mp`` (the hook in
    rank 0's worker process, its estimates through ``live.tp_channel``): leap_sched.vllm.tp."""
    backend = vllm_config.parallel_config.distributed_executor_backend
    tp = vllm_config.parallel_config.tensor_parallel_size
    allowed = executor_backends(tp)
    if backend not in allowed:
        raise LiveConfigError(f"executor {getattr(backend, '__name__', backend)!r} with tensor parallel size {tp}: "
                              f"leap_sched runs on vLLM's own {' or '.join(allowed)}; pass "
                              f"--distributed-executor-backend {executor_backend(tp)}")


def check_hook_setup(vllm_config, cfg: LiveSchedulerConfig) -> None:
    """A hook predictor needs the plugin's worker extension and a read-out for this model (compiled or eager,
    any tensor parallel size: the worker extension taps the layer before vLLM traces it, live.tap)."""
    ext = vllm_config.parallel_config.worker_extension_cls
    if not ext:
        raise LiveConfigError(f"predictor {cfg.predictor!r} needs the hook: pass --worker-extension-cls "
                              f"{WORKER_EXTENSION_CLS}")
    from vllm.utils.import_utils import resolve_obj_by_qualname

    from live.worker_ext import LiveExt

    if not issubclass(resolve_obj_by_qualname(ext), LiveExt):
        raise LiveConfigError(f"--worker-extension-cls {ext} is not leap_sched's: pass {WORKER_EXTENSION_CLS}")
    check_readout_model(cfg, vllm_config.model_config)


def check_readout_model(cfg: LiveSchedulerConfig, model_config) -> None:
    """The read-out's hidden size, layer and (when both name one) model id match the served model."""
    hf = model_config.hf_text_config if hasattr(model_config, "hf_text_config") else model_config.hf_config
    cfg.check_readout_fits(int(hf.hidden_size), int(hf.num_hidden_layers), model_id_of(model_config.model),
                           f"the served model {model_config.model}")
