"""LEAP scheduling in ``vllm serve``: the classes vLLM's own flags load (docs/serving.md).

    vllm serve MODEL --max-num-seqs 64 \\
        --scheduler-cls leap_sched.vllm.Scheduler \\
        --distributed-executor-backend leap_sched.vllm.Executor \\
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
EXECUTOR_CLS = "leap_sched.vllm.Executor"
WORKER_EXTENSION_CLS = "leap_sched.vllm.WorkerExtension"
#: vLLM's executor for tensor parallel > 1 (the hook through leap_sched.vllm.tp).
TP_BACKEND = "mp"

_LAZY = {
    "Scheduler": "leap_sched.vllm.scheduler",
    "AsyncScheduler": "leap_sched.vllm.scheduler",
    "Executor": "leap_sched.vllm.executor",
    "WorkerExtension": "leap_sched.vllm.worker",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CONFIG_KEY", "EXECUTOR_CLS", "SCHEDULER_CLS", "TP_BACKEND", "WORKER_EXTENSION_CLS", *_LAZY]
