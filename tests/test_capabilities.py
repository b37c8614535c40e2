"""What a predictor or policy supports is declared on its class, never inferred from the methods it
overrides: the compiled kernel reads ``compiled``, ``learns_online`` and ``observes_prefill``, the
live scheduler ``live``, a router ``scores_at_arrival``. Here every registered class declares each
one (itself or through a project base class), gives the reason for each it lacks, and its
declarations agree with what it does."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from core.trace import trace_from_arrays
from policies import POLICIES
from policies.base import Policy
from predictors import PREDICTORS
from predictors.base import Predictor
from predictors.oracle import Oracle
from simulator.compiled import note_fallback, unsupported
from simulator.engine import EngineConfig, Simulation
from simulator.profiles.unit import UnitProfile
from simulator.runner import run_simulation

REGISTERED = [*((name, cls, Policy) for name, cls in POLICIES.items()),
              *((name, cls, Predictor) for name, cls in PREDICTORS.items())]


def declared_below(cls: type, base: type, attribute: str) -> bool:
    """``attribute`` is set by ``cls`` or a class between it and ``base`` (not only by ``base``'s default)."""
    return any(attribute in vars(c) for c in cls.__mro__[:cls.__mro__.index(base)])


def overrides(cls: type, base: type, method: str) -> bool:
    return getattr(cls, method) is not getattr(base, method)


@pytest.mark.parametrize("name, cls, base", REGISTERED, ids=[name for name, _, _ in REGISTERED])
def test_every_registered_class_declares_its_capabilities_with_reasons(name, cls, base):
    assert base.capabilities, base
    for capability in base.capabilities:
        assert declared_below(cls, base, capability), f"{name} does not declare {capability}"
        value = getattr(cls, capability)
        assert isinstance(value, bool), f"{name}.{capability} = {value!r}"
        reason = cls.why_not.get(capability)
        if value:
            assert reason is None, f"{name} declares {capability} and a reason it is not: {reason!r}"
        else:
            assert isinstance(reason, str) and reason.strip(), f"{name}: no reason for {capability} = False"
    assert set(cls.why_not) <= set(base.capabilities), f"{name}.why_not names no capability: {cls.why_not}"


@pytest.mark.parametrize("name", PREDICTORS)
def test_predictor_declarations_match_its_methods(name):
    cls = PREDICTORS[name]
    assert declared_below(cls, Predictor, "learns_online") or not overrides(cls, Predictor, "feedback"), name
    assert cls.learns_online == overrides(cls, Predictor, "feedback"), f"{name}: learns_online vs feedback"
    assert cls.observes_prefill == overrides(cls, Predictor, "after_prefill"), f"{name}: observes_prefill"
    assert not cls.observes_prefill or cls.stage == "arrival", f"{name}: only an arrival-stage predictor observes"
    # a router's estimate exists before any engine holds the request and does not depend on one's queue
    assert not cls.scores_at_arrival or (cls.stage == "arrival" and not cls.queue_aware
                                         and cls.output == "length"), name


@pytest.mark.parametrize("name", POLICIES)
def test_policy_declarations_match_its_forms(name):
    cls = POLICIES[name]
    policy = cls(slos={"ttft": 500.0}) if cls.needs_slo else cls()   # edf is built from the run's SLOs
    assert cls.compiled == (policy.compiled_form() is not None), f"{name}: compiled vs compiled_form()"


# ----------------------------------------------------------------------------- the declaration decides
WORKLOAD = trace_from_arrays("capabilities", [20] * 40, list(range(1, 41)))
ARRIVAL = np.arange(40) * 0.01
CONFIG = EngineConfig(max_resident=16, decode_slots=4)


class NotCompiledOracle(Oracle):
    name = "not-compiled-oracle"
    compiled = False
    why_not = {"compiled": "a toy that says so"}


# numba's presence by its spec, not by loading the kernel at collection: a loaded numba trips vLLM
# 0.32's dispatcher scan in a vLLM engine started later in the same process (tests/test_compiled.py)
@pytest.mark.skipif(importlib.util.find_spec("numba") is None,
                    reason="numba is not installed (extra `fast`): nothing is compiled")
def test_a_predictor_declaring_compiled_runs_compiled_and_one_declaring_not_gets_the_note(capsys):
    from test_compiled import assert_identical

    for predictor_class, note in ((Oracle, None), (NotCompiledOracle, "a toy that says so")):
        sim = Simulation(WORKLOAD, ARRIVAL, policy=POLICIES["countdown"](), predictor=predictor_class(),
                         profile=UnitProfile(), config=CONFIG)
        assert (unsupported(sim) is None) == (note is None)
        note_fallback.cache_clear()
        runs = [run_simulation(Simulation(WORKLOAD, ARRIVAL, policy=POLICIES["countdown"](),
                                          predictor=predictor_class(), profile=UnitProfile(), config=CONFIG), kernel)
                for kernel in ("reference", "compiled")]
        err = capsys.readouterr().err
        if note is None:
            assert "--kernel compiled" not in err, err
        else:
            assert f"--kernel compiled: predictor 'not-compiled-oracle' is not compiled: {note}" in err, err
        assert_identical(*runs)


def test_a_policy_that_is_not_live_is_refused_live_with_its_reason():
    from live.common import LiveConfigError
    from live.config import LIVE_POLICIES, LiveSchedulerConfig

    not_live = [name for name, cls in POLICIES.items() if not cls.live]
    assert not_live and set(LIVE_POLICIES) == set(POLICIES) - set(not_live)
    for name in not_live:
        with pytest.raises(LiveConfigError) as err:
            LiveSchedulerConfig(policy=name, predictor="none")
        assert POLICIES[name].why_not["live"] in str(err.value) and "\n" not in str(err.value)
