"""Ctrl-C during an engine step lands after the step (``capture.backend_vllm.engine_step_holding_ctrl_c``):
vLLM turns an exception raised inside its step into a failed engine, so a live run interrupted
mid-step would end as an error instead of a resumable interruption. No vLLM needed: a fake
engine presses Ctrl-C on itself from inside its step."""

from __future__ import annotations

import os
import signal

import pytest

from capture.backend_vllm import engine_step_holding_ctrl_c


@pytest.fixture(autouse=True)
def python_ctrl_c():
    """Python's own SIGINT handler for each test (a suite run as a background job inherits SIG_IGN)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


class PressingEngine:
    """``step()`` sends this process SIGINT ``presses`` times, then finishes its work."""

    def __init__(self, presses: int):
        self.presses = presses
        self.finished_steps = 0

    def step(self):
        for _ in range(self.presses):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):   # bytecode boundaries: the handler runs here
                pass
        self.finished_steps += 1
        return ["outputs"]


def test_one_press_waits_for_the_step_then_interrupts():
    engine = PressingEngine(presses=1)
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        engine_step_holding_ctrl_c(engine)
    assert engine.finished_steps == 1
    assert signal.getsignal(signal.SIGINT) is before


def test_a_second_press_interrupts_the_step_itself():
    engine = PressingEngine(presses=2)
    with pytest.raises(KeyboardInterrupt):
        engine_step_holding_ctrl_c(engine)
    assert engine.finished_steps == 0


def test_no_press_is_a_plain_step():
    engine = PressingEngine(presses=0)
    assert engine_step_holding_ctrl_c(engine) == ["outputs"] and engine.finished_steps == 1


def test_an_ignored_ctrl_c_stays_ignored():
    """Under ``nohup ... &`` SIGINT is ignored: the step neither holds nor raises it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    engine = PressingEngine(presses=2)
    assert engine_step_holding_ctrl_c(engine) == ["outputs"] and engine.finished_steps == 1
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
