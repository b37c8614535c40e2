"""leap_sched.vllm.metrics by hand, without a server: what is observed, when, and the gauge's sum.
(The same series read over HTTP from a real server: tests/test_serve_metrics.py.)"""

from __future__ import annotations

import math
from collections import deque
from types import SimpleNamespace as NS

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client import REGISTRY  # noqa: E402

from leap_sched.vllm.metrics import (  # noqa: E402
    ESTIMATE_HISTOGRAM,
    OUTSTANDING_GAUGE,
    EstimateMetrics,
    pending_estimate,
    tokens_left,
)


def _config(name: str):
    return NS(model_config=NS(served_model_name=name), parallel_config=NS(data_parallel_rank=0))


def _value(name: str, model: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"model_name": model, "engine": "0"})


def _req(rid: str, generated: int, status: str = "RUNNING"):
    return NS(request_id=rid, num_output_tokens=generated, status=NS(name=status))


def test_hand_example():
    model = "hand-example"
    m = EstimateMetrics(_config(model))
    a, b, c = _req("a", 3), _req("b", 1), _req("c", 0)
    held = {"a": NS(first_predicted=50.0, predicted=40.0),          # re-scored since: the newest is 40
            "b": NS(first_predicted=math.nan, predicted=7.0),        # estimate still in the channel; 7 = prior
            "c": NS(first_predicted=math.nan, predicted=7.0)}        # still in prefill
    sched = NS(running=[a, b, c], _leap_req=held, requests={"a": a, "b": b, "c": c},
               leap_channel=NS(pending=deque([(["x", "b"], [5.0, 20.0], None)])))
    m.after_step(sched)
    # observed: a (50) and b (20, from the channel); the gauge: (40 - 3) + (20 - 1) = 56
    assert _value(ESTIMATE_HISTOGRAM + "_count", model) == 2
    assert _value(ESTIMATE_HISTOGRAM + "_sum", model) == 70
    assert _value(OUTSTANDING_GAUGE, model) == 56
    m.after_step(sched)                                               # once per request
    assert _value(ESTIMATE_HISTOGRAM + "_count", model) == 2
    # b finishes: its estimate for the response; not observed twice; the gauge drops it
    b.status.name = "FINISHED_LENGTH_CAPPED"
    assert m.finished(sched, b) == 20.0
    del held["b"], sched.requests["b"]
    m.set_gauge(sched)
    assert _value(ESTIMATE_HISTOGRAM + "_count", model) == 2 and _value(OUTSTANDING_GAUGE, model) == 37


def test_a_request_freed_in_its_prefill_step_is_observed_once_and_an_aborted_one_not():
    model = "prefill-only"
    m = EstimateMetrics(_config(model))
    p, q = _req("p", 1, "FINISHED_LENGTH_CAPPED"), _req("q", 1, "FINISHED_ABORTED")
    held = {"p": NS(first_predicted=math.nan, predicted=7.0), "q": NS(first_predicted=math.nan, predicted=7.0)}
    sched = NS(running=[], _leap_req=held, requests={},
               leap_channel=NS(pending=deque([(["p", "q"], [12.0, 30.0], None)])))
    assert m.finished(sched, p) == 12.0 and m.finished(sched, q) == 30.0
    assert _value(ESTIMATE_HISTOGRAM + "_count", model) == 1
    m.set_gauge(sched)
    assert _value(OUTSTANDING_GAUGE, model) == 0


def test_tokens_left_and_no_estimate():
    assert tokens_left(10.0, 4) == 6.0 and tokens_left(3.0, 9) == 0.0
    assert math.isnan(pending_estimate(NS(pending=deque()), "r"))
    assert math.isnan(pending_estimate(NS(), "r"))
