"""LEAP's decode-time refresh (Table 2 ablation) on synthetic traces with decode side tables."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from core.trace import load_trace, trace_metadata
from policies import make_policy
from predictors.leap import Leap, LeapRLS, fit_decode_readout
from simulator.engine import EngineConfig, Simulation
from simulator.profiles import make_profile

D, EVERY, LAYER = 16, 8, 5


def write_trace(path, n, seed):
    """Prefill state encodes sqrt(length) along e0; a decode state at g encodes sqrt(remaining)."""
    rng = np.random.default_rng(seed)
    length = rng.integers(10, 200, n)
    feats = rng.normal(size=(n, D)).astype(np.float32)
    feats[:, 0] = np.sqrt(length)
    dec_rows, dec_gen, dec_vec = [], [], []
    for i, L in enumerate(length):
        for g in range(EVERY, L, EVERY):
            v = rng.normal(size=D).astype(np.float32)
            v[0] = np.sqrt(L - g)
            dec_rows.append(f"r{i}")
            dec_gen.append(g)
            dec_vec.append(v)
    ids = [f"r{i}" for i in range(n)]
    table = pa.table({
        "request_id": ids, "domain": ["syn"] * n, "prompt_id": ids,
        "prompt_tokens": pa.array(rng.integers(5, 50, n), pa.int32()),
        "output_tokens": pa.array(length, pa.int32()),
        "finish_reason": ["stop"] * n, "max_tokens": pa.array([256] * n, pa.int32()),
        "feat_last": pa.FixedSizeListArray.from_arrays(pa.array(feats.astype(np.float16).ravel()), D),
    }).replace_schema_metadata(trace_metadata(hidden_size=D, layers={"feat_last": LAYER}, num_layers=8,
                                              decode_every_k=EVERY))
    pq.write_table(table, path)
    vec = np.stack(dec_vec).astype(np.float16)
    pq.write_table(pa.table({"request_id": dec_rows, "generated_tokens": pa.array(dec_gen, pa.int32()),
                             "layer": pa.array([LAYER] * len(dec_rows), pa.int32()),
                             "vector": pa.FixedSizeListArray.from_arrays(pa.array(vec.ravel()), D)}),
                   str(path).replace(".parquet", ".decode.parquet"))
    return load_trace(path)


@pytest.fixture()
def traces(tmp_path, monkeypatch):
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path / "cache"))
    return write_trace(tmp_path / "train.parquet", 300, 0), write_trace(tmp_path / "serve.parquet", 120, 1)


def test_decode_readout_learns_remaining_length(traces):
    train, serve = traces
    readout = fit_decode_readout(train, LAYER)
    rows, gen, vecs = serve.decode_vectors(LAYER)
    remaining = serve.output_tokens[rows] - gen
    pred = readout.output(readout.linear(readout.standardize(vecs)))
    assert np.corrcoef(pred, remaining)[0, 1] > 0.95


def test_refresh_replaces_estimate_with_latest_state(traces):
    train, serve = traces
    leap = Leap(train, refresh=True)
    leap.bind(serve, np.random.default_rng(0))
    assert leap.refresh_every == EVERY and leap.cost().gpu_s_per_refresh > 0
    row = int(np.argmax(serve.output_tokens))
    before = leap.predict([row])[0]
    after = leap.refresh(np.array([row]), np.array([EVERY]))[0]
    true = serve.output_tokens[row]
    assert abs(after - true) < abs(before - true) + 1e-9 or abs(after - true) < 0.1 * true
    assert leap.predict([row])[0] == after                # the refreshed estimate is the current one
    # between recorded states the latest earlier state is used
    assert leap.refresh(np.array([row]), np.array([EVERY + 3]))[0] == after


def test_refresh_in_simulation_costs_gpu_time_and_frozen_leap_does_not(traces):
    train, serve = traces
    arrivals = np.zeros(len(serve))
    results = {}
    for refresh in (False, True):
        sim = Simulation(serve, arrivals, policy=make_policy("countdown"), predictor=Leap(train, refresh=refresh),
                         profile=make_profile("qwen3-8b-h100"), config=EngineConfig(decode_slots=8))
        results[refresh] = sim.run()
    assert results[False].gpu_s_charged == 0
    assert results[True].gpu_s_charged > 0
    assert np.isfinite(results[True].finish_s).all()
    # the decode states encode the remaining length exactly, so refreshed estimates are closer still
    assert results[True].mae_in_use < results[False].mae_in_use


def test_refresh_needs_decode_table(traces, tmp_path):
    from core.trace import TraceError

    train, serve = traces
    bare = tmp_path / "bare.parquet"
    pq.write_table(serve.table, bare)
    with pytest.raises(TraceError, match="needs a decode side table"):
        Leap(train, refresh=True).bind(load_trace(bare), np.random.default_rng(0))


def test_leap_rls_has_no_refresh(traces):
    train, serve = traces
    rls = LeapRLS(train, refresh=True)
    rls.bind(serve, np.random.default_rng(0))
    assert rls.refresh_every is None
