"""LEAP scheduling inside a live vLLM V1 engine, through vLLM's own extension points.

``LiveSchedulerConfig(...).to_engine_args()`` -> engine kwargs (``scheduler_cls``,
``worker_extension_cls``, ``max_num_seqs``, ``additional_config``); build the engine in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``uni`` executor), then ``attach(engine)`` installs the hook
and returns the scheduler, whose ``leap_stats()`` holds the per-step record. The text-encoder
baseline (``predictor="ssjf"``) reads each request's raw prompt text from
``SamplingParams(extra_args={PROMPT_TEXT_KEY: text})``.
"""

from __future__ import annotations

from live.config import CONFIG_KEY, PROMPT_TEXT_KEY, LiveConfigError, LiveSchedulerConfig


def scheduler_of(engine):
    """The live scheduler of an in-process ``vllm.LLMEngine`` (or ``vllm.LLM``)."""
    engine = getattr(engine, "llm_engine", engine)
    core = getattr(getattr(engine, "engine_core", None), "engine_core", None)
    sched = getattr(core, "scheduler", None)
    from live.scheduler import LeapScheduler

    if not isinstance(sched, LeapScheduler):
        raise LiveConfigError("the engine runs no live scheduler in this process: build it with "
                              "LiveSchedulerConfig.to_engine_args() and VLLM_ENABLE_V1_MULTIPROCESSING=0")
    return sched


def attach(engine):
    """Connect the scheduler and the worker hook of an in-process engine; return the scheduler."""
    sched = scheduler_of(engine)
    cfg = sched.leap_config
    if cfg.needs_hook and not sched.leap_channel.installed:
        engine = getattr(engine, "llm_engine", engine)
        from vllm.v1.executor.uniproc_executor import UniProcExecutor

        if not isinstance(engine.model_executor, UniProcExecutor):
            raise LiveConfigError("the LEAP hook hands predictions to the scheduler in-process: use "
                                  "distributed_executor_backend='uni' (to_engine_args)")
        f = cfg.readout_file()
        engine.collective_rpc("lv_install", args=(sched.leap_channel, f.info["layer"], f.folded(),
                                                  cfg.form.learns_online))
    return sched


__all__ = ["CONFIG_KEY", "PROMPT_TEXT_KEY", "LiveConfigError", "LiveSchedulerConfig", "attach", "scheduler_of"]
