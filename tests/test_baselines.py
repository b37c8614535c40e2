"""The trained baselines (TIE, SSJF, LTR, TRAIL, EGTP) and their scheduler-side policies.

Training tests need torch (optional extra ``train``) and are skipped without it; inference, the
TIE score, TRAIL's smoothing and the policies are numpy only. Each predictor is trained on a small
synthetic trace written to disk (always) and on a slice of the recorded ``traces/lmsys.parquet``
(skipped if it is absent), and must beat a constant predictor on held-out Spearman (LTR: Kendall
tau) -- a constant has no rank correlation, so "beats" means a clearly positive correlation.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from core.metrics import kendall_tau_b, spearman
from core.trace import load_trace, trace_from_arrays, trace_metadata, traces_dir
from policies import make_policy
from policies.base import SchedulerView
from predictors import make_predictor
from predictors.base import Known, PredictorOptions
from simulator.capacity import measure_capacity
from simulator.engine import EngineConfig, Simulation
from simulator.profiles import make_profile
from simulator.workload import ArrivalSpec, make_arrivals

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


# ----------------------------------------------------------------------------- training quality
@pytest.mark.parametrize("name", BASELINES)
def test_trains_on_synthetic_and_beats_constant(name, synth_trained):
    predictors, test = synth_trained
    q = held_out(name, predictors[name], test)
    assert q > 0.5, f"{name}: held-out rank correlation {q:.3f}"
    meta = predictors[name].artifact.meta
    assert meta["train_seconds"] < 30


@needs_torch
@pytest.mark.skipif(not LMSYS.is_file(), reason="traces/lmsys.parquet not recorded yet")
@pytest.mark.parametrize("name", BASELINES)
def test_trains_on_lmsys_slice_and_beats_constant(name):
    trace = load_trace(LMSYS)
    train_rows, test_rows = split_rows(len(trace))
    predictor = predictor_class(name).fit(trace.take(train_rows), **FAST)
    # the training time is recorded (a positive duration), not raced against a wall-clock bound
    assert predictor.artifact.meta["train_seconds"] > 0
    q = held_out(name, predictor, trace.take(test_rows))
    assert q > 0.05, f"{name}: held-out rank correlation {q:.3f} on lmsys (a constant has none)"


# ----------------------------------------------------------------------------- weights
@needs_torch
def test_training_is_cached_and_deterministic(synth_path):
    options = PredictorOptions(train_trace=str(synth_path), settings={"ssjf": dict(FAST)})
    first = make_predictor("ssjf", options)
    assert first.artifact.source == "trained"
    again = make_predictor("ssjf", options)
    assert again.artifact.source == "cache"
    retrained = make_predictor("ssjf", PredictorOptions(train_trace=str(synth_path), settings={"ssjf": {**FAST, "retrain": True}}))
    for key, value in first.artifact.arrays.items():
        np.testing.assert_array_equal(value, retrained.artifact.arrays[key])


def test_missing_torch_fails_with_one_clear_message(synth_path, monkeypatch):
    import predictors.heads as heads
    from predictors.heads import TrainingUnavailable
    monkeypatch.setattr(heads, "have_torch", lambda: False)
    with pytest.raises(TrainingUnavailable, match=r"predictor 'tie'.*synth.*torch"):
        make_predictor("tie", PredictorOptions(train_trace=str(synth_path)))


@pytest.mark.skipif(not LMSYS.is_file(), reason="traces/lmsys.parquet not recorded yet")
@pytest.mark.parametrize("name", BASELINES)
def test_shipped_weights_match_the_bundled_lmsys_trace(name, monkeypatch):
    import predictors.heads as heads
    if not heads.shipped_path(name).is_file():
        pytest.skip(f"no shipped weights for {name} yet (scripts/train_baselines.py --ship)")
    monkeypatch.setattr(heads, "have_torch", lambda: False)      # a fresh install without torch
    predictor = make_predictor(name, PredictorOptions(train_trace="lmsys"))
    assert predictor.artifact.source == "shipped"


# ----------------------------------------------------------------------------- costs
def test_costs_are_the_documented_figures():
    """Per-call / per-token figures quoted in the docstrings (H100 constants of the default engine)."""
    from predictors.egtp import EGTP
    from predictors.gpu_cost import (
        BERT_BASE,
        DEBERTA_V3_BASE,
        DISTILBERT_BASE,
        OPT_125M,
        egtp_cost,
        encoder_cost,
        trail_refresh_s,
    )
    expect = {DEBERTA_V3_BASE: (1.466e-3, 0.271e-6), BERT_BASE: (1.324e-3, 0.272e-6),
              OPT_125M: (1.281e-3, 0.268e-6), DISTILBERT_BASE: (0.670e-3, 0.133e-6)}
    for enc, (call, token) in expect.items():
        cost = encoder_cost(enc)
        assert cost.gpu_s_per_call == pytest.approx(call, rel=2e-3), enc.name
        assert cost.gpu_s_per_prompt_token == pytest.approx(token, rel=3e-3), enc.name
    assert trail_refresh_s() == pytest.approx(51.8e-6, rel=2e-3)
    egtp = egtp_cost()
    assert egtp.gpu_s_per_prompt_token == pytest.approx(2.744e-6, rel=2e-3)
    assert egtp.gpu_s_per_call == pytest.approx(0.099e-3, rel=1e-2)
    assert EGTP.stage == "prefill"


def test_predictor_settings_are_json(synth_test):
    trail = untrained_trail(synth_test)
    trail.bind(synth_test, np.random.default_rng(0))
    json.dumps(trail.describe())
    assert trail.cost().gpu_s_per_refresh > 0 and trail.cost().gpu_s_per_call > 0


# ----------------------------------------------------------------------------- TIE's score
@pytest.mark.parametrize("mu,sigma,beta", [(5.0, 0.8, 0.3), (6.5, 1.2, 0.5), (3.0, 0.3, 0.1), (2.0, 2.5, 0.4)])
def test_tie_score_matches_high_sample_monte_carlo(mu, sigma, beta):
    from predictors.tie import tie_score, tie_score_monte_carlo
    exact = float(tie_score(mu, sigma, beta)[0])
    mc = tie_score_monte_carlo(mu, sigma, beta, samples=2_000_000, seed=7)
    assert exact == pytest.approx(mc, rel=0.01)
    assert float(tie_score(mu, sigma, beta)[0]) == exact            # deterministic


def test_tie_beta_and_queue_estimate():
    from predictors.tie import tie_beta
    assert tie_beta(0, 64) == 0.1 and tie_beta(192, 64) == pytest.approx(0.3) and tie_beta(10_000, 64) == 0.5


def test_tie_scores_from_the_counts_it_is_given_not_row_numbers(synth_test):
    """L_q comes from the arrived/finished counts the engine passes, whatever rows are asked."""
    from predictors.tie import Tie
    tie = Tie.__new__(Tie)
    tie.batch, tie.nu = 64, 3.5
    tie._mu, tie._sigma = np.full(4, 5.0), np.full(4, 1.0)
    rows = np.array([0])
    calm, busy = Known(arrived=1, finished=0), Known(arrived=1000, finished=0)
    assert tie.queue_estimate(calm) == 0 and tie.queue_estimate(busy) == 1000 - 64
    assert tie.predict(rows, busy)[0] > tie.predict(rows, calm)[0]      # a longer queue weighs the tail more
    assert tie.predict(np.array([3]), calm)[0] == tie.predict(rows, calm)[0]   # row 3 does not mean 4 arrived
    with pytest.raises(ValueError, match="known"):
        tie.predict(rows)


# ----------------------------------------------------------------------------- TRAIL
def test_trail_smoothing_matches_hand_computed_posterior():
    from predictors.trail import smooth, transition_matrix
    T = transition_matrix(3, 2.0)                                    # p = 1/2
    np.testing.assert_allclose(T, [[1, 0, 0], [0.5, 0.5, 0], [0, 0.5, 0.5]])
    post = np.array([0.2, 0.3, 0.5])
    # k = 2: prior = post @ T^2 = [0.55, 0.325, 0.125]; x [0.1, 0.6, 0.3] -> [22, 78, 15] / 115
    post = smooth(post, np.array([0.1, 0.6, 0.3]), 2, T)
    np.testing.assert_allclose(post[0], np.array([22, 78, 15]) / 115, rtol=1e-12)
    # k = 1: prior = [61, 46.5, 7.5] / 115; x [0.5, 0.25, 0.25] -> [61/88, 93/352, 15/352]
    post = smooth(post, np.array([0.5, 0.25, 0.25]), 1, T)
    np.testing.assert_allclose(post[0], [61 / 88, 93 / 352, 15 / 352], rtol=1e-12)
    # TRAIL's own bins: p = min(1, 1 / bin_size)
    assert transition_matrix(10, 102.4)[5, 4] == pytest.approx(1 / 102.4)
    assert transition_matrix(10, 0.5)[5, 4] == 1.0


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


def test_trail_refresh_uses_recorded_vectors_and_counts_down_exactly(synth_test):
    from policies.countdown import remaining
    from predictors.trail import smooth
    test = synth_test
    trail = untrained_trail(test)
    trail.bind(test, np.random.default_rng(0))
    assert trail.refresh_every == 64
    lengths = test.output_tokens
    row = int(np.flatnonzero(lengths > 300)[0])
    rows = np.array([row])
    prior = trail.post[row].copy()
    first = float(trail.predict(rows)[0])
    # by hand: prefill observation at g = 1, then the vector recorded at g = 64
    drows, gen, vecs = test.decode_vectors(10)
    vec64 = vecs[(drows == row) & (gen == 64)]
    assert len(vec64) == 1
    post = smooth(prior, trail.probe_probabilities(test.feature("feat_mean")[rows]), 1, trail.T)
    post = smooth(post, trail.probe_probabilities(vec64), 63, trail.T)
    expected = 64 + float(np.clip(post @ trail.mid, 1, 1024 - 64)[0])
    got = float(trail.refresh(rows, np.array([64]))[0])
    # rel 1e-6, not exact: the hand computation runs the probe on one row, bind on all rows at once,
    # and a float32 matrix product's last bit can depend on the batch's shape (BLAS kernels)
    assert got == pytest.approx(expected, rel=1e-6) and got != first
    # between refreshes the total stays put, so countdown's key falls by exactly one per token
    view = SchedulerView(now=0.0, arrival_s=np.zeros(1), predicted=np.array([got]), generated=np.array([64]),
                         output_kind="length")
    keys = []
    for g in range(64, 128):
        view.generated[0] = g
        keys.append(float(remaining(view, np.array([0]))[0]))
    assert np.allclose(np.diff(keys), -1.0) or min(keys) == 0.5
    # a refresh with no newer vector than the one already used changes nothing
    assert float(trail.refresh(rows, np.array([64]))[0]) == got
    # the same evidence through the (proposed) engine hook after prefill gives the same posterior
    hooked = untrained_trail(test)
    hooked.bind(test, np.random.default_rng(0))
    after = float(hooked.after_prefill(rows)[0])
    assert after != first and float(hooked.refresh(rows, np.array([64]))[0]) == pytest.approx(got, rel=1e-12)


def test_trail_predictions_change_only_at_refresh_points(synth_test):
    """Through the engine: a request's estimate is constant between multiples of k = 64."""
    from policies.countdown import Countdown

    class Spy(Countdown):
        name = "countdown"
        seen: list = []

        def decode_keys(self, view, rows):
            self.seen.append((rows.copy(), view.generated[rows].copy(), view.predicted[rows].copy()))
            return super().decode_keys(view, rows)

    test = synth_test
    spy = Spy()
    sim = Simulation(test, np.zeros(len(test)), policy=spy, predictor=untrained_trail(test),
                     profile=make_profile("unit"), config=EngineConfig(decode_slots=8, wait_cap=0))
    sim.run()
    last: dict[int, tuple[int, float]] = {}
    changes = 0
    for rows, gen, pred in spy.seen:
        for r, g, p in zip(rows.tolist(), gen.tolist(), pred.tolist()):
            if r in last and last[r][0] // 64 == g // 64:
                assert p == last[r][1], f"row {r}: estimate moved between refreshes ({last[r]} -> {g}, {p})"
            elif r in last and p != last[r][1]:
                changes += 1
            last[r] = (g, p)
    assert changes > 0


# ----------------------------------------------------------------------------- policies
def _view(**kw):
    n = len(kw["arrival_s"])
    base = dict(now=0.0, predicted=np.full(n, 100.0), generated=np.zeros(n, dtype=np.int64), output_kind="length",
                step=0, last_served=np.zeros(n, dtype=np.int64),
                first_predicted=np.full(n, 100.0))
    base.update(kw)
    return SchedulerView(**base)


def test_ssjf_starvation_override():
    policy = make_policy("ssjf-starvation")
    rows = np.arange(3)
    # predicted 10, 500, 50 tokens; oldest (row 0) waited 1 s: no override -> shortest remaining first
    view = _view(arrival_s=np.array([9.0, 9.5, 9.9]), now=10.0, predicted=np.array([500.0, 10.0, 50.0]))
    assert np.argsort(policy.decode_keys(view, rows), kind="stable").tolist() == [1, 2, 0]
    # waited 101 s > 100 s -> waiting-time order for this decision
    view.now = 110.0
    assert np.argsort(policy.decode_keys(view, rows), kind="stable").tolist() == [0, 1, 2]
    # 10x its predicted execution: 0.1 + 0.02 * 500 = 10.1 s -> wait 101.5 s > 101 s (also > 100)
    view = _view(arrival_s=np.array([0.0, 1.0]), now=30.0, predicted=np.array([100.0, 5.0]))
    # exec = 0.1 + 2 = 2.1 s, 10x = 21 s < 30 s wait -> override
    assert np.argsort(policy.admission_keys(view, np.arange(2)), kind="stable").tolist() == [0, 1]
    view.now = 20.0                                                   # 20 s < 21 s -> by prediction
    assert np.argsort(policy.admission_keys(view, np.arange(2)), kind="stable").tolist() == [1, 0]


def test_ltr_starvation_promotion_for_ten_runs():
    policy = make_policy("ltr-starvation")
    policy.reset(3)
    rows = np.arange(3)
    scores = np.array([5.0, 1.0, 2.0])                                # rank scores, lower first
    last = np.array([0, 299, 299])
    view = _view(arrival_s=np.zeros(3), predicted=scores, output_kind="rank", step=300, last_served=last)
    keys = policy.decode_keys(view, rows)                             # row 0 idle 299 >= 200 -> top
    assert np.argsort(keys, kind="stable")[0] == 0
    for run in range(1, 11):                                          # it runs in the next steps
        view.step += 1
        view.last_served[0] = view.step - 1
        view.last_served[1:] = view.step - 1
        keys = policy.decode_keys(view, rows)
        assert (np.argsort(keys, kind="stable")[0] == 0) == (run < 10), run
    assert np.argsort(keys, kind="stable").tolist() == [1, 2, 0]      # back to its score after 10 runs
    # idle 199 is not enough
    view = _view(arrival_s=np.zeros(2), predicted=np.array([5.0, 1.0]), output_kind="rank", step=200,
                 last_served=np.array([0, 199]))
    fresh = make_policy("ltr-starvation")
    fresh.reset(2)
    assert np.argsort(fresh.decode_keys(view, np.arange(2)), kind="stable")[0] == 1


def test_ltr_starvation_reset_starts_a_new_run():
    """The engine calls reset(n) at the start of each run: promotions of the last run do not leak
    into the next, even when the new run's view reuses the same arrays."""
    policy = make_policy("ltr-starvation")
    policy.reset(2)
    view = _view(arrival_s=np.zeros(2), predicted=np.array([5.0, 1.0]), output_kind="rank", step=300,
                 last_served=np.array([0, 299]))
    assert np.argsort(policy.decode_keys(view, np.arange(2)), kind="stable")[0] == 0   # row 0 promoted
    policy.reset(2)
    view.step, view.last_served[:] = 10, [9, 9]                       # a new run: nobody idle
    assert np.argsort(policy.decode_keys(view, np.arange(2)), kind="stable")[0] == 1


def test_trail_limited_preemption():
    policy = make_policy("trail-preemption")
    rows = np.arange(3)
    # row 0: 90 of an initial 100 generated (> 0.8 x 100), held a slot last step -> keeps it
    view = _view(arrival_s=np.zeros(3), predicted=np.array([400.0, 100.0, 60.0]), generated=np.array([90, 10, 10]),
                 first_predicted=np.array([100.0, 100.0, 60.0]), step=50, last_served=np.array([49, 49, 49]))
    keys = policy.decode_keys(view, rows)
    assert np.argsort(keys, kind="stable").tolist() == [0, 2, 1]
    view.last_served[0] = 40                                          # not running: ordinary key
    assert np.argsort(policy.decode_keys(view, rows), kind="stable").tolist() == [2, 1, 0]
    view.last_served[0] = 49
    view.generated[0] = 80                                            # exactly 0.8 x: still preemptible
    assert np.argsort(policy.decode_keys(view, rows), kind="stable").tolist() == [2, 1, 0]


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


@pytest.mark.parametrize("name", BASELINES)
def test_runs_through_simulator_on_synthetic_at_1_5x(name, synth_predictors):
    predictors, test = synth_predictors
    profile = make_profile("qwen3-8b-h100")
    config = EngineConfig(decode_slots=16, max_resident=64)
    rate = 1.5 * measure_capacity(test, profile, config)
    arrivals = make_arrivals(ArrivalSpec(), test, rate, 0)
    for policy in ("countdown", POLICY_OF[name]):
        sim = Simulation(test, arrivals, policy=make_policy(policy), predictor=predictors[name], profile=profile,
                         config=config, record_steps=True)
        result = sim.run()
        _check_invariants(result, config)
        assert result.gpu_s_charged > 0


@pytest.mark.skipif(not LMSYS.is_file(), reason="traces/lmsys.parquet not recorded yet")
@pytest.mark.parametrize("name", BASELINES)
def test_runs_through_simulator_on_lmsys_at_1_5x(name):
    import predictors.heads as heads
    from simulator.runner import RunConfig, execute, prepare
    if not (HAVE_TORCH or heads.shipped_path(name).is_file()):
        pytest.skip("neither torch nor shipped weights")
    config = RunConfig(trace="lmsys", predictor=name, policy=POLICY_OF[name], load=1.5, requests=300)
    prepared = prepare(config, record_steps=True)
    summary, result = execute(prepared)
    _check_invariants(result, config.engine_config)
    assert result.gpu_s_charged > 0


@pytest.mark.parametrize("setting, message", [
    ("noequals", "--set expects KEY=VALUE"),
    ("epochs=abc", "--set epochs=abc: epochs needs an integer"),
    ("epoch=3", "--set epoch: not a setting of trail"),
])
def test_train_script_rejects_bad_settings_before_training(synth_path, setting, message):
    import subprocess
    import sys
    script = Path(__file__).resolve().parents[1] / "scripts" / "train_baselines.py"
    proc = subprocess.run([sys.executable, str(script), "--trace", str(synth_path), "--predictors", "trail",
                           "--set", setting], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr, proc.stderr


def test_tie_cvar_is_the_mean_over_the_top_tail_quantiles():
    """CVaR_0.9 over 20 quadrature points is the mean of the top two (index 18 on), exactly."""
    from predictors.tie import t_quantiles, tie_terms
    q = t_quantiles(3.5, 20)
    e, c = tie_terms(0.0, 0.5, n=20, clip_mean=1e9, clip_cvar=1e9)
    assert c[0] == pytest.approx(np.exp(0.5 * q[18:]).mean(), rel=1e-12)
    assert e[0] == pytest.approx(np.exp(0.5 * q).mean(), rel=1e-12)


def test_trail_estimate_stays_within_the_cap(synth_test):
    """total = generated + remaining, remaining clamped to [1, cap - generated]: never past the cap
    while tokens are left, one more token at the cap itself."""
    trail = untrained_trail(synth_test)
    trail.bind(synth_test, np.random.default_rng(0))
    cap = trail.cap
    rows = np.array([0, 1, 2, 3])
    top, bottom = np.eye(trail.k)[-1], np.eye(trail.k)[0]
    trail.post[rows] = [top, top, bottom, top]
    trail.g_post[rows] = [0, cap - 5, cap - 1, cap]
    generated = trail.g_post[rows].copy()
    estimate = trail._estimate(rows, generated)
    assert estimate.tolist() == [trail.mid[-1], cap, cap, cap + 1]
