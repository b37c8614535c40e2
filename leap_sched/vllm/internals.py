"""The vLLM internals LEAP's serving plugin relies on, in one place, checked at start-up.

vLLM's scheduler interface is not public ("compatibility may not be maintained", its own warning),
so the plugin runs only on versions it was tested on (``TESTED_VLLM``) and, on those or any other,
only when every member below exists and every method below takes the parameters the plugin passes.
An untested version is refused with one line; set ``"allow_untested_vllm": true`` in the ``leap``
additional config, or the environment variable ``LEAP_ALLOW_UNTESTED_VLLM=1``, to try it anyway
(the members are still checked). The same table is checked against a vLLM release's own sources
without installing or importing it (``leap_sched.vllm.vllm_source``: the GPU release, in CI).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import re

from live.common import LiveConfigError

#: vLLM versions the plugin's tests ran against (tests/test_serve_plugin.py): only what ran, installed.
TESTED_VLLM = ("0.32.0",)
OVERRIDE_ENV = "LEAP_ALLOW_UNTESTED_VLLM"
OVERRIDE_KEY = "allow_untested_vllm"

#: ``vllm.v1.request.Request``: read by the scheduler (``live/scheduler.py``, ``live/predictors.py``);
#: ``next_decode_eligible_step`` is written (a resident left out of a step's decodes).
REQUEST_FIELDS = ("request_id", "arrival_time", "max_tokens", "num_output_tokens", "num_output_placeholders",
                  "num_computed_tokens", "num_preemptions", "is_prefill_chunk", "next_decode_eligible_step",
                  "sampling_params", "status")
#: ``vllm.v1.core.sched.scheduler.Scheduler``: methods overridden or called, state read or reordered.
SCHEDULER_MEMBERS = ("schedule", "update_from_output", "add_request", "_free_request", "shutdown",
                     "running", "waiting", "current_step", "max_num_running_reqs", "vllm_config")
#: ``vllm.v1.core.sched.output.SchedulerOutput``: read after vLLM's schedule().
SCHEDULER_OUTPUT_FIELDS = ("num_scheduled_tokens", "scheduled_new_reqs", "scheduled_cached_reqs")
#: ``vllm.v1.worker.gpu_model_runner.GPUModelRunner`` (the CPU runner subclasses it): the hook's batch layout.
MODEL_RUNNER_FIELDS = ("input_batch", "query_start_loc", "model", "model_config", "requests")
#: ``vllm.v1.worker.gpu_input_batch.InputBatch``: which flattened row holds a request's last prompt token.
INPUT_BATCH_FIELDS = ("req_ids", "num_reqs", "num_prompt_tokens", "num_computed_tokens_cpu")
#: ``vllm.v1.executor.uniproc_executor.UniProcExecutor``: tensor parallel 1 (leap_sched.vllm.tp) installs the hook
#: through it, in-process, with the scheduler's own channel.
EXECUTOR_MEMBERS = ("collective_rpc",)
#: ``vllm.v1.executor.multiproc_executor.MultiprocExecutor``: tensor parallel > 1 (leap_sched.vllm.tp) installs
#: the hook on every rank; rank 0's output (``output_rank``) ends a step after rank 0's hook wrote its frame.
MP_EXECUTOR_MEMBERS = ("collective_rpc", "output_rank")
#: ``vllm.v1.engine.core.EngineCore``: builds the scheduler after its executor (leap_sched.vllm.tp.engine_executor).
ENGINE_MEMBERS = ("model_executor", "scheduler")

#: (module, class, the name of its member tuple above): where each relied-on class lives.
CLASSES = (("vllm.v1.request", "Request", "REQUEST_FIELDS"),
           ("vllm.v1.core.sched.scheduler", "Scheduler", "SCHEDULER_MEMBERS"),
           ("vllm.v1.core.sched.output", "SchedulerOutput", "SCHEDULER_OUTPUT_FIELDS"),
           ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "MODEL_RUNNER_FIELDS"),
           ("vllm.v1.worker.gpu_input_batch", "InputBatch", "INPUT_BATCH_FIELDS"),
           ("vllm.v1.executor.uniproc_executor", "UniProcExecutor", "EXECUTOR_MEMBERS"),
           ("vllm.v1.executor.multiproc_executor", "MultiprocExecutor", "MP_EXECUTOR_MEMBERS"),
           ("vllm.v1.engine.core", "EngineCore", "ENGINE_MEMBERS"))
#: Parameters the plugin passes (by name or position) to vLLM methods it overrides and calls through.
SIGNATURES = {("Scheduler", "_free_request"): ("request", "delay_free_blocks"),
              ("Scheduler", "add_request"): ("request",),
              ("Scheduler", "update_from_output"): ("scheduler_output", "model_runner_output"),
              ("UniProcExecutor", "execute_model"): ("scheduler_output", "non_block"),
              ("UniProcExecutor", "collective_rpc"): ("method", "args"),
              ("MultiprocExecutor", "collective_rpc"): ("method", "args")}


def relied_on() -> list[tuple[str, str, tuple[str, ...]]]:
    """(module, class, members) for every relied-on class (read at call time: tests plant a member)."""
    return [(module, cls, globals()[names]) for module, cls, names in CLASSES]


def installed_version() -> str:
    from vllm.version import __version__

    return str(__version__)


def _defines(cls: type, name: str) -> bool:
    """``cls`` has ``name`` as a class member or dataclass field, or a ``self.name =`` in its source
    or a base's (instance fields exist only on built objects)."""
    if hasattr(cls, name) or (dataclasses.is_dataclass(cls) and name in {f.name for f in dataclasses.fields(cls)}):
        return True
    pattern = re.compile(rf"self\.{re.escape(name)}\s*(:[^=\n]*)?=")
    for klass in cls.__mro__:
        if klass.__module__.split(".")[0] != "vllm":
            continue
        try:
            if pattern.search(inspect.getsource(klass)):
                return True
        except (OSError, TypeError):        # no source shipped: cannot tell, do not refuse
            return True
    return False


def missing_internals() -> list[str]:
    """``Class.member`` for every relied-on member the installed vLLM lacks, and ``Class.method(param)``
    for every parameter one of its methods no longer takes (empty when all hold)."""
    import importlib

    missing = []
    for module, name, members in relied_on():
        cls = getattr(importlib.import_module(module), name)
        missing += [f"{name}.{member}" for member in members if not _defines(cls, member)]
        for (owner, method), params in SIGNATURES.items():
            if owner == name and hasattr(cls, method):
                taken = inspect.signature(getattr(cls, method)).parameters
                missing += [f"{name}.{method}({p})" for p in params if p not in taken]
    return missing


def check_vllm(leap_settings: dict | None) -> None:
    """Refuse (LiveConfigError, one line) an untested vLLM without the override, or one lacking a member."""
    version = installed_version()
    allowed = bool((leap_settings or {}).get(OVERRIDE_KEY)) or os.environ.get(OVERRIDE_ENV, "") not in ("", "0")
    if version not in TESTED_VLLM and not allowed:
        raise LiveConfigError(f"vLLM {version} is untested with leap_sched (tested: {', '.join(TESTED_VLLM)}); "
                              f"set \"{OVERRIDE_KEY}\": true in the leap config or {OVERRIDE_ENV}=1 to try it")
    missing = missing_internals()
    if missing:
        raise LiveConfigError(f"vLLM {version} lacks what leap_sched relies on: {', '.join(missing)}")
