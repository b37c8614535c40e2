"""The multi-turn ShareGPT workload: capture/multiturn.py's turns by hand (turn k's messages = the
history + user turn k; conversations too short or not alternating are skipped; groups interleaved
turn by turn) and the bundled trace traces/sharegpt-turns.parquet: it loads, every later turn's
prefix hashes start with its previous turn's whole blocks, and the simulator's prefix cache finds
them (docs/traces.md "sharegpt-turns")."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from capture.multiturn import conversation_prompts, conversation_turns, interleaved
from core.trace import load_trace
from experiments.cli import main

TRACE = Path(__file__).resolve().parents[1] / "traces" / "sharegpt-turns.parquet"


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def conv(*texts, start="human"):
    speakers = ("human", "gpt") if start == "human" else ("gpt", "human")
    return [{"from": speakers[i % 2], "value": t} for i, t in enumerate(texts)]


def test_turns_by_hand():
    """Three user turns with replies: turn 0 has no history, turn 2 has four messages before it;
    its reference is the reply that followed it. A fifth user turn is cut (at most 4 kept)."""
    messages = conversation_turns(conv("q0", "a0", "q1", "a1", "q2", "a2"))
    turns = conversation_prompts("c", messages)
    assert [p.prompt_id for p in turns] == ["c:t0", "c:t1", "c:t2"]
    assert turns[0].messages() == [{"role": "user", "content": "q0"}]
    assert turns[2].messages() == [{"role": "user", "content": "q0"}, {"role": "assistant", "content": "a0"},
                                   {"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"},
                                   {"role": "user", "content": "q2"}]
    assert turns[2].reference == "a2" and turns[2].request_id == "sharegpt-turns:c:t2"
    long = conversation_turns(conv(*[f"m{i}" for i in range(10)]))
    assert len(long) == 8


def test_short_or_broken_conversations_are_skipped():
    """Fewer than 3 user turns with replies; a gpt first turn; an empty message ends it early."""
    assert conversation_turns(conv("q0", "a0", "q1", "a1")) is None
    assert conversation_turns(conv("a", "q0", "a0", "q1", "a1", "q2", "a2", start="gpt")) is None
    assert conversation_turns(conv("q0", "a0", "q1", "", "q2", "a2", "q3", "a3")) is None
    assert conversation_turns(conv("q0", "a0", "q1", "a1", "q2", "a2", "q3")) is not None   # a last turn unanswered is dropped


def test_groups_interleave_turn_by_turn():
    a = conversation_prompts("a", conversation_turns(conv(*[f"m{i}" for i in range(8)])))
    b = conversation_prompts("b", conversation_turns(conv(*[f"m{i}" for i in range(6)])))
    assert [p.prompt_id for p in interleaved([a, b])] == ["a:t0", "b:t0", "a:t1", "b:t1", "a:t2", "b:t2", "a:t3"]


# ----------------------------------------------------------------------------- the bundled trace
def test_bundled_trace_loads_and_later_turns_extend_earlier_ones():
    trace = load_trace(str(TRACE))
    table = pq.read_table(TRACE).to_pydict()
    n = len(table["request_id"])
    assert trace.table.num_rows == n and 60 <= n <= 100
    assert "prompt_text" not in table or all(t is None for t in table["prompt_text"])
    by_id = dict(zip(table["request_id"], range(n), strict=True))
    native = json.loads(pq.read_schema(TRACE).metadata[b"leap.trace"])["prefix_block_size"]
    extended = 0
    for rid, row in by_id.items():
        cid, turn = rid.rsplit(":t", 1)
        prev = by_id.get(f"{cid}:t{int(turn) - 1}")
        if prev is None:
            continue
        full = table["prompt_tokens"][prev] // native   # the previous prompt's whole blocks
        assert table["prefix_hashes"][row][:full] == table["prefix_hashes"][prev][:full], rid
        extended += 1
    assert extended >= n // 2


def test_the_prefix_cache_finds_the_history(tmp_path):
    """Replayed with KV blocks the cache serves a good share of the prompt tokens (later turns find
    their history); off, none."""
    out = tmp_path / "run"
    assert main(["--trace", str(TRACE), "--load", "0.5", "--kv-blocks", "profile", "--predictor", "none",
                 "--quiet", "--jobs", "1", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    cached = np.asarray(pq.read_table(out / "requests.parquet").column("cached_tokens").to_pylist())
    assert summary["prefix_hit_rate"] > 0.3 and (cached > 0).sum() >= 40
