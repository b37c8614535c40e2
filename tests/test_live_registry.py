"""One declaration of the live predictors (``predictors.live.LIVE_PREDICTORS``): every simulator
predictor is either some live predictor's twin or refused live with a reason, every live name has a
live class, and the live config, scheduler and replay read their stage, hook and twin from it."""

from __future__ import annotations

import pytest

from experiments.validate_steps import TARGETS
from live.config import LiveConfigError, LiveSchedulerConfig
from live.predictors import LIVE_CLASSES
from predictors import NO_PREDICTOR, PREDICTORS
from predictors.live import ARRIVAL_PREDICTORS, LIVE_PREDICTORS, NOT_LIVE


def test_every_simulator_predictor_is_a_twin_or_refused_live_with_a_reason():
    twins = {form.twin for form in LIVE_PREDICTORS.values()} - {NO_PREDICTOR}
    assert twins <= set(PREDICTORS)
    assert set(NOT_LIVE) <= set(PREDICTORS)
    assert twins.isdisjoint(NOT_LIVE)
    assert twins | set(NOT_LIVE) == set(PREDICTORS), "a new predictor: a live twin, or a NOT_LIVE reason"


def test_every_live_name_has_one_live_class_of_that_name():
    assert set(LIVE_CLASSES) == set(LIVE_PREDICTORS)
    for name, cls in LIVE_CLASSES.items():
        assert cls.name == name


@pytest.mark.parametrize("name", list(LIVE_PREDICTORS))
def test_a_live_predictor_has_its_twins_stage(name):
    form = LIVE_PREDICTORS[name]
    expected = None if form.twin == NO_PREDICTOR else PREDICTORS[form.twin].stage
    assert form.stage == expected
    cls = LIVE_CLASSES[name]
    assert cls.__new__(cls).stage == expected   # what the live scheduler reads (built without its files)
    if form.needs_hook:   # the hook reads the prompt's last hidden state: an estimate at prefill
        assert form.stage == "prefill"


def test_the_stages_the_live_scheduler_orders_admission_by():
    assert ARRIVAL_PREDICTORS == ("oracle", "ssjf")
    assert [n for n, f in LIVE_PREDICTORS.items() if f.needs_hook] == ["leap", "leap-rls"]


def test_the_live_config_reads_the_hook_from_the_registry():
    for name in ("none", "oracle"):
        cfg = LiveSchedulerConfig(policy="fcfs" if name == "none" else "countdown", predictor=name)
        assert cfg.needs_hook is LIVE_PREDICTORS[name].needs_hook is False
    for name, reason in NOT_LIVE.items():
        with pytest.raises(LiveConfigError, match=reason.split(" (")[0]):
            LiveSchedulerConfig(predictor=name)


def test_the_step_clock_replays_a_subset_of_the_live_predictors():
    assert set(TARGETS) <= set(LIVE_PREDICTORS)


def test_every_live_predictor_serving_the_router_declares_its_live_routing_estimate():
    """A live fleet's least-work reads the forced length (an oracle), the prior (hidden-state
    predictors), or refuses the predictor by its declaration (one whose prompt-only estimate is the
    engine's: ssjf)."""
    got = {name: form.router_estimate for name, form in LIVE_PREDICTORS.items() if form.has_predictor}
    assert got == {"oracle": "length", "leap": "prior", "leap-rls": "prior", "ssjf": None}
    for name, form in LIVE_PREDICTORS.items():
        assert form.has_predictor == (name != NO_PREDICTOR)
        assert form.learns_online == (name == "leap-rls") and form.prompt_text == (name == "ssjf")
