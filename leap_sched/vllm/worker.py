"""The worker extension ``--worker-extension-cls leap_sched.vllm.WorkerExtension`` loads.

It is :class:`live.worker_ext.LiveExt` under the distribution's namespace: ``lv_install`` puts the
read-out hook on decoder layer k of the model runner; :class:`leap_sched.vllm.Executor` calls it
in the engine-core process with the scheduler's own channel.
"""

from __future__ import annotations

from live.worker_ext import LiveExt


class WorkerExtension(LiveExt):
    """LEAP's read-out hook (``lv_install``) and the capture methods, appended to vLLM's Worker."""
