"""LEAP read-out and the leap / leap-rls predictors on synthetic traces."""

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")   # only effective if numpy is not imported yet

import json
import math

import numpy as np
import pytest

from core.metrics import spearman
from core.readout import (
    ALPHA_GRID,
    LinearReadout,
    fit_readout,
    get_target,
    ridge_fit,
    select_alpha,
    standardization_stats,
    standardize,
    with_bias,
)
from core.trace import TraceError, trace_from_arrays
from predictors import PREDICTORS, make_predictor
from predictors.base import PendingUpdate, PredictorOptions
from predictors.evaluate import stream_predictions
from predictors.leap import AnchoredRLS, Leap, LeapRLS, prediction_cpu_s, rls_update_cpu_s


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path / "cache"))


def synthetic(name, n, d=16, *, seed=0, shift=0.0, direction_seed=99, cap=2048, layer=20,
              num_layers=30, constant_col=None):
    """Lengths depend on one direction of the (raw, unevenly scaled) features; ``shift`` adds a
    domain-specific dependence on another direction."""
    rng = np.random.default_rng(seed)
    drng = np.random.default_rng(direction_seed)
    w = drng.standard_normal(d)
    w /= np.linalg.norm(w)
    v = drng.standard_normal(d)
    v /= np.linalg.norm(v)
    scales = drng.uniform(0.5, 3.0, d)
    offsets = drng.uniform(-2.0, 2.0, d)
    Z = rng.standard_normal((n, d))
    X = Z * scales + offsets
    if constant_col is not None:
        X[:, constant_col] = 7.0
    s = 14 + 7 * (Z @ w) + shift * (Z @ v) + 0.5 * rng.standard_normal(n)
    lengths = np.clip(np.round(np.clip(s, 1, None) ** 2), 1, cap).astype(np.int64)
    meta = {"layers": {"feat_last": layer}, "num_layers": num_layers} if layer is not None else {}
    return trace_from_arrays(name, np.full(n, 10), lengths, max_tokens=cap,
                             features={"feat_last": X.astype(np.float16)}, metadata=meta)


# ----------------------------------------------------------------------------- read-out pieces
def test_standardisation_with_constant_feature():
    X = np.array([[1.0, 5.0, 2.0], [3.0, 5.0, 2.0], [5.0, 5.0, 2.0]], dtype=np.float16)
    mean, scale = standardization_stats(X)
    assert np.allclose(mean, [3, 5, 2])
    assert np.allclose(scale, [np.sqrt(8 / 3), 1.0, 1.0])
    Z = standardize(X, mean, scale)
    assert np.allclose(Z[:, 1:], 0.0)
    assert np.allclose(Z[:, 0].mean(), 0) and np.allclose(Z[:, 0].std(), 1)
    assert np.isfinite(standardize(X + 1, mean, scale)).all()
    with pytest.raises(ValueError):
        standardize(X[:, :2], mean, scale)


def readout(theta, d=2, cap=2048, target="sqrt"):
    return LinearReadout(mean=np.zeros(d), scale=np.ones(d), theta=np.asarray(theta, float),
                         target=target, cap=cap)


def test_clipping_and_squaring():
    r = readout([1.0, 0.0, 5.0])                       # linear = x0 + 5
    X = np.array([[0.0, 0], [-100.0, 0], [100.0, 0], [1.5, 0]])
    assert list(r.predict(X)) == [25.0, 1.0, 2048.0, 42.25]   # clip to [1, sqrt(2048)], square
    assert r.bounds == (1.0, pytest.approx(math.sqrt(2048)))
    for x in X:
        assert r.predict_one(x.astype(np.float32)) == pytest.approx(r.predict(x[None])[0], rel=1e-6)
    small = readout([1.0, 0.0, 5.0], cap=16)
    assert small.predict(np.array([[0.0, 0.0]]))[0] == 16.0
    log = readout([1.0, 0.0, 2.0], target="log")
    assert log.predict(np.array([[0.0, 0.0], [-9.0, 0.0]])) == pytest.approx([math.exp(2), 1.0])
    length = readout([1.0, 0.0, 2.0], target="length")
    assert length.predict(np.array([[0.0, 0.0], [5000.0, 0.0]])) == pytest.approx([2.0, 2048.0])
    with pytest.raises(ValueError):
        get_target("cube")


def test_readout_folds_standardisation_into_fast_path():
    rng = np.random.default_rng(0)
    r = LinearReadout(mean=rng.standard_normal(8), scale=rng.uniform(0.5, 2, 8),
                      theta=np.r_[rng.standard_normal(8), 12.0])
    X = rng.standard_normal((20, 8)).astype(np.float32)
    batch = r.predict(X)
    assert np.allclose([r.predict_one(x) for x in X], batch, rtol=1e-5)


def test_select_alpha_and_fit():
    tr = synthetic("train", 600)
    readout_, gram = fit_readout(tr, want_gram=True)
    d = readout_.describe()
    assert d["alpha"] in [pytest.approx(a) for a in ALPHA_GRID]
    assert d["lambda"] == pytest.approx(d["alpha"] * 600)
    assert len(d["cv_mse"]) == len(ALPHA_GRID)
    assert d["layer"] == 20 and d["d"] == 16 and d["train_trace"] == "train"
    assert d["train_hash"] == tr.content_hash
    assert readout_.prior_length == pytest.approx(tr.output_tokens.mean())
    # the fitted weights are the closed-form ridge on standardised features, bias last
    Z = readout_.standardize(tr.feature("feat_last"))
    theta = ridge_fit(with_bias(Z), np.sqrt(tr.output_tokens), readout_.lam)
    assert np.allclose(readout_.theta, theta, rtol=1e-9, atol=1e-12)
    assert gram.shape == (17, 17)
    # noise-only targets push alpha up; too few rows fall back to a fixed alpha
    rng = np.random.default_rng(1)
    Zn = rng.standard_normal((200, 40))
    a_noise, mse = select_alpha(Zn, rng.standard_normal(200) + 10, (1, 45))
    assert a_noise >= 1e-1 and mse.shape == (len(ALPHA_GRID),)
    assert select_alpha(Zn[:5], np.ones(5), (1, 45))[1] is None


def test_fit_is_cached_atomically(tmp_path):
    tr = synthetic("train", 300)
    first, _ = fit_readout(tr)
    cached = os.listdir(tmp_path / "cache" / "leap")
    assert any(f.endswith(".npz") and not f.endswith(".gram.npz") for f in cached)
    assert not [f for f in cached if f.endswith(".tmp")]
    second, _ = fit_readout(tr)
    assert second.cache_path == first.cache_path
    assert np.array_equal(first.theta, second.theta) and second.lam == first.lam
    # another target or column is another cache entry; a corrupt file is refitted
    other, _ = fit_readout(tr, target="log")
    assert other.cache_path != first.cache_path
    with open(first.cache_path, "wb") as fh:
        fh.write(b"not an npz")
    third, _ = fit_readout(tr)
    assert np.allclose(third.theta, first.theta)


# ----------------------------------------------------------------------------- predictors
def test_registered():
    assert PREDICTORS["leap"] is Leap and PREDICTORS["leap-rls"] is LeapRLS
    with pytest.raises(ValueError):
        make_predictor("leap", PredictorOptions(train_trace=None))


def test_leap_beats_a_constant_predictor():
    train = synthetic("train", 800, seed=1)
    test = synthetic("test", 400, seed=2)
    leap = Leap(train)
    leap.bind(test, np.random.default_rng(0))
    pred = leap.predict(np.arange(len(test)))
    rho = spearman(pred, test.output_tokens)
    constant = np.full(len(test), leap.prior_length)
    rho_const = spearman(constant, test.output_tokens)
    assert math.isnan(rho_const)                   # no order at all
    assert rho > 0.8
    assert ((pred >= 1) & (pred <= 2048)).all()
    assert leap.stage == "prefill" and leap.requires == ("feat_last",)
    # predict is a cheap lookup of the bound rows
    assert np.array_equal(leap.predict(np.array([3, 1])), pred[[3, 1]])


def test_constant_feature_still_works():
    train = synthetic("train", 300, constant_col=3)
    test = synthetic("test", 100, seed=5)              # the feature varies here
    leap = Leap(train)
    assert leap.readout.scale[3] == 1.0 and leap.readout.theta[3] == 0.0
    leap.bind(test, np.random.default_rng(0))
    pred = leap.predict(np.arange(100))
    assert np.isfinite(pred).all() and spearman(pred, test.output_tokens) > 0.7
    rls = LeapRLS(train)
    out, updates = stream_predictions(rls, test)
    assert np.isfinite(out).all() and updates == 100 // 8


def test_cost_and_describe():
    train = synthetic("train", 200)
    leap = Leap(train)
    cost = leap.cost()                                 # before bind: training metadata
    assert cost.tap_fraction == pytest.approx(21 / 30)
    assert cost.cpu_s_per_prediction == prediction_cpu_s(16) > 0 and not cost.charges_gpu
    leap.bind(synthetic("w", 50, layer=None), np.random.default_rng(0))
    assert leap.cost().tap_fraction == 1.0             # no layer metadata: fall back to 1.0
    desc = leap.describe()
    json.dumps(desc, allow_nan=False)
    for key in ("lambda", "layer", "d", "train_trace", "train_hash", "lambda_selection"):
        assert key in desc
    rls = LeapRLS(train)
    json.dumps(rls.describe(), allow_nan=False)
    assert rls.describe()["update_every"] == 8


def test_bind_checks_the_workload():
    train = synthetic("train", 200)
    with pytest.raises(TraceError, match="dimensions"):
        Leap(train).bind(synthetic("w", 20, d=8), np.random.default_rng(0))
    with pytest.raises(TraceError, match="layer"):
        Leap(train).bind(synthetic("w", 20, layer=5), np.random.default_rng(0))
    plain = trace_from_arrays("plain", [5, 5], [3, 4])
    with pytest.raises(TraceError, match="feat_last"):
        LeapRLS(train).bind(plain, np.random.default_rng(0))
    with pytest.raises(TraceError):
        _ = Leap("/nonexistent/train.parquet").readout


def test_rls_without_feedback_matches_leap():
    train = synthetic("train", 300)
    test = synthetic("test", 80, seed=3, shift=5.0)
    leap, rls = Leap(train), LeapRLS(train)
    for p in (leap, rls):
        p.bind(test, np.random.default_rng(0))
    rows = np.arange(80)
    assert np.allclose(rls.predict(rows), leap.predict(rows), rtol=1e-9)
    assert rls.feedback(rows[:3], test.output_tokens[:3]) is None    # below update_every


@pytest.mark.parametrize("cls", [Leap, LeapRLS])
def test_bound_beside_another_shares_its_rows_and_keeps_its_own_weights(cls):
    """A fleet's replicas: the second predictor holds the first's read-out rows (one copy), predicts
    what its own bind would, and learns apart (feedback to one leaves the other's estimates)."""
    train, test = synthetic("train", 300), synthetic("test", 80, seed=3, shift=5.0)
    first, beside, alone = cls(train), cls(train), cls(train)
    first.bind(test, np.random.default_rng(0))
    beside.bind_beside(first, test, np.random.default_rng(0))
    alone.bind(test, np.random.default_rng(0))
    rows = np.arange(80)
    assert beside.predict(rows).tobytes() == alone.predict(rows).tobytes()
    held = "_Z" if cls is LeapRLS else "_pred"
    assert getattr(beside, held) is getattr(first, held)
    if cls is LeapRLS:
        before = beside.predict(rows)
        update = first.feedback(rows[:8], test.output_tokens[:8])
        update.publish()
        assert beside.predict(rows).tobytes() == before.tobytes()
        assert first.predict(rows).tobytes() != before.tobytes()
    with_refresh = Leap(train, refresh=True)
    assert not with_refresh._shares_with(first)   # a refresh rewrites its own estimates


def test_pending_updates_publish_in_order():
    train = synthetic("train", 300)
    test = synthetic("test", 64, seed=3, shift=6.0)
    rls = LeapRLS(train, update_every=8)
    rls.bind(test, np.random.default_rng(0))
    rows = np.arange(64)
    before = rls.predict(rows)
    truth = test.output_tokens
    first = rls.feedback(rows[:5], truth[:5])
    assert first is None
    u1 = rls.feedback(rows[5:8], truth[5:8])
    u2 = rls.feedback(rows[8:16], truth[8:16])
    assert isinstance(u1, PendingUpdate) and isinstance(u2, PendingUpdate)
    assert u1.requests == 8 and u1.cpu_s == rls_update_cpu_s(8, 17) > 0
    # nothing changes before a publish, although both updates are computed
    assert np.array_equal(rls.predict(rows), before)
    # replay the same math independently
    readout = rls.readout
    Z = readout.standardize(test.feature("feat_last"), dtype=np.float32).astype(np.float64)
    ref = AnchoredRLS.from_weights(readout.theta, rls._gram)
    ref.update(with_bias(Z[:8]), np.sqrt(truth[:8]))
    theta1 = ref.theta
    ref.update(with_bias(Z[8:16]), np.sqrt(truth[8:16]))
    theta2 = ref.theta

    def expected(theta):
        return np.clip(Z @ theta[:-1] + theta[-1], 1, math.sqrt(2048)) ** 2

    u1.publish()
    after1 = rls.predict(rows)
    assert np.allclose(after1, expected(theta1), rtol=1e-10)
    assert not np.allclose(after1, before)
    u2.publish()
    after2 = rls.predict(rows)
    assert np.allclose(after2, expected(theta2), rtol=1e-10)
    u1.publish()                                       # a stale snapshot never overrides a newer one
    assert np.array_equal(rls.predict(rows), after2)
    assert rls.published_version == 2


def test_streamed_rls_equals_ridge_over_training_plus_feedback():
    train = synthetic("train", 250)
    test = synthetic("test", 40, seed=4, shift=4.0)
    rls = LeapRLS(train, update_every=8)
    stream_predictions(rls, test)
    readout = rls.readout
    Zt = readout.standardize(train.feature("feat_last"))
    Zf = readout.standardize(test.feature("feat_last"), dtype=np.float32).astype(np.float64)
    theta = ridge_fit(np.vstack([with_bias(Zt), with_bias(Zf)]),
                      np.sqrt(np.r_[train.output_tokens, test.output_tokens]), readout.lam)
    assert np.linalg.norm(rls.rls.theta - theta) / np.linalg.norm(theta) < 1e-8


def test_rls_recovers_ranking_on_a_shifted_domain():
    train = synthetic("train", 600, seed=1)
    shifted = synthetic("shifted", 600, seed=7, shift=10.0)
    frozen, _ = stream_predictions(Leap(train), shifted)
    online, updates = stream_predictions(LeapRLS(train), shifted)
    assert updates == 600 // 8
    truth = shifted.output_tokens
    second_half = slice(300, 600)
    assert spearman(online[second_half], truth[second_half]) > spearman(frozen[second_half],
                                                                         truth[second_half]) + 0.05
