"""``python -m leap_sched.vllm.check`` says how long the printed command takes to start (compiled:
minutes on a CPU host, as measured in docs/results.md) and how to choose eager for a fast start;
``--enforce-eager`` puts vLLM's flag in the command and the JSON."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from capture.model import DEFAULT_MODEL_DIR
from leap_sched.vllm.check import MEASURED_START_S, main

MODEL = Path(os.environ.get("LEAP_MODEL_DIR", DEFAULT_MODEL_DIR))
ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not (MODEL / "config.json").exists(), reason=f"needs the model's config.json at {MODEL}")
BASE = ["--model", str(MODEL), "--kv-cache-gib", "1", "--predictor", "oracle", "--max-resident", "8",
        "--decode-slots", "2"]


def test_the_compiled_command_says_its_start_and_how_to_choose_eager(capsys):
    assert main(BASE) == 0
    out, err = capsys.readouterr()
    printed = json.loads(out)
    assert "--enforce-eager" not in printed["serve_argv"] and printed["enforce_eager"] is False
    serve_with, note = err.strip().splitlines()
    assert serve_with == f"serve with: {printed['serve_command']}"
    assert "compiles the model" in note and "with --enforce-eager" in note and "361 s compiled, 41 s eager" in note


def test_enforce_eager_reaches_the_command(capsys):
    assert main([*BASE, "--enforce-eager"]) == 0
    out, err = capsys.readouterr()
    printed = json.loads(out)
    assert "--enforce-eager" in printed["serve_argv"] and " --enforce-eager " in printed["serve_command"]
    assert printed["enforce_eager"] is True and err.strip().splitlines()[1].startswith("note: --enforce-eager")


def test_the_quoted_starts_are_the_measured_ones():
    """The note's figures are the table's in docs/results.md (one truth: change both or neither)."""
    text = (ROOT / "docs" / "results.md").read_text()
    assert f"| eager | {MEASURED_START_S['eager']} |" in text and f"| compiled | {MEASURED_START_S['compiled']} |" in text
