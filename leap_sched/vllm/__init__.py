"""LEAP scheduling in ``vllm serve``: the classes vLLM's own flags load (docs/serving.md).

    vllm serve MODEL --max-num-seqs 64 \\
        --scheduler-cls leap_sched.vllm.Scheduler \\
        --distributed-executor-backend uni \\
        --worker-extension-cls leap_sched.vllm.WorkerExtension \\
        --additional-config '{"leap": {"policy": "countdown", "predictor": "leap-rls", "decode_slots": 16,
                                       "readout": "leap_readout.npz"}}'

``python -m leap_sched.vllm.check`` prints this command for given settings (``leap_sched.vllm.command``).
The attributes load lazily, so the command builder imports without vLLM installed.
"""

from __future__ import annotations

from typing import Any

from live.config import PLUGIN_CONFIG_KEY

#: The ``--additional-config`` key holding the scheduler's settings (live.config.LiveSchedulerConfig fields).
CONFIG_KEY = PLUGIN_CONFIG_KEY
#: The class paths vLLM's flags name.
SCHEDULER_CLS = "leap_sched.vllm.Scheduler"
WORKER_EXTENSION_CLS = "leap_sched.vllm.WorkerExtension"
#: vLLM's own executors (``--distributed-executor-backend``): ``uni`` at tensor parallel 1 (the model in
#: the engine-core process, the hook's channel passed in-process; vLLM's CPU platform swaps it for
#: ``mp`` in a served engine), ``mp`` at any size (the hook's channel across processes): leap_sched.vllm.tp.
UNI_BACKEND = "uni"
TP_BACKEND = "mp"


def executor_backend(tensor_parallel_size: int) -> str:
    """The vLLM executor the printed command names at ``tensor_parallel_size`` (vLLM's default there)."""
    return UNI_BACKEND if tensor_parallel_size == 1 else TP_BACKEND


def executor_backends(tensor_parallel_size: int) -> tuple[str, ...]:
    """The vLLM executors leap_sched runs on at ``tensor_parallel_size``."""
    return (UNI_BACKEND, TP_BACKEND) if tensor_parallel_size == 1 else (TP_BACKEND,)


_LAZY = {
    "Scheduler": "leap_sched.vllm.scheduler",
    "AsyncScheduler": "leap_sched.vllm.scheduler",
    "WorkerExtension": "leap_sched.vllm.worker",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CONFIG_KEY", "SCHEDULER_CLS", "TP_BACKEND", "UNI_BACKEND", "WORKER_EXTENSION_CLS", "executor_backend",
           "executor_backends", *_LAZY]
