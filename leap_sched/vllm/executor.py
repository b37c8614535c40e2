"""``--distributed-executor-backend leap_sched.vllm.Executor``: vLLM's one-process executor, plus
the hand-off that connects LEAP's hook and scheduler inside one engine-core process.

The executor checks the plugin's settings before the model loads (a bad setting costs seconds,
not a model load). The scheduler owns its :class:`live.worker_ext.PredictionChannel` and sends it
on every ``SchedulerOutput`` (same process, no serialisation). Right after the model loads,
before vLLM traces it, the executor taps layer k (:class:`live.tap_executor.TapExecutor`); before
the first served step it installs the read-out with that channel through ``collective_rpc`` (the
worker extension's ``lv_install``). One channel per engine, found through the engine's own step, no module global.
"""

from __future__ import annotations

from leap_sched.vllm.internals import check_vllm
from leap_sched.vllm.settings import leap_entry, refusing, scheduler_config
from leap_sched.vllm.tp import hook_args
from live.tap_executor import TapExecutor

#: ``SchedulerOutput`` attribute the scheduler sets to its channel (hook predictors only).
CHANNEL_ATTR = "leap_channel"


class Executor(TapExecutor):
    """vLLM's ``uni`` executor (the model runs in the engine-core process) that installs LEAP's tap and hook."""

    installs_leap_hook = True   # settings.INSTALLS_HOOK: what check_executor accepts

    def _init_executor(self) -> None:
        with refusing():
            check_vllm(leap_entry(self.vllm_config))
            self.leap_config = scheduler_config(self.vllm_config)
        self.leap_hook: dict | None = None
        super()._init_executor()

    def execute_model(self, scheduler_output, non_block: bool = False):
        channel = getattr(scheduler_output, CHANNEL_ATTR, None)
        if channel is not None and not channel.installed:
            self._install_hook(channel)
        return super().execute_model(scheduler_output, non_block)

    def _install_hook(self, channel) -> None:
        self.leap_hook = self.collective_rpc("lv_install", args=(channel, *hook_args(self.leap_config)))[0]
