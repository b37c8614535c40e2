"""Prefix caching over the KV blocks (docs/semantics.md "Prefix caching"): the engine against the
independent reference (tests/reference_sim.py with tests/reference_prefix.py) on hypothesis cases
with shared prefixes, the hand-checked three-request example on the command line, the block keys of
a trace's prefix hashes (docs/traces.md "Prefix hashes"), Mooncake's hash_ids and bad input."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.prefix_hashes import block_keys, chain, chain_ids, token_block_hashes
from core.trace import load_trace
from experiments.cli import main

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_invariants import (  # noqa: E402
    AGREEMENT_SETTINGS,
    assert_agrees,
    cases,
    engine_predictions,
    run_engine,
    run_reference,
    to_caller_order,
    vllm_cases,
)
from test_kv_blocks import least_blocks  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "prefix-three-requests.jsonl"


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


@st.composite
def prefix_cases(draw):
    """KV-block cases whose requests share prefixes: each request's prompt blocks start with one of
    three families' chains (to a drawn depth), its own keys after; caches from the least the engine
    accepts to a few blocks more, so that blocks are shared, evicted and preempted requests re-hit."""
    case = draw(st.one_of(cases(), vllm_cases()))
    case.block_size = draw(st.sampled_from([1, 2, 4]))
    case.kv_blocks = least_blocks(case.prompt, case.output, case.block_size) + draw(st.integers(0, 12))
    case.prefix = shared_prefixes(draw, case.prompt, case.block_size)
    return case


def shared_prefixes(draw, prompt, block_size) -> list[list[int]]:
    """Each prompt's block keys: one of three families' chains to a drawn depth, its own after."""
    prefix = []
    for i, p in enumerate(prompt):
        full = p // block_size
        family, depth = draw(st.integers(0, 2)), draw(st.integers(0, full))
        prefix.append([family * 1000 + j for j in range(depth)] + [10**6 + i * 1000 + j for j in range(depth, full)])
    return prefix


@AGREEMENT_SETTINGS
@given(prefix_cases())
def test_engine_agrees_with_reference_with_shared_prefixes(case):
    """Exact agreement with the prefix cache: per-request times, every step's composition, each
    request's preemptions and cached tokens."""
    result = run_engine(case)
    ref = run_reference(case, engine_predictions(case, result))
    assert_agrees(result, ref)
    assert to_caller_order(result, result.preemptions.tolist()) == ref["preemptions"]
    assert to_caller_order(result, result.cached_tokens.tolist()) == ref["cached_tokens"]


@AGREEMENT_SETTINGS
@given(prefix_cases())
def test_engine_agrees_with_reference_with_the_cache_off(case):
    case.prefix_caching = False
    result = run_engine(case)
    assert result.cached_tokens is None
    assert_agrees(result, run_reference(case, engine_predictions(case, result)))


def test_the_generated_cases_hit_the_cache():
    """The cases above are not vacuous: requests find cached tokens, and the reference agrees."""
    seen = []

    @AGREEMENT_SETTINGS
    @given(prefix_cases())
    def count(case):
        result = run_engine(case)
        seen.append(int(result.cached_tokens.sum()))

    count()
    assert sum(x > 0 for x in seen) >= len(seen) // 4, seen


def test_three_requests_worked_out_by_hand(tmp_path, capsys):
    """docs/semantics.md "Prefix caching": A (8 tokens, block 7) at t = 0; B (the same 8 tokens)
    and C (4 other tokens) at t = 2, budget 8. B finds A's first block (at most (8 - 1) // 4 blocks):
    4 cached tokens, so B's 4 and C's 4 fit one step; off, C waits a step. On the compiled kernel."""
    from simulator import compiled

    compiled.note_fallback.cache_clear()   # said once per process: an earlier test may have said it
    runs = {}
    for mode in ("on", "off"):
        out = tmp_path / mode
        assert main(["--trace", str(EXAMPLE), "--engine", "unit", "--arrivals", "recorded", "--kv-blocks", "8",
                     "--block-size", "4", "--prefill-budget", "8", "--predictor", "none", "--prefix-caching", mode,
                     "--kernel", "compiled", "--quiet", "--jobs", "1", "--out", str(out)]) == 0
        runs[mode] = (pq.read_table(out / "requests.parquet").to_pydict(),
                      json.loads((out / "summary.json").read_text()))
    err = capsys.readouterr().err   # both run compiled (simulator/kernel_prefix.py)
    assert "uses the reference engine" not in err, err
    on, summary = runs["on"]
    assert on["admit_s"] == [0.0, 2.0, 2.0] and on["finish_s"] == [2.0, 4.0, 4.0]
    assert on["cached_tokens"] == [0, 4, 0] and summary["prefix_hit_rate"] == 0.2
    off, summary = runs["off"]
    assert off["admit_s"] == [0.0, 2.0, 3.0] and off["finish_s"] == [2.0, 4.0, 5.0]
    assert "cached_tokens" not in off and "prefix_hit_rate" not in summary


def test_block_keys_at_other_block_sizes():
    """A 512-token block names its 512 / B sub-blocks (B = 16: 32 each), chained from its hash; a
    block of 2 native blocks is named by the second; only the prompt's full blocks are named."""
    a, b = np.asarray(chain_ids([1, 2])), np.asarray(chain_ids([1, 3]))
    ka, kb = block_keys(a, 512, 16, 1000), block_keys(b, 512, 16, 1000)
    assert len(ka) == 1000 // 16 and (ka[:32] == kb[:32]).all() and not (ka[32:] == kb[32:]).any()
    assert len(set(ka.tolist())) == len(ka)
    assert block_keys(a, 512, 1024, 1100).tolist() == [a[1]]
    assert block_keys(a, 512, 1024, 1000).tolist() == []
    assert block_keys(a, 16, 16, 40).tolist() == chain(a.astype(np.uint64), np.zeros(2, np.uint64)).tolist()
    # token ids: equal prefixes, equal hashes, up to the first differing block
    x, y = token_block_hashes(list(range(40)), 16), token_block_hashes(list(range(20)) + [7] * 20, 16)
    assert len(x) == 2 and x[0] == y[0] and x[1] != y[1]


def test_mooncake_hash_ids_are_read(tmp_path):
    trace = load_trace(EXAMPLE)
    assert trace.metadata["prefix_block_size"] == 512
    hashes = trace.table.column("prefix_hashes").to_pylist()
    assert hashes[0] == hashes[1] == chain_ids([7]) and hashes[2] == chain_ids([9])


def _run(tmp_path, trace, *flags):
    out = tmp_path / "o"
    code = main(["--trace", str(trace), "--arrivals", "recorded", "--predictor", "none", *flags, "--quiet",
                 "--out", str(out)])
    return code, out


@pytest.mark.parametrize(("record", "names"), [
    ('{"timestamp": 0, "input_length": 8, "output_length": 2, "hash_ids": [1, -2]}', "row 1: expected a list"),
    ('{"timestamp": 0, "input_length": 8, "output_length": 2, "hash_ids": "7"}', "row 1: expected a list"),
    ('{"timestamp": 0, "input_length": 8, "output_length": 2, "hash_ids": [true]}', "row 1: expected a list"),
    ('{"timestamp": 0, "input_length": 8, "output_length": 2, "hash_ids": []}', "row 1: empty"),
    ('{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [1, 2, 3]}', "row 1: 3 blocks"),
    ('{"timestamp": 0, "input_length": 8, "output_length": 2}', "row 1: expected a list"),
])
def test_bad_hash_ids_are_one_line_exit_2(tmp_path, capsys, record, names):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(EXAMPLE.read_text().splitlines()[0] + "\n" + record + "\n")
    code, out = _run(tmp_path, bad, "--kv-blocks", "100")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and str(bad) in err[0] and names in err[0], err
    assert not out.exists()


@pytest.mark.parametrize(("flags", "names"), [
    (["--prefix-caching", "on"], "--prefix-caching on"),
    (["--prefix-caching", "maybe", "--kv-blocks", "100"], "--prefix-caching"),
    (["--kv-blocks", "100", "--block-size", "24"], "--block-size 24"),
])
def test_bad_prefix_flags_are_one_line_exit_2(tmp_path, capsys, flags, names):
    code, out = _run(tmp_path, EXAMPLE, *flags)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and names in err[0], err
    assert not out.exists()


def test_capture_records_prefix_hashes_from_token_ids():
    """capture-traces' request table (capture/schema.py gen_table) carries each prompt's chained
    16-token block hashes, from its token ids alone; the contract accepts them."""
    from types import SimpleNamespace

    from capture.schema import PREFIX_BLOCK, gen_table
    from core.trace_checks import validate_table

    ids = {"a": list(range(40)), "b": list(range(32)) + [5] * 3, "c": [1] * 15}
    fins = [SimpleNamespace(request=SimpleNamespace(request_id=k, prompt_token_ids=v), output_tokens=3,
                            finish_reason="stop", arrival_s=0.0, token_times_s=[0.1, 0.2, 0.3], last={})
            for k, v in ids.items()]
    by_id = {k: SimpleNamespace(request_id=k, domain="d", prompt_id=k, text="", keep_text=False) for k in ids}
    table = gen_table(fins, by_id, {}, 8, [], [], 4, False)
    hashes = table.column("prefix_hashes").to_pylist()
    assert hashes == [token_block_hashes(v, PREFIX_BLOCK) for v in ids.values()]
    assert len(hashes[0]) == 2 and hashes[1] == hashes[0] and hashes[2] == []
    validate_table(table, {"schema_version": 1, "hidden_size": 4, "prefix_block_size": PREFIX_BLOCK}, Path("t"))
