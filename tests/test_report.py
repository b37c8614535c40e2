"""The report command end to end on reduced sizes."""

from __future__ import annotations

import pytest

from simulator.report import main


def test_report_runs_end_to_end(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib", reason="the report draws figures with matplotlib")
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["--requests", "120", "--out", str(tmp_path), "--jobs", "2", "--loads", "1,2"]) == 0
    text = (tmp_path / "report.md").read_text()
    from simulator.trace import bundled_trace_names
    for name in bundled_trace_names():   # every trace that fed it is listed, with its status
        assert f"| `{name}` |" in text
    for heading in ("## Traces", "Prediction quality by domain", "Table 3 analogue", "Table 4 analogue", "Table 2 analogue", "Fig. 6 analogue", "Azure"):
        assert heading in text
    assert (tmp_path / "report" / "load-sweep" / "load_sweep.png").is_file()
    assert (tmp_path / "report" / "table3" / "results.csv").is_file()
    assert not list((tmp_path / "report").glob("*/*/requests.parquet"))


@pytest.mark.parametrize("args, message", [
    (["--requests", "1"], "--requests must be >= 2"),
    (["--loads", "1,0"], "--loads '1,0'"),
    (["--loads", "nan"], "--loads 'nan'"),
    (["--loads", "abc"], "--loads 'abc'"),
    (["--table3-load", "-1"], "--table3-load '-1'"),
    (["--jobs", "0"], "--jobs must be >= 1"),
])
def test_report_bad_input_fails_before_any_run(tmp_path, capsys, args, message):
    assert main([*args, "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "r").exists()


def test_undefined_figures_print_as_a_dash():
    """A NaN (e.g. the Spearman of a predictor that gave one value for a whole domain) is '-'."""
    from simulator.report import markdown_table

    table = markdown_table([{"s": float("nan"), "d": float("nan"), "x": 0.25}],
                           [("s", "s", ".3f"), ("d", "d", "%"), ("x", "x", ".3f")])
    assert table.splitlines()[-1] == "| - | - | 0.250 |"
