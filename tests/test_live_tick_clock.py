"""The live scheduler's policy clock under the step clock (docs/semantics.md "Step clock"): the
harness hands each tick to ``LeapScheduler`` before the tick's submissions, and from then on a
policy's ``SchedulerView.now`` (and each new request's arrival) is the tick, as in the simulator's
unit-time replay; without a tick it stays wall seconds. No engine: the step logic alone. The
end-to-end hold is ``tests/test_stepclock_replay.py`` on the committed ``slack-mlfq`` run."""

from __future__ import annotations

import importlib.util
import time
from types import SimpleNamespace

import pytest

pytestmark = pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("torch", "vllm")),
                                reason="needs vllm (live.scheduler imports its Scheduler)")


def _scheduler():
    from live.scheduler import LeapScheduler

    sched = object.__new__(LeapScheduler)       # the clock only: no engine
    sched._leap_wall0, sched._leap_tick = time.time() - 1000.0, None
    return sched


def test_wall_seconds_until_a_tick_is_given_then_ticks():
    sched = _scheduler()
    assert 999.0 < sched._leap_now() < 1100.0    # wall seconds since the scheduler started
    sched.leap_set_tick(7)
    assert sched._leap_now() == 7.0
    sched.leap_set_tick(65)
    assert sched._leap_now() == 65.0


def test_the_harness_gives_the_tick_to_the_engine_cores_scheduler():
    from capture.backend_vllm import VLLMBackend

    sched = _scheduler()
    backend = object.__new__(VLLMBackend)
    backend.engine = SimpleNamespace(engine_core=SimpleNamespace(engine_core=SimpleNamespace(scheduler=sched)))
    backend._give_tick(12)
    assert sched._leap_now() == 12.0
    backend.engine.engine_core.engine_core.scheduler = SimpleNamespace()   # vLLM's own scheduler: nothing to give
    backend._give_tick(13)
