"""The worker extension ``--worker-extension-cls leap_sched.vllm.WorkerExtension`` loads.

It is :class:`live.worker_ext.LiveExt` under the distribution's namespace: ``lv_install`` puts the
read-out hook on decoder layer k of the model runner; the plugin's scheduler calls it through vLLM's
own executor while it is built (leap_sched.vllm.tp).
"""

from __future__ import annotations

from live.worker_ext import LiveExt


class WorkerExtension(LiveExt):
    """LEAP's read-out hook (``lv_install``) and the capture methods, appended to vLLM's Worker."""
