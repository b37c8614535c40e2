"""Hostile-user probes, one test per kind of fault, parametrized over its examples: each is refused
before any work starts with one stderr line naming the flag, file, column or row, exit status 2,
and nothing written (or, where stated, accepted with a one-line note). The timeouts bound the
probes that used to run for minutes or hours before failing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from capture import CaptureError
from capture.cli import main as capture_main
from capture.prompts import load_prompts
from core.patience import scaled
from core.trace import TraceError, load_trace, trace_metadata
from experiments.cli import main as simulate_main
from experiments.report import main as report_main
from predictors.evaluate import main as evaluate_main

ROOT = Path(__file__).resolve().parents[1]
TRACE = "sharegpt-lengths"
BASE = ["--trace", TRACE, "--requests", "20", "--predictor", "none", "--quiet"]
MODEL = "/nonexistent-model"
CAPTURE = ["--model", MODEL, "--prompts", "lmsys"]
MAINS = {"simulate": simulate_main, "leap-report": report_main, "capture-traces": capture_main,
         "evaluate-predictors": evaluate_main}


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def refused(capsys, status: int, prog: str, fragment: str) -> str:
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert status == 2, err
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: ") and fragment in lines[0], err
    return lines[0]


# ------------------------------------------------------------------ writes where it should not


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command, argv", [
    ("simulate", [*BASE, "--out", ""]),
    ("leap-report", ["--requests", "2", "--out", ""]),
    ("capture-traces", ["prepare-model", "--out", ""]),
    ("capture-traces", [*CAPTURE, "--out", ""]),
])
def test_empty_out_is_refused_and_nothing_is_written(command, argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    refused(capsys, MAINS[command](argv), command, "--out: empty path")
    assert list(tmp_path.iterdir()) == []


def test_temp_files_of_a_killed_run_go_when_the_same_output_runs_again(tmp_path, capsys):
    out = tmp_path / "runs"
    argv = [*BASE, "--predictor", "none,oracle", "--out", str(out), "--jobs", "1"]
    assert simulate_main(argv) == 0
    run_dir = next(p for p in out.iterdir() if p.is_dir())
    stale = [out / ".results.csv.k9x2.tmp", out / ".results.parquet.a1.tmp", run_dir / ".config.json.zz.tmp"]
    for path in stale:   # what kill -9 during the atomic writes leaves
        path.write_bytes(b"partial")
    assert simulate_main(argv) == 0   # the rerun resumes (both runs are complete) and tidies
    assert [p for p in stale if p.exists()] == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command, argv", [
    ("leap-report", ["--requests", "2", "--out", "/proc/leap-no-such/report"]),
    ("capture-traces", ["prepare-model", "--force", "--out", "/proc/leap-no-such/model"]),
])
def test_unwritable_out_is_refused_before_the_work(command, argv, capsys):
    # /proc refuses new entries even to root, for whom permission bits do not count
    refused(capsys, MAINS[command](argv), command, "is not writable")


# ------------------------------------------------------------------ bad values silently accepted


def _csv(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", ["setting out of range", "setting zero", "slots above resident", "negative arrival",
                                  "nan arrival", "negative import time", "empty predictor list",
                                  "empty policy list"])
def test_simulate_refuses_out_of_range_values(case, tmp_path, capsys):
    argv, fragment = {
        "setting out of range": (["--trace", "sharegpt", "--requests", "20", "--predictor", "leap",
                                  "--setting", "leap.alpha=-1"], "--setting leap.alpha"),
        "setting zero": (["--trace", "sharegpt", "--requests", "20", "--predictor", "tie",
                          "--setting", "tie.epochs=0"], "--setting tie.epochs"),
        "slots above resident": ([*BASE, "--decode-slots", "100", "--max-resident", "10"], "--decode-slots 100"),
        "negative arrival": ([*BASE, "--arrivals", _csv(tmp_path, "a.csv", "arrival_s\n0\n-1\n3\n")],
                             "column arrival_s: row 1"),
        "nan arrival": ([*BASE, "--arrivals", _csv(tmp_path, "a.csv", "arrival_s\n0\nnan\n3\n")],
                        "column arrival_s: row 1"),
        "negative import time": (["--trace", _csv(tmp_path, "m.csv", "timestamp,input_length,output_length\n"
                                                  "0,10,5\n-5,10,5\n"), "--predictor", "none",
                                  "--arrivals", "recorded"], "column timestamp: row 1"),
        "empty predictor list": ([*BASE, "--predictor", ","], "--predictor: empty list"),
        "empty policy list": ([*BASE, "--policy", " , "], "--policy: empty list"),
    }[case]
    refused(capsys, simulate_main(argv), "simulate", fragment)


@pytest.mark.parametrize("edit, status, fragment", [
    ({"bogus": 1}, 2, "unknown key(s) 'bogus'"),
    ({"code_hash": "0" * 64}, 0, "was written by other code"),   # accepted: rerunning on newer code is a use
])
def test_config_with_unknown_keys_or_from_other_code(edit, status, fragment, tmp_path, capsys):
    out = tmp_path / "run"
    assert simulate_main([*BASE, "--out", str(out)]) == 0
    record = json.loads((out / "config.json").read_text())
    config = tmp_path / "config.json"
    config.write_text(json.dumps({**record, **edit}))
    capsys.readouterr()
    assert simulate_main(["--config", str(config), "--json"]) == status
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and fragment in err, err


@pytest.mark.timeout(120)
@pytest.mark.parametrize("argv, fragment", [
    (["--predictor", ","], "--predictor: empty list"),
    (["--trace", " ,"], "--trace: empty list"),
    (["--seed", str(2**64)], "--seed"),
])
def test_evaluate_predictors_refuses_empty_lists_and_seeds_numpy_refuses(argv, fragment, capsys):
    refused(capsys, evaluate_main(argv), "evaluate-predictors", fragment)


@pytest.mark.parametrize("extra, fragment", [
    (["--resume", "--overwrite"], "--resume and --overwrite"),
    (["--finalize-partial"], "--finalize-partial needs --resume"),
    (["--temperature", "nan"], "--temperature"),
    (["--top-p", "inf"], "--top-p"),
    (["--seed", str(2**64)], "--seed"),
])
def test_capture_traces_refuses_contradictory_flags_before_the_model(extra, fragment, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    refused(capsys, capture_main([*CAPTURE, "--out", "x.parquet", *extra]), "capture-traces", fragment)
    assert list(tmp_path.iterdir()) == []


def test_csv_prompt_file_with_an_unterminated_quote(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text('prompt,id\nfine,1\n"never closed,2\nlast,3\n')
    with pytest.raises(CaptureError, match=r"p.csv: the record from line 3: .*never closed"):
        load_prompts([f"csv:{path}"])


def _trace_with_decode_vectors(tmp_path: Path, vectors: np.ndarray, hidden: int) -> Path:
    n = 2
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({
        "request_id": ["r0", "r1"], "domain": ["d"] * n, "prompt_id": ["p0", "p1"],
        "prompt_tokens": pa.array([5] * n, pa.int32()), "output_tokens": pa.array([10] * n, pa.int32()),
        "finish_reason": ["stop"] * n, "max_tokens": pa.array([64] * n, pa.int32()),
    }).replace_schema_metadata(trace_metadata(hidden_size=hidden)), path)
    width = vectors.shape[1]
    vec = pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1).astype(np.float16)), width)
    pq.write_table(pa.table({"request_id": ["r0", "r1"], "generated_tokens": pa.array([8, 8], pa.int32()),
                             "layer": pa.array([2, 2], pa.int16()), "vector": vec}), tmp_path / "d.decode.parquet")
    return path


@pytest.mark.parametrize("vectors, hidden, fragment", [
    (np.array([[0, 1, 2, 3], [0, np.nan, 2, 3]]), 4, r"column vector: layer 2, entry 1: non-finite value"),
    (np.zeros((2, 3)), 4, r"column vector: vector length 3 differs from declared hidden_size 4"),
])
def test_decode_side_table_values_name_the_file(vectors, hidden, fragment, tmp_path):
    trace = load_trace(_trace_with_decode_vectors(tmp_path, vectors, hidden))
    with pytest.raises(TraceError, match=rf"d\.decode\.parquet: {fragment}"):
        trace.decode_vectors(2)
    with pytest.raises(TraceError, match=r"d\.decode\.parquet: column vector"):
        trace.decode_features()


# ------------------------------------------------------------------ sizes, bounded before allocation


@pytest.mark.timeout(60)
@pytest.mark.parametrize("extra, fragment", [
    (["--seeds", "1000000000"], "--seeds: must be <= 10,000"),
    (["--max-resident", "2147483648"], "max-resident 2147483648 is above"),
    (["--decode-slots", "2147483648"], "decode-slots 2147483648 is above"),
    (["--prefill-budget", str(2**40)], "prefill-budget"),
    (["--tile", "100000000000"], "--tile: must be <= 2,000,000"),
    (["--seeds", "100", "--load", ",".join(f"{x}x" for x in range(1, 102))], "10,100 runs planned"),
])
def test_sizes_are_bounded_before_anything_is_allocated(extra, fragment, capsys):
    refused(capsys, simulate_main([*BASE, *extra]), "simulate", fragment)


# ------------------------------------------------------------------ unclear messages


@pytest.mark.parametrize("name, text, fragment", [
    ("big_conv.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,2147483647000\n",
     "column GeneratedTokens: row 0: 2147483647000 tokens is beyond"),
    ("huge_conv.csv", f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,{2**63},5\n",
     f"column ContextTokens: row 0: {2**63} tokens is beyond"),
    ("counts.csv", f"prompt_tokens,output_tokens\n10,5\n10,{2**63}\n", f"column output_tokens: row 1: {2**63} tokens"),
    ("m_trace.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 5}\n'
                      '{"timestamp": 5, "input_length": "x", "output_length": 5}\n',
     "field input_length: row 1: expected a number, found 'x'"),
    ("big_trace.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 5}\n'
                        f'{{"timestamp": 5, "input_length": {2**63 - 1}, "output_length": 5}}\n',
     f"column input_length: row 1: {2**63 - 1} tokens is beyond"),
])
def test_public_trace_errors_name_the_files_own_column_and_row(name, text, fragment, tmp_path, capsys):
    path = _csv(tmp_path, name, text)
    line = refused(capsys, simulate_main(["--trace", path, "--predictor", "none", "--arrivals", "recorded"]),
                   "simulate", fragment)
    assert "-9223372036854775808" not in line


def test_no_prompts_selected_names_the_source_and_slice(tmp_path, monkeypatch):
    import capture.record as rec

    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "hi"}\n')
    args = rec.build_parser("x").parse_args(["--model", MODEL, "--prompts", f"jsonl:{path}@5:9", "--out", "o.parquet"])
    monkeypatch.setattr(rec, "check_args", lambda a: (None, {}))   # no model needed to select prompts
    with pytest.raises(CaptureError, match=rf"no prompts selected by --prompts jsonl:{path}@5:9"):
        rec.record(args)


@pytest.mark.timeout(120)
def test_sigterm_before_any_run_started_is_one_line(tmp_path):
    """SIGTERM while the runs are prepared (here: the capacity of a large trace is measured)."""
    ready = tmp_path / "ready"
    code = ("import signal, sys, simulator.capacity as c\n"
            "real = c.measure_capacity\n"
            "def measure(*a, **k):\n"
            f"    open({str(ready)!r}, 'w').close()\n"
            "    signal.pause()\n"
            "c.measure_capacity = measure\n"
            "import simulator.runner as r; r.measure_capacity = measure\n"
            "from experiments.cli import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    proc = subprocess.Popen([sys.executable, "-c", code, *BASE], cwd=tmp_path, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    while not ready.exists():   # the command has reached the preparation (an event, not a deadline)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=scaled(60))
    assert proc.returncode == 128 + signal.SIGTERM
    assert err.splitlines() == ["simulate: interrupted (signal SIGTERM) before any run started"], err


def test_a_write_refused_by_the_file_size_limit_names_the_file(tmp_path, monkeypatch):
    import errno

    from core import io

    def too_large(fh):
        raise OSError(errno.EFBIG, "File too large")

    with pytest.raises(OSError, match=r"results\.csv: File too large"):
        io._atomic(tmp_path / "results.csv", too_large)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("extra, fragment", [
    (["--arrivals", "EMPTY", "--out", "o.parquet"], "empty CSV"),
    (["--arrivals", "poisson", "--rate", "1", "--out", "o.parquet", "--resume"], "nothing to resume"),
    (["--arrivals", "poisson", "--rate", "1", "--out", "o.parquet", "--seed", str(2**64)], "--seed"),
])
def test_leap_serve_refuses_before_the_trace_and_the_engine(extra, fragment, tmp_path, monkeypatch, capsys):
    from live.serve import main as serve_main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.csv").write_text("")
    argv = ["--from", "lmsys", *[str(tmp_path / "empty.csv") if a == "EMPTY" else a for a in extra]]
    refused(capsys, serve_main(argv), "leap-serve", fragment)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.csv"]
