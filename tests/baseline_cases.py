"""The baseline tests' shared parts (tests/test_baselines.py and its siblings): the synthetic trace,
the trained and untrained predictors, the fixtures (each test's private capacity cache included),
and the helpers the policy and simulator tests share."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from core.metrics import kendall_tau_b, spearman
from core.trace import load_trace, trace_from_arrays, trace_metadata, traces_dir
from policies.base import SchedulerView
from predictors.base import Known
from simulator.engine import EngineConfig

BASELINES = ("tie", "ssjf", "ltr", "trail", "egtp")
LMSYS = traces_dir() / "lmsys.parquet"
FAST = dict(epochs=40, patience=8)     # training budget of the tests (seconds per predictor)

try:
    import torch  # noqa: F401
    HAVE_TORCH = True
except ImportError:
    HAVE_TORCH = False
needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="training needs torch (pip install -e '.[train]'); "
                                 "run with .venv-capture/bin/python -m pytest to exercise it")


# ----------------------------------------------------------------------------- synthetic traces
def write_synthetic_trace(directory: Path, name: str = "synth", n: int = 480, d: int = 48, e: int = 32,
                          k: int = 64, cap: int = 1024, seed: int = 0) -> Path:
    """A trace file + decode side table whose features carry a noisy signal of the length.

    Prompt features see log L through a random direction plus noise; decode vectors after g tokens
    see log(L - g) the same way (what a remaining-length probe can read).
    """
    rng = np.random.default_rng(seed)
    z = rng.normal(size=n)
    lengths = np.clip(np.round(np.exp(4.6 + 0.9 * z + 0.25 * rng.normal(size=n))), 1, cap).astype(np.int64)
    prompt = rng.integers(8, 400, size=n)
    logl = (np.log(lengths) - 4.6) / 0.9

    def features(width, signal, noise=1.0):
        direction = rng.normal(size=width)
        return (np.outer(signal, direction) + noise * rng.normal(size=(len(signal), width))).astype(np.float32)

    feats = {"text_embedding": features(e, logl, 1.2), "feat_last": features(d, logl),
             "feat_mean": features(d, logl), "feat_entropy_pooled": features(d, logl)}
    trace = trace_from_arrays(name, prompt, lengths, max_tokens=cap, features=feats)
    meta = trace_metadata(hidden_size=d, layers={"feat_last": 24, "feat_mean": 10, "feat_entropy_pooled": 29},
                          decode_every_k=k, decode_layers=[10], max_tokens=cap)
    path = Path(directory) / f"{name}.parquet"
    pq.write_table(trace.table.replace_schema_metadata(meta), path)
    # decode side table: layer 10 carries log remaining; layer 24 is noise (must be ignored)
    rid, gen, layer, vecs = [], [], [], []
    direction = rng.normal(size=d)
    for i, L in enumerate(lengths):
        for g in range(k, int(L), k):
            signal = (np.log(L - g) - 4.6) / 0.9
            for lay in (10, 24):
                rid.append(f"r{i}")
                gen.append(g)
                layer.append(lay)
                v = (signal * direction if lay == 10 else 0.0) + rng.normal(size=d)
                vecs.append(v.astype(np.float16))
    flat = np.asarray(vecs, dtype=np.float16).reshape(-1)
    table = pa.table({"request_id": pa.array(rid, pa.string()), "generated_tokens": pa.array(gen, pa.int32()),
                      "layer": pa.array(layer, pa.int16()),
                      "vector": pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.float16()), d)})
    pq.write_table(table, Path(directory) / f"{name}.decode.parquet")
    return path


@pytest.fixture(scope="module")
def synth_path(tmp_path_factory):
    return write_synthetic_trace(tmp_path_factory.mktemp("synth"))


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path / "cache"))


def split_rows(n: int, train_share: float = 0.6, seed: int = 0):
    perm = np.random.default_rng(seed).permutation(n)
    cut = int(train_share * n)
    return np.sort(perm[:cut]), np.sort(perm[cut:])


def predictor_class(name: str):
    from predictors import PREDICTORS
    return PREDICTORS[name]


def held_out(name: str, predictor, test) -> float:
    """Spearman (LTR: Kendall tau-b) of the predictions with the true lengths on ``test``.

    LTR's output is a rank score with lower = serve first = shorter, so a good ranker correlates
    positively with length, like the length predictors.
    """
    predictor.bind(test, np.random.default_rng(0))
    pred = predictor.predict(np.arange(len(test)), Known(arrived=len(test), finished=0))
    metric = kendall_tau_b if name == "ltr" else spearman
    return metric(pred, test.output_tokens)


_TRAINED: dict = {}


def synth_trained_impl(synth_path):
    """All five trained once on 60% of the synthetic trace (the same objects serve several tests)."""
    if synth_path not in _TRAINED:
        trace = load_trace(synth_path)
        train_rows, test_rows = split_rows(len(trace))
        _TRAINED[synth_path] = ({name: predictor_class(name).fit(trace.take(train_rows), **FAST)
                                 for name in BASELINES}, trace.take(test_rows))
    return _TRAINED[synth_path]


@pytest.fixture(scope="module")
def synth_trained(synth_path):
    if not HAVE_TORCH:
        pytest.skip("training needs torch (pip install -e '.[train]')")
    return synth_trained_impl(synth_path)

def untrained(name: str, trace):
    """A predictor with random (numpy) weights of the right shapes: exercises inference, refresh and
    the engine without torch or training."""
    import predictors.egtp as egtp
    import predictors.ltr as ltr
    import predictors.ssjf as ssjf
    import predictors.tie as tie
    import predictors.trail as trail
    from predictors.heads import new_artifact
    rng = np.random.default_rng(3)
    e, d = trace.feature("text_embedding").shape[1], trace.feature("feat_mean").shape[1]
    mod, specs, out, notes = {
        "tie": (tie, {"mu": tie.head_spec(e), "sigma": tie.head_spec(e)},
                {"out.mu_loc": 4.5, "out.mu_scale": 1.0, "out.sigma_bias": 0.0}, {}),
        "ssjf": (ssjf, {"cls": ssjf.head_spec(e, 16, 5)},
                 {"out.edges": [50, 100, 200, 500], "out.class_length": [30, 75, 150, 350, 700]}, {}),
        "ltr": (ltr, {"score": ltr.head_spec(e, 16)}, {"out.score_top": 3.0}, {}),
        "trail": (trail, {"prior": trail.prior_spec(e, 16, 10), "probe": trail.probe_spec(d, 16, 10)},
                  {"out.bin_max": 1024.0}, {"decode_layer": 10}),
        "egtp": (egtp, {"egtp": egtp.head_spec(d, 20)}, {"out.edges": np.linspace(1, 1000, 21)}, {}),
    }[name]
    arrays = {k: np.asarray(v, dtype=np.float64) for k, v in out.items()}
    for head, spec in specs.items():
        for op in spec:
            if op["op"] == "linear":
                arrays[f"{head}.{op['name']}.w"] = rng.normal(scale=0.3, size=(op["in"], op["out"]))
                arrays[f"{head}.{op['name']}.b"] = rng.normal(scale=0.1, size=op["out"])
            elif op["op"] == "layernorm":
                arrays[f"{head}.{op['name']}.g"] = np.ones(op["dim"])
                arrays[f"{head}.{op['name']}.b"] = np.zeros(op["dim"])
    art = new_artifact(name, mod.VERSION, trace, dict(mod.DEFAULTS), specs, arrays, **notes)
    return predictor_class(name)(art)


def untrained_trail(trace):
    return untrained("trail", trace)


@pytest.fixture(scope="module")
def synth_test(synth_path):
    trace = load_trace(synth_path)
    return trace.take(split_rows(len(trace))[1])

# ----------------------------------------------------------------------------- policies
def _view(**kw):
    n = len(kw["arrival_s"])
    base = dict(now=0.0, predicted=np.full(n, 100.0), generated=np.zeros(n, dtype=np.int64), output_kind="length",
                step=0, last_served=np.zeros(n, dtype=np.int64),
                first_predicted=np.full(n, 100.0))
    base.update(kw)
    return SchedulerView(**base)

# ----------------------------------------------------------------------------- through the simulator
def _check_invariants(result, config: EngineConfig):
    assert np.isfinite(result.finish_s).all()
    assert (result.arrival_s <= result.admit_s).all()
    assert (result.admit_s <= result.first_token_s).all()
    assert (result.first_token_s <= result.finish_s).all()
    log = result.step_log.as_arrays()
    assert (log["decoded"] <= config.decode_slots).all()
    assert (log["resident"] <= config.max_resident).all()


POLICY_OF = {"tie": "aging", "ssjf": "ssjf-starvation", "ltr": "ltr-starvation", "trail": "trail-preemption",
             "egtp": "countdown"}


@pytest.fixture(scope="module")
def synth_predictors(synth_path):
    """Trained predictors when torch is there, random-weight ones otherwise (engine checks only)."""
    if HAVE_TORCH:
        return synth_trained_impl(synth_path)
    trace = load_trace(synth_path)
    test = trace.take(split_rows(len(trace))[1])
    return {name: untrained(name, test) for name in BASELINES}, test
