"""simulate's console table: compact by default (fits the terminal, 100 columns when piped, by
dropping columns in a stated order, nothing cut), a header naming the arrivals, one legend line,
the trade-off against FCFS in words; --wide has every figure; --out says where it wrote."""

from __future__ import annotations

import pytest

from experiments.cli import main
from experiments.table import COMPACT_COLUMNS, DROP_ORDER, LEGEND, WIDE_COLUMNS

TRACE = "sharegpt-lengths"


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("LEAP_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    monkeypatch.delenv("COLUMNS", raising=False)   # piped: the 100-column default


def table(capsys, *args):
    assert main(["--trace", TRACE, "--requests", "300", "--quiet", *args]) == 0
    return capsys.readouterr()


def test_compact_table_fits_100_columns_uncut(capsys):
    # longest names: every predictor, the longest policy, several seeds and loads
    out = table(capsys, "--predictor", "none,oracle,noisy-oracle", "--policy", "countdown,trail-preemption",
                "--load", "1x,1.5x", "--seeds", "2", "--jobs", "1").out
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert "…" not in out
    for header, _ in COMPACT_COLUMNS:   # a header may wrap onto two lines at this width; values never
        assert all(word in out for word in header.split())
    rows = [x.split() for x in lines if x.split()[:1] in (["none"], ["oracle"], ["noisy-oracle"])]
    assert len(rows) == 2 * 2 * 5   # seeds x loads x (FCFS + 2 predictors x 2 policies)
    assert all(len(r) == len(COMPACT_COLUMNS) + 1 for r in rows)   # + seed; every cell whole
    assert {r[1] for r in rows} == {"fcfs", "countdown", "trail-preemption"}
    assert all(part in lines or any(part in line for line in lines) for part in LEGEND.split(" | "))
    assert max(len(part) for part in LEGEND.split(" | ")) <= 100
    assert "Spearman" not in out and "NL vs LEAP" not in out


def test_default_run_states_the_trade_off(capsys):
    out = table(capsys, "--predictor", "none,oracle", "--load", "1.5x").out
    assert "vs FCFS" in out and "p95 vs FCFS" in out
    line = next(x for x in out.splitlines() if x.startswith("oracle + countdown at 1.5x vs FCFS: mean NL "))
    assert ", p95 e2e +" in line and " s), p99 TPOT " in line and line.endswith(" ms)") and len(line) <= 100


def test_wide_table_has_every_figure(capsys):
    out = table(capsys, "--predictor", "none,oracle", "--load", "1.5x", "--wide").out
    for header, _ in WIDE_COLUMNS:
        if header != "NL vs LEAP":   # shown only beside a leap run
            assert header in out
    assert "…" not in out and "sim CPU s: CPU seconds of the simulation loop" in out
    assert "NL vs LEAP" not in out


def test_nl_vs_leap_only_beside_a_leap_run(capsys):
    out = table(capsys, "--trace", "sharegpt", "--requests", "200", "--predictor", "none,leap", "--load", "1.5x",
                "--wide").out
    assert "NL vs LEAP" in out


def test_out_says_where_it_wrote(tmp_path, capsys):
    out = tmp_path / "runs"
    captured = table(capsys, "--predictor", "none,oracle", "--load", "1.5x", "--out", str(out))
    assert f"simulate: wrote 2 run(s) to {out}" in captured.err


def test_80_columns_drop_columns_in_order_never_cut(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    out = table(capsys, "--predictor", "none,oracle,noisy-oracle", "--policy", "countdown,trail-preemption",
                "--load", "1x,1.5x", "--seeds", "2", "--jobs", "1").out
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80 and "\u2026" not in out
    assert lines[0] == f"trace {TRACE} | engine qwen3-8b-h100 | arrivals poisson"   # the header, split at a |
    note = " ".join(out.split("not shown at 80 columns: ")[1].split())   # the note may wrap
    dropped = note.split(" (--wide shows every column)")[0].split(", ")
    headers = {name: header for header, name in COMPACT_COLUMNS}
    assert dropped == [headers[name] for name in DROP_ORDER][:len(dropped)]   # in the stated order
    assert "mean NL" in out and "p95 e2e" in out
    rows = [x.split() for x in lines if x.split()[:1] in (["none"], ["oracle"], ["noisy-oracle"])]
    assert len(rows) == 2 * 2 * 5 and all(len(r) == len(COMPACT_COLUMNS) + 1 - len(dropped) for r in rows)
    wide = table(capsys, "--predictor", "none,oracle", "--load", "1.5x", "--wide").out
    for header, _ in WIDE_COLUMNS:
        if header != "NL vs LEAP":
            assert header in wide
    assert "\u2026" not in wide and "not shown" not in wide


def test_header_names_an_arrivals_file(capsys, tmp_path):
    stamps = tmp_path / "stamps.csv"
    stamps.write_text("timestamp\n" + "\n".join(str(0.5 * i) for i in range(300)) + "\n")
    out = table(capsys, "--predictor", "none", "--arrivals", str(stamps)).out
    assert f"trace {TRACE} | engine qwen3-8b-h100 | arrivals stamps.csv@sha256:" in out   # the header
