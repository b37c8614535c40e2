"""KV blocks and preemption by recompute (docs/semantics.md "KV blocks"): the engine against the
independent reference (tests/reference_sim.py) on hypothesis cases, the block invariants, the
hand-checked two-request example, and the CLI on real requests."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.trace import load_trace, trace_from_arrays
from experiments.cli import main
from policies import make_policy
from predictors.oracle import Oracle
from simulator import scheduler as scheduler_module
from simulator.engine import EngineConfig, Simulation
from simulator.profiles.unit import UnitProfile
from simulator.requests import RequestTable

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_invariants import (  # noqa: E402
    AGREEMENT_SETTINGS,
    INVARIANT_SETTINGS,
    assert_agrees,
    cases,
    check_causality,
    check_limits,
    check_monotone_clock,
    engine_predictions,
    run_engine,
    run_reference,
    to_caller_order,
    vllm_cases,
)

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "kv-two-requests.csv"


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def least_blocks(prompt, output, size) -> int:
    """The fewest blocks the engine accepts: every request alone, prompt and all but its last token."""
    return max(-(-(p + o - 1) // size) for p, o in zip(prompt, output))


@st.composite
def kv_block_cases(draw):
    """``cases`` or ``vllm_cases`` with a KV cache from the least the engine accepts to a little more,
    so that preemptions are frequent."""
    case = draw(st.one_of(cases(), vllm_cases()))
    case.block_size = draw(st.sampled_from([1, 2, 4, 16]))
    case.kv_blocks = least_blocks(case.prompt, case.output, case.block_size) + draw(st.integers(0, 6))
    return case


class BlockAudit:
    """After every step: the blocks held equal, row by row, what the rule says each request holds
    (resident: ceil((prompt + generated - 1) / size); part-prefilled: its whole prefill's), and
    never more than the total."""

    def __init__(self, monkeypatch):
        self.schedulers, self.steps, self.most = [], 0, 0
        original_init, original_retire = scheduler_module.Scheduler.__init__, RequestTable.retire
        audit = self

        def init(sched, *args, **kwargs):
            original_init(sched, *args, **kwargs)
            audit.schedulers.append(sched)

        def retire(table, *args, **kwargs):
            original_retire(table, *args, **kwargs)
            audit.check(table)

        monkeypatch.setattr(scheduler_module.Scheduler, "__init__", init)
        monkeypatch.setattr(RequestTable, "retire", retire)

    def check(self, table) -> None:
        kv = self.schedulers[-1].kv
        size = kv.size
        expect = np.zeros(table.n, dtype=np.int64)
        res = table.resident
        expect[res] = -(-(table.prompt[res] + table.generated[res] - 1) // size)
        if table.partial >= 0:
            expect[table.partial] = -(-table.fill[table.partial] // size)
        assert np.array_equal(kv.held, expect), "blocks held differ from the rule"
        used = kv.total - kv.free   # distinct blocks held; shared ones (prefix caching) count once
        assert used == int(expect.sum()) <= kv.total, f"{used} blocks held of {kv.total}"
        self.most = max(self.most, used)
        self.steps += 1


@AGREEMENT_SETTINGS
@given(kv_block_cases())
def test_engine_agrees_with_reference_under_kv_blocks(case):
    """Exact agreement with KV blocks: per-request times, forced steps, every step's composition and
    each request's preemptions; limits, causality and the monotone clock hold."""
    result = run_engine(case)
    ref = run_reference(case, engine_predictions(case, result))
    assert_agrees(result, ref)
    assert to_caller_order(result, result.preemptions.tolist()) == ref["preemptions"]
    for check in (check_limits, check_causality, check_monotone_clock):
        check(result, case.config)


@INVARIANT_SETTINGS
@given(kv_block_cases())
def test_invariant_blocks_held_never_exceed_the_total(case):
    """Blocks held match the rule row by row after every step and never exceed the total; every
    request finishes with its recorded length (invariant 12)."""
    with pytest.MonkeyPatch.context() as mp:
        audit = BlockAudit(mp)
        result = run_engine(case)
    assert audit.steps == result.steps and audit.most <= case.kv_blocks
    assert np.isfinite(result.finish_s).all()


def test_preemption_happens_in_the_generated_cases():
    """The cases above are not vacuous: small caches preempt, and the reference agrees on them."""
    seen = []

    @INVARIANT_SETTINGS
    @given(kv_block_cases())
    def count(case):
        seen.append(int(run_engine(case).preemptions.sum()))

    count()
    assert sum(x > 0 for x in seen) >= len(seen) // 4, seen


def run_example(policy: str, predictor=None, blocks: int = 4):
    wl = trace_from_arrays("two", [4, 4], [8, 6])
    return Simulation(wl, np.zeros(2), policy=make_policy(policy), predictor=predictor, profile=UnitProfile(),
                      config=EngineConfig(decode_slots=2, wait_cap=0, kv_blocks=blocks, kv_block_size=4),
                      record_steps=True).run()


class RecordingUnit(UnitProfile):
    def __init__(self):
        self.prefills = []

    def step_time(self, prefill_tokens, prefill_sq, decode_batch, decode_context):
        self.prefills.append(prefill_tokens)
        return 1.0


def test_two_requests_worked_out_by_hand():
    """docs/semantics.md "KV blocks": 4 blocks of 4 tokens, prompts of 4, outputs 8 and 6. Both
    need a third block at step 5: FCFS preempts row 1 (the last row), countdown row 0 (the most
    remaining); the victim is prefilled again with its 5 generated tokens (9 tokens) once it fits."""
    fcfs = run_example("fcfs")
    assert fcfs.finish_s.tolist() == [8.0, 9.0] and fcfs.preemptions.tolist() == [0, 1]
    countdown = run_example("countdown", Oracle())
    assert countdown.finish_s.tolist() == [9.0, 6.0] and countdown.preemptions.tolist() == [1, 0]
    # admission and first token are kept: a re-prefill is neither
    assert countdown.admit_s.tolist() == [0.0, 0.0] and countdown.first_token_s.tolist() == [1.0, 1.0]
    wl = trace_from_arrays("two", [4, 4], [8, 6])
    # step 6 re-prefills row 0's 4 + 5 tokens; with the prefix cache (docs/semantics.md "Prefix
    # caching") its first block is still cached (row 1's decode at step 5 took its second): 5 tokens
    for caching, tokens in ((False, 9), (True, 5)):
        profile = RecordingUnit()
        Simulation(wl, np.zeros(2), policy=make_policy("countdown"), predictor=Oracle(), profile=profile,
                   config=EngineConfig(decode_slots=2, wait_cap=0, kv_blocks=4, kv_block_size=4,
                                       prefix_caching=caching)).run()
        assert profile.prefills == [8, 0, 0, 0, 0, 0, tokens, 0, 0]
    unbounded = Simulation(wl, np.zeros(2), policy=make_policy("fcfs"), predictor=None, profile=UnitProfile(),
                           config=EngineConfig(decode_slots=2, wait_cap=0)).run()
    assert unbounded.finish_s.tolist() == [8.0, 6.0] and unbounded.preemptions is None
    # the one preempting step is the only one in which the policy chose (two residents, two slots)
    assert (fcfs.contended_steps, countdown.contended_steps, unbounded.contended_steps) == (1, 1, 0)


def test_victim_is_the_policys_last():
    """Three residents that all need a block at once with none free: the victim is the policy's last
    (FCFS: the last row; countdown: the most remaining), not the first to ask."""
    wl = trace_from_arrays("three", [4, 4, 4], [9, 7, 8])
    config = EngineConfig(decode_slots=3, wait_cap=0, kv_blocks=6, kv_block_size=4)
    fcfs = Simulation(wl, np.zeros(3), policy=make_policy("fcfs"), predictor=None, profile=UnitProfile(),
                      config=config).run()
    assert fcfs.preemptions.tolist()[2] >= 1 and fcfs.preemptions.tolist()[0] == 0
    countdown = Simulation(wl, np.zeros(3), policy=make_policy("countdown"), predictor=Oracle(),
                           profile=UnitProfile(), config=config).run()
    assert countdown.preemptions.tolist()[0] >= 1 and countdown.preemptions.tolist()[1] == 0


def test_hand_example_on_the_command_line(tmp_path, capsys):
    assert main(["--trace", str(EXAMPLE), "--engine", "unit", "--arrivals", "recorded", "--kv-blocks", "4",
                 "--block-size", "4", "--decode-slots", "2", "--wait-cap", "0", "--predictor", "none,oracle",
                 "--kernel", "compiled", "--quiet", "--jobs", "1", "--out", str(tmp_path)]) == 0
    assert "uses the reference engine" not in capsys.readouterr().err   # prefix caching on, compiled
    runs = {run: pq.read_table(tmp_path / f"{run}-recorded-seed0" / "requests.parquet").to_pydict()
            for run in ("none-fcfs", "oracle-countdown")}
    assert runs["none-fcfs"]["finish_s"] == [8.0, 9.0] and runs["none-fcfs"]["preemptions"] == [0, 1]
    assert runs["oracle-countdown"]["finish_s"] == [9.0, 6.0] and runs["oracle-countdown"]["preemptions"] == [1, 0]
    summary = json.loads((tmp_path / "none-fcfs-recorded-seed0" / "summary.json").read_text())
    assert summary["preemptions"] == 1 and summary["requests_preempted"] == 1
    config = json.loads((tmp_path / "none-fcfs-recorded-seed0" / "config.json").read_text())
    assert config["engine_config"]["kv_blocks"] == 4 and config["kv_blocks_used"] == 4


def test_sharegpt_with_a_small_cache_end_to_end(tmp_path, capsys):
    """CLI on 200 real requests at 1.5x with a cache of 400 blocks: preemptions happen, every request
    finishes, each request's preemptions are written, the total is in the summary."""
    out = tmp_path / "o"
    assert main(["--trace", "sharegpt", "--requests", "200", "--load", "1.5x", "--predictor", "none",
                 "--kv-blocks", "400", "--quiet", "--jobs", "1", "--json", "--out", str(out)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    table = pq.read_table(out / "requests.parquet").to_pydict()
    assert summary["completed"] == 200 and summary["preemptions"] == sum(table["preemptions"]) > 0
    assert summary["requests_preempted"] == sum(p > 0 for p in table["preemptions"])


def test_a_cache_smaller_than_a_prompt_is_refused_before_any_work(tmp_path, capsys):
    trace = load_trace("sharegpt")
    longest = int(np.argmax(trace.prompt_tokens[:50]))
    out = tmp_path / "o"
    assert main(["--trace", "sharegpt", "--requests", "50", "--predictor", "none", "--kv-blocks", "2",
                 "--quiet", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--kv-blocks 2" in err[0] and f"(row {longest})" in err[0]
    assert not out.exists()


@pytest.mark.parametrize(("flags", "names"), [
    (["--kv-blocks", "0"], "--kv-blocks"),
    (["--kv-blocks", "lots"], "--kv-blocks"),
    (["--block-size", "0"], "--block-size"),
    (["--kv-blocks", "5000", "--kv-budget", "100000"], "kv-blocks and kv-budget"),
])
def test_bad_kv_flags_are_one_line_exit_2(tmp_path, capsys, flags, names):
    out = tmp_path / "o"
    assert main(["--trace", "sharegpt", "--requests", "20", "--predictor", "none", *flags, "--quiet",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and names in err[0] and "Traceback" not in err[0]
    assert not out.exists()


def test_profile_blocks_come_from_the_gpu_memory():
    """qwen3-8b on an H100 (80 GiB): 0.9 of it less 16.4 GB of weights, at 147,456 bytes per token
    (36 layers x 8 KV heads x 128 x 2 (K and V) x 2 bytes), in blocks of 16 tokens."""
    from core.hardware import H100, QWEN3_8B, Hardware, kv_blocks_in_memory
    weights = (QWEN3_8B.body_params + 2 * QWEN3_8B.head_params) * 2
    assert QWEN3_8B.kv_bytes_per_token == 147_456
    assert kv_blocks_in_memory(Hardware(QWEN3_8B, H100), 16) == (int(0.9 * 80 * 2**30) - weights) // (147_456 * 16)
    assert kv_blocks_in_memory(Hardware(QWEN3_8B, H100), 16) == 25_824


def test_kv_blocks_profile_on_the_command_line(tmp_path, capsys):
    """``--kv-blocks profile`` resolves to the profile's blocks (the unit profile charges the default
    hardware), records them in config.json, and such a roomy cache preempts nothing."""
    out = tmp_path / "o"
    assert main(["--trace", str(EXAMPLE), "--engine", "unit", "--arrivals", "recorded", "--kv-blocks", "profile",
                 "--decode-slots", "2", "--wait-cap", "0", "--predictor", "none", "--quiet", "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["engine_config"]["kv_blocks"] == "profile" and config["kv_blocks_used"] == 25_824
    assert pq.read_table(out / "requests.parquet").column("finish_s").to_pylist() == [8.0, 6.0]
    again = tmp_path / "again"
    assert main(["--config", str(out / "config.json"), "--quiet", "--out", str(again)]) == 0   # reruns as it was
    assert (again / "requests.parquet").read_bytes() == (out / "requests.parquet").read_bytes()
