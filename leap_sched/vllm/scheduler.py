"""``--scheduler-cls leap_sched.vllm.Scheduler``: the live scheduler (``live/scheduler.py``) in a served vLLM.

vLLM builds the class named by ``scheduler_cls`` whatever its async-scheduling setting, and a
``Scheduler`` subclass run with async scheduling on misses the async base's bookkeeping (in-flight
token placeholders). So ``Scheduler(...)`` builds :class:`AsyncScheduler` -- the same LEAP logic
over vLLM's ``AsyncScheduler`` -- when ``scheduler_config.async_scheduling`` is on, and the
synchronous class otherwise. The decisions are the same: the live scheduler counts in-flight
tokens as generated (``live.scheduler._generated``).

On top of the live scheduler: the settings come from ``--additional-config '{"leap": {...}}'``
(checked before vLLM's own set-up, one line on a bad one: ``leap_sched.vllm.settings``), the vLLM
version and internals are checked (``leap_sched.vllm.internals``), the hook is installed through
vLLM's own executor while the scheduler is built (tensor parallel 1: the scheduler's own channel,
in-process; above: a cross-process channel, ``leap_sched.vllm.tp``), and the stats go to vLLM's log
(``leap_sched.vllm.stats``). After each prefill the estimate goes to prometheus and, at the
finish, into the response's ``kv_transfer_params`` (``leap_sched.vllm.metrics``).
"""

from __future__ import annotations

import math

from vllm.v1.core.sched.async_scheduler import AsyncScheduler as VllmAsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler as VllmScheduler

from leap_sched.vllm.internals import check_vllm
from leap_sched.vllm.metrics import REQUEST_KEY, EstimateMetrics
from leap_sched.vllm.settings import leap_entry, plugin_options, refusing, scheduler_config
from leap_sched.vllm.stats import StatsLog
from leap_sched.vllm.tp import engine_executor, install_hook
from live.scheduler import LeapScheduler
from live.tp_channel import FileChannelReader


def _vllm_config(args, kwargs):
    return kwargs["vllm_config"] if "vllm_config" in kwargs else args[0]


class Scheduler(LeapScheduler):
    """LEAP's live scheduler for ``vllm serve``; an :class:`AsyncScheduler` where async scheduling is on."""

    def __new__(cls, *args, **kwargs):
        if cls is Scheduler and _vllm_config(args, kwargs).scheduler_config.async_scheduling:
            cls = AsyncScheduler
        return super().__new__(cls)

    def __init__(self, *args, **kwargs):
        vllm_config = _vllm_config(args, kwargs)
        with refusing():                # before vLLM's own set-up: a bad setting costs nothing more
            check_vllm(leap_entry(vllm_config))
            self._leap_served_config = scheduler_config(vllm_config)
            options = plugin_options(vllm_config)
        super().__init__(*args, **kwargs)
        if self.leap_config.needs_hook:      # through vLLM's own executor, before the first served step (tp.py)
            with refusing():
                executor = engine_executor()
            self.leap_channel = install_hook(self.leap_config, executor, self.leap_channel,
                                             vllm_config.parallel_config.distributed_executor_backend)
        self.leap_log = StatsLog(self, options["log_interval_s"])
        self.leap_log.started(self, VllmAsyncScheduler if isinstance(self, VllmAsyncScheduler) else VllmScheduler)
        self.leap_metrics = EstimateMetrics(vllm_config)
        note = EstimateMetrics.served_note()
        if note:
            self.leap_log.note(note)

    def _leap_read_config(self):
        return self._leap_served_config

    def update_from_output(self, scheduler_output, model_runner_output):
        out = super().update_from_output(scheduler_output, model_runner_output)
        self.leap_metrics.after_step(self)
        self.leap_log.after_step(self)
        return out

    def _free_request(self, request, delay_free_blocks: bool = False):
        estimate = self.leap_metrics.finished(self, request)
        kv_params, ec_params = super()._free_request(request, delay_free_blocks)
        if math.isfinite(estimate):         # the response's kv_transfer_params (non-streaming responses)
            kv_params = {**(kv_params or {}), REQUEST_KEY: round(estimate, 3)}
        self.leap_metrics.set_gauge(self)
        return kv_params, ec_params

    def shutdown(self) -> None:
        if isinstance(self.leap_channel, FileChannelReader):
            self.leap_channel.close()
        super().shutdown()


class AsyncScheduler(Scheduler, VllmAsyncScheduler):
    """The same scheduler over vLLM's async base (MRO: LEAP's logic, then AsyncScheduler, then Scheduler)."""
