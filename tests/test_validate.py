"""Simulator fidelity, out of sample: replay a recorded batch trace as it ran (closed loop, the
recording's own vLLM settings) under a step profile fitted on a *different* trace."""

from __future__ import annotations

import numpy as np

from core.trace import load_trace
from experiments.steps_rebuild import rebuild
from experiments.validate import main, validate_one


def test_math_replayed_out_of_sample_within_bound():
    row = validate_one(load_trace("math"), load_trace("lmsys"))
    assert row["profile_from"] == "lmsys" and row["requests"] == 1100
    assert abs(row["p95_e2e_err"]) <= 0.03, row
    assert abs(row["mean_e2e_err"]) <= 0.03, row


def test_lmsys_steps_rebuild_is_exact(tmp_path):
    trace = load_trace("lmsys")
    table, report = rebuild(trace.path)
    assert report["match_rate"] == 1.0
    assert table.column("rebuilt_exact").to_numpy(zero_copy_only=False).all()
    # every recorded decode token is one decode of a request whose context is at least its prompt
    dc = table.column("decode_context").to_numpy()
    dr = table.column("decode_requests").to_numpy()
    assert (dc >= dr).all() and (dc[dr == 0] == 0).all()
    # unchunked prompts give prefill_sq = sum of squared prompt lengths over the whole run
    assert table.column("prefill_sq").to_numpy().sum() >= (trace.prompt_tokens.astype(np.int64) ** 2).sum() * 0.5


def test_validate_rejects_unknown_trace(capsys):
    assert main(["no-such-trace"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_validate_refuses_a_trace_that_is_not_a_recording(capsys):
    assert main(["sharegpt-lengths"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'sharegpt-lengths' is not a vLLM recording" in err
