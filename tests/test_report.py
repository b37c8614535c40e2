"""The report command end to end on reduced sizes; it fails early and never harms an old report."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from experiments.report import main


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def old_report(tmp_path) -> Path:
    """An --out folder holding a previous report and a file of someone else's."""
    out = tmp_path / "docs"
    (out / "report" / "table3").mkdir(parents=True)
    (out / "report" / "table3" / "results.csv").write_text("old table\n")
    (out / "report" / "stale-experiment.csv").write_text("from an older report\n")
    (out / "report.md").write_text("# old report\n")
    (out / "notes.md").write_text("not the report's\n")
    return out


@pytest.mark.timeout(1200)   # 521 s measured at load average 15 on two cores (about a minute alone)
def test_report_runs_end_to_end(tmp_path, monkeypatch, old_report, capsys):
    pytest.importorskip("matplotlib", reason="the report draws figures with matplotlib")
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["--requests", "120", "--out", str(old_report), "--jobs", "2", "--loads", "1,2"]) == 0
    tmp_path = old_report
    assert "table3 run 1/" in capsys.readouterr().err   # progress, one line per run
    assert (tmp_path / "notes.md").read_text() == "not the report's\n"
    assert not (tmp_path / "report" / "stale-experiment.csv").exists()   # report/ replaced whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.md", "report", "report.md"]   # no stage left
    text = (tmp_path / "report.md").read_text()
    from core.trace import bundled_trace_names
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
    from experiments.report import markdown_table

    table = markdown_table([{"s": float("nan"), "d": float("nan"), "x": 0.25}],
                           [("s", "s", ".3f"), ("d", "d", "%"), ("x", "x", ".3f")])
    assert table.splitlines()[-1] == "| - | - | 0.250 |"


def test_missing_matplotlib_fails_before_any_run_and_leaves_the_old_report(old_report, monkeypatch, capsys):
    import experiments.report

    monkeypatch.setitem(sys.modules, "matplotlib", None)   # import matplotlib -> ImportError

    def no_run(*args, **kwargs):
        raise AssertionError("a run started before the missing dependency was reported")

    # "before any work" is asserted by event (no run, no trace loaded), not by a wall-clock bound
    monkeypatch.setattr(experiments.report, "run_many", no_run)
    monkeypatch.setattr(experiments.report, "prepare", no_run)
    before = snapshot(old_report)
    assert main(["--requests", "150", "--out", str(old_report)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "matplotlib" in err[0], err
    assert snapshot(old_report) == before


@pytest.mark.parametrize("failure, code", [(OSError("disk full (injected)"), 2), (KeyboardInterrupt(), 130)])
def test_failure_mid_run_leaves_the_old_report(old_report, tmp_path_factory, monkeypatch, capsys, failure, code):
    """Runs have happened and tables are being written when it fails or is interrupted."""
    import experiments.plots
    import experiments.report

    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    monkeypatch.setattr(experiments.plots, "_pyplot", lambda: None)   # pass the matplotlib check without it
    written = []

    def fail_on_second(out, summaries):
        written.append(out)
        if len(written) == 2:
            raise failure
        real_write_results(out, summaries)

    real_write_results = experiments.report.write_results
    monkeypatch.setattr(experiments.report, "write_results", fail_on_second)
    before = snapshot(old_report)
    assert main(["--requests", "40", "--out", str(old_report), "--jobs", "1", "--loads", "1"]) == code
    err = capsys.readouterr().err
    assert "table3 run 1/" in err and err.strip().splitlines()[-1].startswith("leap-report: ")
    assert len(written) == 2
    assert snapshot(old_report) == before
    assert sorted(p.name for p in old_report.iterdir()) == ["notes.md", "report", "report.md"]


def test_out_blocked_fails_before_any_run(tmp_path, capsys):
    (tmp_path / "report").write_text("a file where the report folder goes")
    assert main(["--requests", "40", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "in the way" in err[0], err


def test_a_skipped_section_keeps_the_committed_results(old_report, tmp_path, monkeypatch, capsys):
    """No Azure arrivals file (no ../shared): the previous report's azure/results.* stay, byte for
    byte, and stderr says so in one line; a section skipped with nothing to keep says that."""
    pytest.importorskip("matplotlib", reason="the report checks for matplotlib before any run")
    import experiments.report

    azure = old_report / "report" / "azure"
    azure.mkdir()
    (azure / "results.csv").write_text("committed azure table\n")
    (azure / "results.parquet").write_bytes(b"PAR1 committed")
    empty = tmp_path / "shared-data"
    empty.mkdir()
    monkeypatch.setenv("LEAP_DATA_DIR", str(empty))   # a data folder without arrivals/
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(experiments.report.Report, "plan", lambda self, loads, load: [self.azure(1.0)])
    before = snapshot(azure)
    assert main(["--requests", "20", "--out", str(old_report), "--jobs", "1"]) == 0
    assert snapshot(old_report / "report" / "azure") == before
    notes = [line for line in capsys.readouterr().err.splitlines() if "skipped" in line]
    assert len(notes) == 1, notes
    assert "Azure section skipped: arrivals/AzureLLMInferenceTrace_conv.csv not found" in notes[0]
    assert "kept report/azure/ from the previous report" in notes[0]
    assert "Skipped:" in (old_report / "report.md").read_text()

    fresh = tmp_path / "fresh"
    assert main(["--requests", "20", "--out", str(fresh), "--jobs", "1"]) == 0
    assert not (fresh / "report" / "azure").exists()
    assert "no previous results to keep" in capsys.readouterr().err
