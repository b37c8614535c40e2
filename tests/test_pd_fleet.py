"""Prefill/decode fleets (docs/semantics.md "Prefill/decode disaggregation"): the hand-worked
example, decode placement by the decode routers, and invariants on random workloads (hypothesis):
every request prefilled once on one prefill instance and decoded on exactly one decode instance,
the transfer's time, the order of a request's events, blocks never over-committed."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.hardware import DEFAULT_HARDWARE, QWEN3_8B
from core.trace import load_trace, trace_from_arrays
from policies import make_policy
from predictors import make_predictor
from routers import DECODE_ROUTERS, make_router
from simulator.engine import EngineConfig
from simulator.pd_fleet import PDFleet
from simulator.pd_link import KVLink
from simulator.pd_view import _requests
from simulator.profiles import make_profile
from tests.test_fleet_cli import EXAMPLE

# a 10-token prompt's KV (10 x 147,456 B x 8 bits) in 0.5 s, plus 500 ms: 1.0 s per transfer
HAND_LINK = KVLink(gbps=0.02359296, latency_ms=500.0)
HAND = EngineConfig(decode_slots=1, wait_cap=0)


class CheckedPDFleet(PDFleet):
    """Before each decode placement, the decode accounting (kept at each event) equals a recount of
    every decode instance's requests from the fleet's queues and the instances' tables."""

    def _place_decode(self, row: int, now: float) -> None:
        for i in range(self.decode_replicas):
            prompt, generated, estimate, length = _requests(self, i)
            assert self.decode_accounting.outstanding[i] == len(prompt)
            assert self.decode_accounting.true_work[i] == int(np.maximum(length - generated, 1).sum())
            assert self.decode_accounting.predicted_work[i] == pytest.approx(
                float(np.maximum(estimate - generated, 1.0).sum()))
        super()._place_decode(row, now)


def _pd(workload, arrival, *, prefill=1, decode=2, router="round-robin", decode_router="round-robin",
        policy="fcfs", predictor="none", config=HAND, link=HAND_LINK, profile=None):
    profile = profile if profile is not None else make_profile("unit", workload)
    return CheckedPDFleet(workload, np.asarray(arrival, dtype=np.float64), prefill_replicas=prefill, decode_replicas=decode,
                   router=make_router(router), decode_router=make_router(decode_router), link=link,
                   make_policy=lambda: make_policy(policy),
                   make_predictor=lambda: None if predictor == "none" else make_predictor(predictor),
                   profile=profile, config=config, charge_cost=False)


def test_link_time_is_the_prompts_kv_bytes_over_the_link_plus_its_latency():
    assert QWEN3_8B.kv_bytes_per_token == 36 * 8 * 128 * 2 * 2 == 147_456
    assert HAND_LINK.seconds(10, DEFAULT_HARDWARE) == pytest.approx(1.0, abs=1e-12)
    assert KVLink(400.0, 0.0).seconds(1000, DEFAULT_HARDWARE) == pytest.approx(1000 * 147_456 * 8 / 400e9)


def test_hand_example_round_robin_fcfs():
    """docs/semantics.md: one prefill instance prefills all eight at t = 1; transfers land at 2; each
    decode instance recomputes the last prompt token of its four (first tokens at 3), then decodes."""
    workload = load_trace(str(EXAMPLE))
    result = _pd(workload, np.zeros(8)).run()
    stages = result.stages
    assert stages is not None
    assert stages["decode_replica"].tolist() == [0, 1, 0, 1, 0, 1, 0, 1]
    assert stages["prefill_done_s"].tolist() == [1.0] * 8
    np.testing.assert_allclose(stages["transfer_end_s"], 2.0, atol=1e-12)
    np.testing.assert_allclose(result.first_token_s, 3.0, atol=1e-12)
    np.testing.assert_allclose(result.finish_s, [7, 5, 14, 3, 17, 6, 23, 11], atol=1e-12)


def test_hand_example_oracle_work_countdown():
    """Placement by true work at t = 1 (all eight, row order) as in "Fleets"; then oracle countdown."""
    workload = load_trace(str(EXAMPLE))
    result = _pd(workload, np.zeros(8), decode_router="oracle-work", policy="countdown", predictor="oracle").run()
    assert result.stages is not None
    assert result.stages["decode_replica"].tolist() == [0, 1, 1, 0, 0, 0, 1, 0]
    np.testing.assert_allclose(result.finish_s, [11, 5, 18, 3, 7, 4, 11, 16], atol=1e-12)


@pytest.mark.parametrize("router,predictor", [("oracle-kv", "none"), ("least-predicted-kv", "oracle")])
def test_kv_footprint_placement_by_hand(router, predictor):
    """Footprint = ceil((prompt + length) / 16) x length: 5, 3, 16, 1, 4, 2, 14, 6 for rows 0-7."""
    workload = load_trace(str(EXAMPLE))
    result = _pd(workload, np.zeros(8), decode_router=router, predictor=predictor,
                 policy="countdown" if predictor != "none" else "fcfs").run()
    assert result.stages is not None
    assert result.stages["decode_replica"].tolist() == [0, 1, 1, 0, 0, 0, 0, 1]


def test_least_kv_waits_for_blocks_and_places_on_the_freest():
    """Every instance holds 2 blocks of 16 tokens; a 10-token prompt takes 1. The prefill instance
    prefills two prompts a step (done at 1, 1, 2, 2, 3, 3, 4, 4). At t = 1 rows 0, 1 go to decode
    instances 0, 1 (claimed blocks [0, 0], then [1, 0]); at t = 2, before rows 0 and 1 land, row 2
    sees [1, 1] -> 0 and row 3 [2, 1] -> 1: both instances are then full, so later transfers wait."""
    workload = load_trace(str(EXAMPLE))
    config = EngineConfig(decode_slots=1, wait_cap=0, kv_blocks=2)
    result = _pd(workload, np.zeros(8), decode_router="least-kv", config=config).run()
    s = result.stages
    assert s is not None and result.preemptions is not None
    assert s["prefill_done_s"].tolist() == [1, 1, 2, 2, 3, 3, 4, 4]
    assert s["decode_replica"].tolist()[:4] == [0, 1, 0, 1]
    assert s["transfer_start_s"].tolist()[:4] == [1, 1, 2, 2] and s["transfer_end_s"].tolist()[:4] == [2, 2, 3, 3]
    assert result.first_token_s.tolist()[:4] == [3, 3, 4, 4]
    assert (s["transfer_start_s"][4:] > s["decode_placed_s"][4:]).all()   # waited for blocks
    assert np.isfinite(result.finish_s).all()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.tuples(st.integers(0, 4), st.integers(1, 40), st.integers(1, 12)), min_size=1, max_size=16),
       prefill=st.integers(1, 3), decode=st.integers(1, 3), blocks=st.sampled_from([None, 4, 9]),
       decode_router=st.sampled_from(sorted(r for r, c in DECODE_ROUTERS.items() if c.reads not in
                                            ("predicted_work", "predicted_kv"))),
       gbps=st.sampled_from([0.01, 1.0, 400.0]), latency=st.sampled_from([0.0, 250.0]))
def test_invariants(rows, prefill, decode, blocks, decode_router, gbps, latency):
    gaps, prompts, outputs = (np.array(x) for x in zip(*rows))
    arrival = np.cumsum(gaps).astype(np.float64)
    workload = trace_from_arrays("toy", prompts, outputs)
    config = EngineConfig(max_resident=3, decode_slots=2, prefill_token_budget=64, wait_cap=0, kv_blocks=blocks,
                          kv_block_size=16)
    link = KVLink(gbps, latency)
    fleet = _pd(workload, arrival, prefill=prefill, decode=decode, decode_router=decode_router, config=config,
                link=link)
    result = fleet.run()
    s = result.stages
    assert s is not None
    n = len(workload)
    # prefilled once, on one prefill instance; decoded on exactly one decode instance
    assert ((0 <= s["prefill_replica"]) & (s["prefill_replica"] < prefill)).all()
    assert ((0 <= s["decode_replica"]) & (s["decode_replica"] < decode)).all()
    assert sum(f.routed for f in fleet.fleet) == n and sum(d.routed for d in fleet.decoders) == n
    held = np.concatenate([d.rows[:d.routed] for d in fleet.decoders])
    assert sorted(held.tolist()) == list(range(n))
    for d in fleet.decoders:
        assert (s["decode_replica"][d.rows[:d.routed]] == d.index).all()
    # the order of a request's events, and the transfer's time
    assert (result.admit_s >= result.arrival_s).all()
    assert (s["prefill_done_s"] >= result.admit_s + 1.0).all()        # unit steps
    np.testing.assert_array_equal(s["decode_placed_s"], s["prefill_done_s"])
    assert (s["transfer_start_s"] >= s["decode_placed_s"]).all()
    expected = np.array([link.seconds(int(p), DEFAULT_HARDWARE) for p in result.prompt_tokens])
    np.testing.assert_allclose(s["transfer_end_s"] - s["transfer_start_s"], expected, rtol=1e-9)
    assert (result.first_token_s >= s["transfer_end_s"] + 1.0).all()   # a decode step recomputes one token
    assert (result.finish_s >= result.first_token_s + (result.output_tokens - 1)).all()
    if blocks is None:   # unbounded KV: a transfer starts at its placement
        np.testing.assert_array_equal(s["transfer_start_s"], s["decode_placed_s"])
    for d in fleet.decoders:   # every block given back
        kv = d.parts.scheduler.kv
        assert kv is None or kv.used == 0
    # the decode router's counters (routers/snapshot.py), kept at each event, end at zero
    accounting = fleet.decode_accounting
    assert (accounting.outstanding == 0).all() and (accounting.running == 0).all()
    assert (accounting.true_work == 0).all() and (accounting.predicted_work == 0).all()


def test_same_seed_same_run_on_sharegpt():
    trace = load_trace("sharegpt")
    workload = trace.take(np.arange(150))
    arrival = np.sort(np.random.default_rng(0).uniform(0, 3, 150))
    profile = make_profile("qwen3-8b-h100", trace)
    runs = [_pd(workload, arrival, prefill=1, decode=2, decode_router="least-predicted-kv", policy="countdown",
                predictor="leap-rls", config=EngineConfig(), link=KVLink(), profile=profile).run()
            for _ in range(2)]
    np.testing.assert_array_equal(runs[0].finish_s, runs[1].finish_s)
    assert runs[0].stages is not None and runs[1].stages is not None
    np.testing.assert_array_equal(runs[0].stages["decode_replica"], runs[1].stages["decode_replica"])
    assert runs[0].updates_published > 0   # the prefill instances learn from the decode instances' ends
