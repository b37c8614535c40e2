"""experiments.length_bins: SHORT/LONG bin precision and recall of length estimates (llm-d's bins)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from experiments.length_bins import bin_scores, main


def test_hand_example():
    # SHORT <= 100, LONG >= 512 (cap 1,024, fraction 0.5)
    estimate = np.array([50, 90, 300, 600, 700, 80])
    true = np.array([40, 200, 120, 900, 300, 600])
    s = bin_scores(estimate, true, 100, np.full(6, 512.0))
    # said SHORT: rows 0, 1, 5; truly SHORT: row 0 -> P 1/3, R 1/1
    assert (s["short_said"], s["short_true"]) == (3, 1)
    assert s["short_precision"] == pytest.approx(1 / 3) and s["short_recall"] == 1.0
    # said LONG: rows 3, 4; truly LONG: rows 3, 5 -> P 1/2, R 1/2
    assert (s["long_said"], s["long_true"]) == (2, 2)
    assert s["long_precision"] == 0.5 and s["long_recall"] == 0.5


def test_the_bounds_are_in_their_bins():
    # llm-d's SHORT is <= 100; LONG >= 4,096 (here 512): a length on the bound is in the bin
    s = bin_scores(np.array([100.0, 512.0]), np.array([100, 512]), 100, np.full(2, 512.0))
    assert (s["short_true"], s["long_true"], s["short_said"], s["long_said"]) == (1, 1, 1, 1)
    assert s["short_recall"] == s["long_recall"] == 1.0


def test_an_empty_bin_has_no_precision():
    s = bin_scores(np.array([300.0]), np.array([50]), 100, np.array([512.0]))
    assert math.isnan(s["short_precision"]) and s["short_recall"] == 0.0
    assert math.isnan(s["long_precision"]) and math.isnan(s["long_recall"])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 1024), min_size=1, max_size=40), st.integers(1, 1023),
       st.floats(0.05, 1.0))
def test_true_lengths_as_estimates_score_one_and_scores_are_fractions(lengths, short_at, fraction):
    true = np.array(lengths)
    long_at = np.full(len(true), fraction * 1024)
    perfect = bin_scores(true, true, short_at, long_at)
    for name in ("short", "long"):
        if perfect[f"{name}_true"]:
            assert perfect[f"{name}_precision"] == perfect[f"{name}_recall"] == 1.0
    shuffled = bin_scores(true[::-1], true, short_at, long_at)
    for key, value in shuffled.items():
        if key.endswith(("precision", "recall")) and not math.isnan(value):
            assert 0.0 <= value <= 1.0


def test_cli_scores_a_bundled_trace(capsys):
    assert main(["--trace", "math", "--predictor", "oracle", "--json"]) == 0
    row = json.loads(capsys.readouterr().out.strip())
    assert (row["trace"], row["n"], row["long_at"]) == ("math", 1100, 512.0)
    assert row["short_precision"] == row["short_recall"] == row["long_precision"] == row["long_recall"] == 1.0


@pytest.mark.parametrize("argv, want", [
    (["--predictor", "nope"], "--predictor: unknown predictor 'nope'"),
    (["--long-fraction", "0"], "--long-fraction must be in (0, 1]"),
    (["--short-at", "-1"], "--short-at must be > 0"),
    (["--trace", "no-such-trace"], "no-such-trace"),
])
def test_bad_input_is_one_line_and_exit_2(argv, want, capsys):
    assert main(argv) == 2
    err = capsys.readouterr()
    assert err.out == "" and len(err.err.strip().splitlines()) == 1 and want in err.err
