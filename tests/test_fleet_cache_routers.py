"""Cache- and KV-aware routers (docs/semantics.md "Cache-aware routers"): each rule on a view worked
out by hand, the refusals (one line, exit 2, nothing written), and a fleet that routes by prefix on
the command line (docs/examples/prefix-three-requests.jsonl)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from experiments.cli import main
from routers import ROUTERS, make_router
from routers.base import FleetView

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "prefix-three-requests.jsonl"


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def view(**fields) -> FleetView:
    a = {k: np.asarray(v) if isinstance(v, list) and k != "prompt_keys" else v for k, v in fields.items()}
    return FleetView(replicas=len(a["outstanding"]), **a)


def test_vllm_dp_scores_as_vllm_and_rotates_ties():
    """max(in flight, waiting + running) + waiting x 6 x max(0, usage - 0.5): 2 + 2 x 6 x 0.4 = 6.8,
    2, 2; the tie of 1 and 2 goes to the first in the scan from start 0: 1. The next routing (same
    snapshot) counts one more waiting at 1 (3) and scans from 1: replica 2 (2)."""
    router = make_router("vllm-dp")
    router.reset(3, 0)
    v = view(outstanding=[2, 2, 2], waiting=[2, 0, 1], running=[0, 2, 1], kv_used=[90, 10, 50], kv_total=100)
    assert router.choose(0, v) == 1
    assert router.choose(1, v) == 2
    fresh = view(outstanding=[2, 2, 2], waiting=[2, 0, 1], running=[0, 2, 1], kv_used=[90, 10, 50], kv_total=100,
                 snapshot_at=1.0)
    assert router.choose(2, fresh) == 2   # a new snapshot drops the local counts; the scan starts at 2


def test_weighted_default_is_llm_ds():
    """precise-prefix 2, queue-depth 1, kv-utilization 1: replica 0 holds 3 of 4 blocks (1.5) but has
    the longest queue (0) and 80% of its KV (0.2): 1.7; replica 1: 0 + 1 + 0.8 = 1.8 wins."""
    router = make_router("weighted")
    router.reset(2, 0)
    v = view(outstanding=[3, 3], waiting=[2, 0], running=[1, 3], kv_used=[80, 20], kv_total=100,
             hits=[3, 0], prompt_keys=[1, 2, 3, 4])
    assert router.choose(0, v) == 1
    heavy = make_router("weighted:precise-prefix=5,queue-depth=1")
    heavy.reset(2, 0)
    assert heavy.choose(0, v) == 0


def test_kv_cost_is_dynamos():
    """overlap x uncached prompt blocks + held blocks + the request's blocks (prompt 4 blocks of 16
    + expected 32 tokens = 6): replica 0: 1 + 50 + 6 = 57; replica 1: 4 + 40 + 6 = 50 -> 1; with
    overlap 4: 4 x 1 + 56 = 60 vs 4 x 4 + 46 = 62."""
    v = view(outstanding=[1, 1], waiting=[0, 0], running=[1, 1], kv_used=[50, 40], kv_total=100, hits=[3, 0],
             prompt_keys=[1, 2, 3, 4], block_size=16, expected_output=32.0)
    assert make_router("kv-cost").cost(v).tolist() == [57.0, 50.0] and make_router("kv-cost").choose(0, v) == 1
    assert make_router("kv-cost:overlap=4").cost(v).tolist() == [60.0, 62.0]


def test_prefix_affinity_follows_what_it_routed():
    router = make_router("prefix-affinity")
    router.reset(2, 0)
    assert router.choose(0, view(outstanding=[0, 0], prompt_keys=[1, 2, 3])) == 0
    assert router.choose(1, view(outstanding=[1, 0], prompt_keys=[1, 2, 9])) == 0    # 2 blocks matched at 0
    assert router.choose(2, view(outstanding=[2, 0], prompt_keys=[5, 6])) == 1       # none: fewer outstanding
    bounded = make_router("prefix-affinity:capacity=2")
    bounded.reset(2, 0)
    bounded.choose(0, view(outstanding=[0, 0], prompt_keys=[1, 2, 3]))               # keeps 2, 3 only
    assert bounded.choose(1, view(outstanding=[1, 0], prompt_keys=[1, 2])) == 1


def test_queue_depth_and_kv_utilization():
    v = view(outstanding=[3, 4, 3], waiting=[1, 0, 0], running=[2, 4, 3], kv_used=[10, 60, 30], kv_total=100)
    assert make_router("queue-depth").choose(0, v) == 2   # waiting 0 at 1 and 2: fewer outstanding
    assert make_router("kv-utilization").choose(0, v) == 0


def _fleet(tmp_path, router, *flags, trace=EXAMPLE):
    out = tmp_path / router.replace(":", "_")
    blocks = ["--block-size", "4"] if "--kv-blocks" in flags else []   # refused without KV blocks
    code = main(["--trace", str(trace), "--engine", "unit", "--arrivals", "recorded", "--replicas", "2",
                 "--router", router, *blocks, "--prefill-budget", "8", "--predictor", "none",
                 *flags, "--quiet", "--jobs", "1", "--out", str(out)])
    return code, out


def test_precise_prefix_sends_b_where_a_left_its_blocks(tmp_path):
    """A goes to replica 0 (nothing cached anywhere; tie); at t = 2 A has finished there, so B (A's
    8 tokens) finds 1 block at 0 and goes there; C finds none: the replica with fewer outstanding, 1.
    Round-robin sends B to 1, where nothing is cached."""
    code, out = _fleet(tmp_path, "precise-prefix", "--kv-blocks", "8")
    assert code == 0
    t = pq.read_table(out / "requests.parquet").to_pydict()
    assert t["replica"] == [0, 0, 1] and t["cached_tokens"] == [0, 4, 0]
    code, out = _fleet(tmp_path, "round-robin", "--kv-blocks", "8")
    assert pq.read_table(out / "requests.parquet").to_pydict()["cached_tokens"] == [0, 0, 0]
    summary = json.loads((tmp_path / "precise-prefix" / "summary.json").read_text())
    assert summary["prefix_hit_rate"] == 0.2


def test_precise_prefix_prefers_the_cache_to_the_shorter_queue(tmp_path):
    """A (block 7, 10 tokens out) is still running on replica 0 when B (A's 8 tokens) arrives: its
    first block is cached there (named at A's admission), so B goes to the busier replica 0."""
    trace = tmp_path / "busy.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 8, "output_length": 10, "hash_ids": [7]}\n'
                     '{"timestamp": 2000, "input_length": 8, "output_length": 2, "hash_ids": [7]}\n')
    code, out = _fleet(tmp_path, "precise-prefix", "--kv-blocks", "8", trace=trace)
    t = pq.read_table(out / "requests.parquet").to_pydict()
    assert code == 0 and t["replica"] == [0, 0] and t["cached_tokens"] == [0, 4]
    code, out = _fleet(tmp_path, "queue-depth", "--kv-blocks", "8", trace=trace)
    assert pq.read_table(out / "requests.parquet").to_pydict()["replica"] == [0, 1]


@pytest.mark.parametrize("router", [name for name in ROUTERS if ROUTERS[name].reads in ("prefix", "cache")])
def test_every_cache_router_runs_a_fleet(tmp_path, router):
    code, out = _fleet(tmp_path, router, "--kv-blocks", "8")
    assert code == 0 and sum(pq.read_table(out / "requests.parquet").to_pydict()["cached_tokens"]) >= 0


@pytest.mark.parametrize(("router", "flags", "fragment"), [
    ("precise-prefix", [], "reads the replicas' prefix caches"),
    ("kv-cost", ["--kv-blocks", "8", "--prefix-caching", "off"], "reads the replicas' prefix caches"),
    ("kv-utilization", [], "reads KV blocks"),
    ("weighted", [], "reads the replicas' prefix caches"),
    ("weighted:foo=1", ["--kv-blocks", "8"], "unknown scorer 'foo'"),
    ("vllm-dp:lag=-1", [], "expected KEY=NUMBER"),
    ("queue-depth:x", [], "expected KEY=NUMBER"),
])
def test_bad_router_input_is_one_line_exit_2(tmp_path, capsys, router, flags, fragment):
    code, out = _fleet(tmp_path, router, *flags)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and fragment in err[0], err
    assert not out.exists()


@pytest.mark.skipif(importlib.util.find_spec("numba") is None, reason="numba is not installed")
@pytest.mark.parametrize("router", ["queue-depth", "prefix-affinity", "vllm-dp:lag=0.5"])
def test_routers_without_kv_blocks_run_compiled_byte_for_byte(tmp_path, router):
    """A fleet without KV blocks runs compiled; the routers reading the counters and the prompt's
    keys route the same on both kernels (a subprocess: numba stays out of the test process)."""
    outs = []
    for kernel in ("reference", "compiled"):
        out = tmp_path / kernel
        argv = ["--trace", "sharegpt", "--requests", "300", "--replicas", "4", "--router", router, "--predictor",
                "none", "--load", "1.2x", "--kernel", kernel, "--quiet", "--out", str(out)]
        subprocess.run([sys.executable, "-c", f"from experiments.cli import main; raise SystemExit(main({argv!r}))"],
                       check=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
        outs.append((out / "requests.parquet").read_bytes())
    assert outs[0] == outs[1]
