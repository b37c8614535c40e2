"""``--middleware leap_sched.vllm.endpoint.settings_endpoint``: ``GET /leap_sched/settings`` on the API server.

A client (``leap-serve --server URL``) must record what the server runs, not what the client
claims. The API server holds the same ``VllmConfig`` it starts the engine core with
(``app.state.vllm_config``); this middleware answers one path from it: the scheduler class,
the ``leap`` settings as the scheduler reads them (``settings.scheduler_config``: defaults
filled, the same checks), the read-out and head weights by name and content hash (no machine
path), the served model and the engine settings a run depends on. Every other request passes
through untouched. A server without the plugin answers 404 here: that is how a client tells.
"""

from __future__ import annotations

import os

from live.http_client import SETTINGS_PATH
from live.serve_files import file_ref

#: The import path vLLM's ``--middleware`` flag takes.
MIDDLEWARE = "leap_sched.vllm.endpoint.settings_endpoint"
#: Environment of the server (inherited by the engine core) that sets the CPU engine's resources.
ENGINE_ENV = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "OMP_NUM_THREADS", "VLLM_USE_V2_MODEL_RUNNER")


def served_settings(vllm_config) -> dict:
    """The scheduler and engine settings of a served ``vllm_config`` (JSON-able)."""
    from leap_sched.vllm import SCHEDULER_CLS
    from leap_sched.vllm.internals import installed_version
    from leap_sched.vllm.settings import scheduler_config
    from live.config import model_id_of

    sched = vllm_config.scheduler_config
    model = vllm_config.model_config
    cls = sched.scheduler_cls
    cls_name = _name(cls)
    leap = None
    if cls_name in (SCHEDULER_CLS, "leap_sched.vllm.scheduler.Scheduler"):
        cfg = scheduler_config(vllm_config)
        leap = {**cfg.to_dict(), "readout": file_ref(cfg.readout), "layer": cfg.hook_layer,
                "head_weights": file_ref(cfg.head_weights), "orders_admission": cfg.orders_admission}
    hf = model.hf_text_config if hasattr(model, "hf_text_config") else model.hf_config
    names = model.served_model_name
    return {
        "plugin": "leap_sched", "vllm": installed_version(), "scheduler_cls": cls_name, "leap": leap,
        "model": {"id": model_id_of(model.model), "served_model_name": names if isinstance(names, str) else names[0],
                  "hidden_size": int(hf.hidden_size), "num_layers": int(hf.num_hidden_layers)},
        "dtype": str(model.dtype).removeprefix("torch."), "max_model_len": int(model.max_model_len),
        "enforce_eager": bool(model.enforce_eager), "seed": model.seed,
        "max_num_seqs": int(sched.max_num_seqs), "max_num_batched_tokens": int(sched.max_num_batched_tokens),
        "async_scheduling": bool(sched.async_scheduling),
        "tensor_parallel_size": int(vllm_config.parallel_config.tensor_parallel_size),
        "distributed_executor_backend": _name(vllm_config.parallel_config.distributed_executor_backend),
        "enable_prefix_caching": bool(vllm_config.cache_config.enable_prefix_caching),
        "kv_blocks": vllm_config.cache_config.num_gpu_blocks, "block_size": vllm_config.cache_config.block_size,
        "env": {k: os.environ.get(k) for k in ENGINE_ENV},
    }


def _name(obj) -> str | None:
    """A class path as given, or the path of the class given."""
    return obj if obj is None or isinstance(obj, str) else f"{obj.__module__}.{obj.__qualname__}"


async def settings_endpoint(request, call_next):
    """vLLM ``--middleware`` (an ``http`` middleware function): answer :data:`SETTINGS_PATH`, pass the rest."""
    if request.url.path != SETTINGS_PATH:
        return await call_next(request)
    from fastapi.responses import JSONResponse

    state = request.app.state
    if not hasattr(state, "leap_settings"):
        try:
            state.leap_settings = served_settings(state.vllm_config)
        except Exception as e:  # noqa: BLE001 -- reported to the client, the server keeps serving
            return JSONResponse({"error": f"{type(e).__name__}: {e}"}, status_code=500)
    return JSONResponse(state.leap_settings)
