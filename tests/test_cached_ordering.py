"""Ordering that sees the prefix cache (docs/semantics.md "Policies"): countdown's admission key with
``prefill_weight`` (estimate + weight x uncached prompt tokens) and hrrn's service from the uncached
prompt, by hand on keys, worked out by hand on the command line (docs/examples/
prefix-countdown-admission.jsonl), byte for byte on both kernels where no cache runs, and as a
property: the weight never makes a request with fewer uncached tokens and no longer estimate wait
behind another."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from experiments.cli import main
from policies import make_policy
from policies.base import SchedulerView

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "prefix-countdown-admission.jsonl"


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def view(prompt, cached, predicted, kind="length", arrival=None, now=0.0):
    n = len(prompt)
    return SchedulerView(now=now, arrival_s=np.asarray(arrival if arrival is not None else np.zeros(n), float),
                         predicted=np.asarray(predicted, float), generated=np.zeros(n, np.int64),
                         output_kind=kind, prompt=np.asarray(prompt, np.int64),
                         cached=None if cached is None else np.asarray(cached, np.int64))


# ----------------------------------------------------------------------------- keys by hand
def test_countdown_admission_keys_by_hand():
    """weight 0.5: prompt 100 with 96 cached, estimate 30: 30 + 0.5 x 4 = 32; prompt 40, none
    cached, estimate 10: 10 + 20 = 30; no cache (cached None) reads 0. Default weight: the estimate.
    A rank predictor's scores take no prefill term."""
    rows = np.arange(2)
    weighted = make_policy("countdown", [("prefill_weight", 0.5)])
    assert weighted.reads_cached and not make_policy("countdown").reads_cached
    assert weighted.admission_keys(view([100, 40], [96, 0], [30, 10]), rows).tolist() == [32.0, 30.0]
    assert weighted.admission_keys(view([100, 40], None, [30, 10]), rows).tolist() == [80.0, 30.0]
    assert make_policy("countdown").admission_keys(view([100, 40], [96, 0], [30, 10]), rows).tolist() == [30.0, 10.0]
    assert weighted.admission_keys(view([100, 40], [96, 0], [0.3, 0.1], kind="rank"), rows).tolist() == [0.3, 0.1]


def test_hrrn_serves_the_uncached_prompt_by_hand():
    """token_s 1, now 10, both arrived at 0 (wait 10 tokens), no estimate: prompt 100 with 90
    cached has S = 10, ratio (10 + 10) / 10 = 2; prompt 20 uncached has S = 20, ratio 1.5: the
    cached long prompt goes first. Without a cache S = 100: ratio 1.1, it goes second."""
    hrrn = make_policy("hrrn", [("token_s", 1.0)])
    rows = np.arange(2)
    assert hrrn.decode_keys(view([100, 20], [90, 0], [0, 0], now=10.0), rows).tolist() == [-2.0, -1.5]
    assert hrrn.decode_keys(view([100, 20], None, [0, 0], now=10.0), rows).tolist() == pytest.approx([-1.1, -1.5])


@settings(max_examples=200, deadline=None, derandomize=True)
@given(prompt=st.lists(st.integers(1, 4000), min_size=2, max_size=2), share=st.lists(st.floats(0, 1), min_size=2,
       max_size=2), est=st.lists(st.integers(1, 2000), min_size=2, max_size=2), weight=st.floats(1e-3, 10.0))
def test_countdown_weight_orders_by_estimate_plus_uncached(prompt, share, est, weight):
    """Keys are monotone: a row with no more uncached tokens and no longer estimate never keys above
    the other; the key is the estimate exactly when the whole prompt is cached."""
    cached = [int(p * s) for p, s in zip(prompt, share, strict=True)]
    keys = make_policy("countdown", [("prefill_weight", weight)]).admission_keys(
        view(prompt, cached, est), np.arange(2)).tolist()
    uncached = [p - c for p, c in zip(prompt, cached, strict=True)]
    if uncached[0] <= uncached[1] and est[0] <= est[1]:
        assert keys[0] <= keys[1]
    for key, u, e in zip(keys, uncached, est, strict=True):
        assert (key == e) == (u == 0)


# ----------------------------------------------------------------------------- a run by hand
def run(tmp_path, name, *flags):
    out = tmp_path / name
    assert main(["--trace", str(EXAMPLE), "--engine", "unit", "--arrivals", "recorded", "--kv-blocks", "16",
                 "--block-size", "4", "--prefill-budget", "8", "--predictor", "oracle", "--policy", "countdown",
                 "--quiet", "--jobs", "1", "--out", str(out), *flags]) == 0
    return pq.read_table(out / "requests.parquet").to_pydict()


def test_countdown_admission_by_hand(tmp_path):
    """docs/semantics.md "Policies": A (8 tokens, 2 out) at t = 0; C (8 other tokens, 2 out) and B
    (12 tokens starting with A's 8, 3 out) at t = 2; budget 8, blocks of 4. B finds A's two blocks
    (8 tokens), so B needs 4 and C 8: they do not fit one step together. Weight 0: C (estimate 2)
    before B (3): C at t = 2, B at 3, finish 4 and 6. Weight 1: C 2 + 8 = 10, B 3 + 4 = 7: B first,
    finish 5 and 5. Weight 1 without the cache: B 3 + 12 = 15, C first again."""
    plain = run(tmp_path, "plain")
    assert plain["admit_s"] == [0.0, 2.0, 3.0] and plain["finish_s"] == [2.0, 4.0, 6.0]
    assert plain["cached_tokens"] == [0, 0, 8]
    weighted = run(tmp_path, "weighted", "--setting", "countdown.prefill_weight=1")
    assert weighted["admit_s"] == [0.0, 3.0, 2.0] and weighted["finish_s"] == [2.0, 5.0, 5.0]
    assert weighted["cached_tokens"] == [0, 0, 8]
    off = run(tmp_path, "off", "--setting", "countdown.prefill_weight=1", "--prefix-caching", "off")
    assert off["admit_s"] == [0.0, 2.0, 3.0] and off["finish_s"] == [2.0, 4.0, 6.0]


# ----------------------------------------------------------------------------- both kernels
@pytest.mark.skipif(importlib.util.find_spec("numba") is None, reason="numba is not installed: no compiled kernel")
def test_countdown_prefill_weight_compiled_byte_for_byte():
    """No cache in the compiled kernel: the key is estimate + weight x prompt in both kernels."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_compiled import replay_both

    from simulator.config import EngineConfig
    from simulator.runner import RunConfig

    engine = EngineConfig(max_resident=16, decode_slots=16)   # admission contested: its order matters
    result = replay_both(RunConfig(trace="sharegpt", predictor="oracle", policy="countdown", load=1.5, requests=400,
                                   engine_config=engine, policy_options=(("prefill_weight", 0.05),)))
    plain = replay_both(RunConfig(trace="sharegpt", predictor="oracle", policy="countdown", load=1.5, requests=400,
                                  engine_config=engine))
    assert result.admit_s.tobytes() != plain.admit_s.tobytes()   # the weight changed the order
