"""LEAP's hook installed through vLLM's own executor, at every tensor parallel size (docs/serving.md).

While the scheduler is built it installs the hook on every worker through the engine's executor
(``collective_rpc`` ``lv_install``), before the first served step. vLLM's ``uni`` executor (tensor
parallel 1): the model runs in the engine-core process beside the scheduler, ``collective_rpc`` calls
the worker directly, and the scheduler passes its own :class:`live.worker_ext.PredictionChannel`
(same process, no serialisation). vLLM's ``mp`` executor (tensor parallel > 1, and tensor parallel 1
on vLLM's CPU platform, which swaps ``uni`` for ``mp`` in a served engine): the model runs in one worker
process per rank; the scheduler owns a :class:`live.tp_channel.FileChannelReader` (a per-engine
folder) and passes the folder's writer (rank 0's hook writes, the others stay inactive:
``live.worker_ext``). Either way the worker tapped its layer when it loaded the model, before vLLM
traced it (``live.worker_ext.LiveExt``). vLLM builds the scheduler in ``EngineCore.__init__`` after its executor and
passes it no handle to it, so :func:`engine_executor` finds ``model_executor`` on the engine
object one frame up (``internals.ENGINE_ATTRS`` checks the attribute in vLLM's sources).
"""

from __future__ import annotations

import sys
from types import FrameType

from leap_sched.vllm import UNI_BACKEND
from live.common import LiveConfigError
from live.config import LiveSchedulerConfig
from live.tp_channel import FileChannelReader
from live.worker_ext import PredictionChannel

#: The engine-core attribute holding the executor (vllm.v1.engine.core.EngineCore).
EXECUTOR_ATTR = "model_executor"
#: How many frames up the call stack the engine's ``__init__`` may be (the scheduler's own inits between).
MAX_DEPTH = 8


def hook_args(cfg: LiveSchedulerConfig) -> tuple:
    """``lv_install``'s arguments after the channel: the read-out's layer, folded weights, keep vectors."""
    readout = cfg.readout_file()
    return readout.info["layer"], readout.folded(), cfg.form.learns_online


def engine_executor():
    """The executor of the engine whose ``__init__`` is building the calling scheduler."""
    frame: FrameType | None = sys._getframe(1)
    for _ in range(MAX_DEPTH):
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        executor = getattr(owner, EXECUTOR_ATTR, None)
        if executor is not None and hasattr(executor, "collective_rpc"):
            return executor
        frame = frame.f_back
    raise LiveConfigError(f"no engine with a {EXECUTOR_ATTR} builds this scheduler; leap_sched's "
                          "scheduler is built by vLLM's engine core (vllm serve)")


def install_hook(cfg: LiveSchedulerConfig, executor, channel: PredictionChannel, backend) -> PredictionChannel:
    """Install the hook on every worker; return the scheduler's side of the channel: ``channel`` itself
    on vLLM's ``uni`` executor (``backend``; in-process), else a new cross-process :class:`FileChannelReader`."""
    if backend == UNI_BACKEND:
        args = hook_args(cfg)
        executor.collective_rpc("lv_install", args=(channel, *args))
        return channel
    return install_tp_hook(cfg, executor)


def install_tp_hook(cfg: LiveSchedulerConfig, executor) -> FileChannelReader:
    """Make the cross-process channel and install the hook on every rank; return the scheduler's side."""
    args = hook_args(cfg)
    channel = FileChannelReader()
    try:
        executor.collective_rpc("lv_install", args=(channel.writer(), *args))
    except BaseException:
        channel.close()
        raise
    channel.installed = True
    channel.layer = int(args[0])
    return channel
