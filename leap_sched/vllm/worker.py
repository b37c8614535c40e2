"""The worker extension ``--worker-extension-cls leap_sched.vllm.WorkerExtension`` loads.

It is :class:`live.worker_ext.LiveExt` under the distribution's namespace: ``lv_install`` puts the
read-out hook on decoder layer k of the model runner; the plugin's scheduler calls it through vLLM's
own executor while it is built (leap_sched.vllm.tp).
"""

from __future__ import annotations

from live.worker_ext import LiveExt


class WorkerExtension(LiveExt):
    """LEAP's read-out hook (``lv_install``) and the capture methods, appended to vLLM's Worker.

    The printed command names it for every setting: vLLM builds the worker before it loads the
    model, so rank 0's worker checks the plugin's settings there (``leap_sched.vllm.settings``: one
    line, exit 2), and a bad setting costs the processes' start only, not a model load."""

    def __new__(cls, *args, **kwargs):
        config = kwargs.get("vllm_config")
        if config is not None and kwargs.get("rank", 0) == 0:
            from leap_sched.vllm.internals import check_vllm
            from leap_sched.vllm.settings import leap_entry, refusing, scheduler_config

            with refusing():
                check_vllm(leap_entry(config))
                scheduler_config(config)
        return super().__new__(cls, *args, **kwargs)
