"""KV blocks in the compiled kernel (docs/semantics.md "KV blocks", no prefix caching): byte for
byte the reference's outputs, each request's preemptions and the summary's counts, under every
compiled policy, the unit, fitted and roofline profiles, chunked prefill and the step clock's
neighbours (closed loop), on hypothesis workloads with caches small enough to preempt often and on
sharegpt with a small cache (prefix caching off; on: tests/test_compiled_prefix.py). A policy that
reads the cached tokens falls back to the reference with prefix caching on and the note says why.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

if importlib.util.find_spec("numba") is None:
    pytest.skip("numba is not installed (extra `fast`): the compiled kernel falls back", allow_module_level=True)

from core.trace import load_trace, trace_from_arrays  # noqa: E402
from experiments.cli import main  # noqa: E402
from policies import POLICIES, make_policy  # noqa: E402
from simulator.compiled import note_fallback, unsupported  # noqa: E402
from simulator.engine import EngineConfig, Simulation  # noqa: E402
from simulator.profiles import make_profile  # noqa: E402
from simulator.profiles.unit import UnitProfile  # noqa: E402
from simulator.runner import RunConfig, run_simulation  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from invariant_cases import HYPO, Case, cases, make_predictor_for, vllm_cases  # noqa: E402
from reference_prefix import with_prefix_hashes  # noqa: E402
from test_compiled import PrefillStage, QueueAwareCharged, assert_identical, replay_both  # noqa: E402
from test_kv_blocks import least_blocks  # noqa: E402

SLOS = (("ttft", 500.0), ("tpot", 50.0))
#: every policy the kernel compiles (its declaration), so a new one is held to KV identity too
COMPILED = tuple(name for name, cls in POLICIES.items() if cls.compiled)


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


@st.composite
def kv_cases(draw, predictors=None, policies=COMPILED):
    """Workloads (same-instant arrivals included) over every compiled policy (or ``policies``), with
    a cache from the least the engine accepts to a little more: preemptions are frequent."""
    case = draw(st.one_of(cases(policies=policies, predictors=predictors),
                          vllm_cases(policies=policies, predictors=predictors)))
    case.block_size = draw(st.sampled_from([1, 2, 4, 16]))
    case.kv_blocks = least_blocks(case.prompt, case.output, case.block_size) + draw(st.integers(0, 6))
    case.prefix_caching = False
    return case


PROFILES = {"unit": UnitProfile, "fitted": functools.cache(lambda: make_profile("fitted", load_trace("sharegpt"))),
            "roofline": functools.cache(lambda: make_profile("qwen3-8b-h100"))}


def simulate(case, kernel: str, profile: str, predictor=None):
    wl = trace_from_arrays("hypo", case.prompt, case.output)
    if case.prefix is not None:   # prefix caching's block keys (tests/test_compiled_prefix.py)
        wl = with_prefix_hashes(wl, case.prefix, case.block_size)
    sim = Simulation(wl, np.asarray(case.arrival, dtype=np.float64), policy=make_policy(case.policy, slos=SLOS),
                     predictor=predictor or make_predictor_for(case), profile=PROFILES[profile](),
                     config=case.config, seed=case.seed, closed_loop=case.closed_loop)
    assert kernel == "reference" or unsupported(sim) is None   # the kernel really ran
    try:
        return run_simulation(sim, kernel)
    except Exception as exc:   # the same refusal (a stall) from both
        return repr(exc)


def assert_same(ref, comp) -> None:
    if isinstance(ref, str) or isinstance(comp, str):
        assert ref == comp
        return
    assert_identical(ref, comp)
    assert ref.preemptions.tobytes() == comp.preemptions.tobytes()


@settings(max_examples=100, **HYPO)
@given(kv_cases(), st.sampled_from(sorted(PROFILES)))
def test_compiled_matches_reference_with_kv_blocks(case, profile):
    assert_same(simulate(case, "reference", profile), simulate(case, "compiled", profile))


@settings(max_examples=40, **HYPO)
@given(kv_cases(predictors=("fixed",)), st.booleans())
def test_compiled_kv_blocks_with_python_and_prefill_stage_predictors(case, prefill):
    """Estimates made in Python at arrival, or after a prefill (often after its step: an event
    between steps, which sees the residents as they were, re-prefills not yet back)."""
    def make():
        return PrefillStage(case.fixed, [0.0, 0.3, 1.7][case.seed % 3], [1.0, 0.5][case.seed % 2]) if prefill \
            else QueueAwareCharged(case.fixed, "rank" if case.seed % 2 else "length")
    if not prefill and case.seed % 2 and not make_policy(case.policy, slos=SLOS).compiled_form().rank_predictors:
        case.seed += 1   # this policy's compiled form takes no rank scores: length estimates
    assert_same(simulate(case, "reference", "unit", make()), simulate(case, "compiled", "unit", make()))


def test_an_estimate_published_after_its_row_was_preempted():
    """A prefill-stage estimate ready after its step ends fires when its row may be preempted
    already: the row gets the estimate but joins no order until its re-prefill completes (the
    kernel once put it among the residents; found by the test above)."""
    case = Case(prompt=[1, 1, 1, 1, 2, 3, 4], output=[5, 6, 7, 13, 9, 10, 11],
                arrival=[0.0, 0.0, 0.25, 0.5, 0.75, 1.0, 1.25], policy="countdown", predictor="fixed",
                fixed=[1.0] * 7, noise_mae=1.0, seed=200, step_time="unit", max_resident=3, decode_slots=2, budget=1,
                wait_cap=0, kv_blocks=14, block_size=1, prefix_caching=False)
    ref, comp = (simulate(case, kernel, "unit", PrefillStage(case.fixed, 1.7, 1.0)) for kernel in ("reference", "compiled"))
    assert_same(ref, comp)
    assert comp.preemptions.sum() > 0


def test_the_generated_cases_preempt():
    """The cases above are not vacuous: most preempt, in the compiled kernel too."""
    seen = []

    @settings(max_examples=40, **HYPO)
    @given(kv_cases())
    def count(case):
        result = simulate(case, "compiled", "unit")
        if not isinstance(result, str):
            seen.append(int(result.preemptions.sum()))

    count()
    assert sum(x > 0 for x in seen) >= len(seen) // 3, seen


@pytest.mark.parametrize("policy", COMPILED)
def test_sharegpt_with_a_small_cache_on_both_kernels(policy):
    """300 real requests at 1.5x, 600 blocks of 16 tokens: preemptions happen; the summaries
    (preemptions, requests_preempted, kv_blocks_used included) and results are identical."""
    predictor = "none" if not POLICIES[policy].uses_predictions else "oracle"
    config = EngineConfig(kv_blocks=600, prefix_caching=False)
    result = replay_both(RunConfig(trace="sharegpt", predictor=predictor, policy=policy, load=1.5, requests=300,
                                   engine_config=config, goodput=SLOS))
    assert result.preemptions.sum() > 0


def test_hand_example_runs_compiled_with_prefix_caching_off(tmp_path, capsys):
    """docs/semantics.md's two-request example: compiled (no fallback note) with ``--prefix-caching
    off``, the same finish times as the reference; with prefix caching on and a policy that reads
    the cached tokens the note names it."""
    example = Path(__file__).resolve().parents[1] / "docs" / "examples" / "kv-two-requests.csv"
    args = ["--trace", str(example), "--engine", "unit", "--arrivals", "recorded", "--kv-blocks", "4",
            "--block-size", "4", "--decode-slots", "2", "--wait-cap", "0", "--predictor", "none",
            "--quiet", "--jobs", "1", "--json"]
    finishes = {}
    for kernel in ("reference", "compiled"):
        assert main([*args, "--prefix-caching", "off", "--kernel", kernel, "--out", str(tmp_path / kernel)]) == 0
        captured = capsys.readouterr()
        assert "uses the reference engine" not in captured.err
        finishes[kernel] = json.loads(captured.out.strip().splitlines()[-1])
        finishes[kernel].pop("sim_cpu_s", None)
    assert finishes["reference"] == finishes["compiled"] and finishes["compiled"]["preemptions"] > 0
    note_fallback.cache_clear()   # said once per process: an earlier test may have said it already
    assert main([*args, "--kernel", "compiled", "--out", str(tmp_path / "cached")]) == 0
    assert "uses the reference engine" not in capsys.readouterr().err
    assert main([*args, "--kernel", "compiled", "--predictor", "oracle", "--policy", "countdown", "--setting",
                 "countdown.prefill_weight=1", "--out", str(tmp_path / "reads")]) == 0
    err = capsys.readouterr().err
    assert err.count("reads the cached prompt tokens") == 1 and "--prefix-caching off runs compiled" in err


def test_a_policy_reading_cached_tokens_is_the_only_kv_fallback():
    from predictors import make_predictor
    wl = trace_from_arrays("two", [4, 4], [8, 6])
    for policy, caching, reason in ((make_policy("countdown", [("prefill_weight", 1.0)]), None, "reads the cached prompt"),
                                    (make_policy("countdown", [("prefill_weight", 1.0)]), False, None),
                                    (make_policy("fcfs"), None, None)):
        sim = Simulation(wl, np.zeros(2), policy=policy, predictor=make_predictor("oracle"), profile=UnitProfile(),
                         config=dataclasses.replace(EngineConfig(kv_blocks=4, kv_block_size=4), prefix_caching=caching))
        why = unsupported(sim)
        assert why is None if reason is None else reason in why


@pytest.mark.parametrize("predictor", ["leap", "leap-rls", "trail", "ssjf", "egtp"])
def test_learned_predictors_with_kv_blocks_on_both_kernels(predictor):
    """The kernel's compiled stops for learned predictors (frozen estimates published in compiled
    code, TRAIL's probe and refreshes, LEAP+RLS's online estimates) with a cache that preempts."""
    from predictors import make_predictor
    trace = load_trace("lmsys")
    n = 48
    workload = trace.take(np.arange(n))
    blocks = least_blocks(workload.prompt_tokens.tolist(), workload.output_tokens.tolist(), 16) + 8
    config = EngineConfig(max_resident=24, decode_slots=4, prefill_token_budget=4096, wait_cap=16, kv_blocks=blocks,
                          prefix_caching=False)
    results = []
    for kernel in ("reference", "compiled"):
        sim = Simulation(workload, np.arange(n) * 0.05, policy=make_policy("countdown"),
                         predictor=make_predictor(predictor), profile=make_profile("qwen3-8b-h100", trace),
                         config=config, seed=1)
        assert kernel == "reference" or unsupported(sim) is None
        results.append(run_simulation(sim, kernel))
    assert_same(*results)
    assert results[1].preemptions.sum() > 0
