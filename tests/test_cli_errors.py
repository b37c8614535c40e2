"""Every console script shares one error path (``core.errors``): a bad flag or an unknown value is
exactly one stderr line and exit 2; Ctrl-C is one line and 130; a closed pipe is quiet; anything
unexpected is one line and exit 1 (a traceback only with LEAP_DEBUG=1)."""

from __future__ import annotations

import sys

import pytest

from core.errors import OneLineParser, UsageError, run_command
from experiments import entry

MODEL = "/nonexistent-model"
#: console script -> (a bad flag, an unknown value): each must be refused before any work starts
CASES = {
    "simulate": (["--no-such-flag"], ["--policy", "no-such-policy"]),
    "capture-traces": (["--model", MODEL, "--prompts", "lmsys", "--out", "x.parquet", "--no-such-flag"],
                       ["--model", MODEL, "--prompts", "lmsys", "--out", "x.parquet", "--backend", "nope"]),
    "evaluate-predictors": (["--no-such-flag"], ["--ablation", "nope"]),
    "leap-report": (["--no-such-flag"], ["--jobs", "many"]),
    "leap-validate": (["--no-such-flag"], ["--requests", "some"]),
    "leap-serve": (["--from", "lmsys", "--no-such-flag"], ["--from", "lmsys", "--scheduler", "nope"]),
}


@pytest.mark.parametrize("kind", ["bad flag", "unknown value"])
@pytest.mark.parametrize("command", sorted(CASES))
def test_bad_input_is_one_line_and_exit_2(command, kind, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    args = CASES[command][0 if kind == "bad flag" else 1]
    monkeypatch.setattr(sys, "argv", [command, *args])
    status = getattr(entry, command.replace("-", "_"))()
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert status == 2, err
    assert len(lines) == 1 and lines[0].startswith(f"{command}: error: "), err
    assert out == "" and list(tmp_path.iterdir()) == []


def test_subcommand_parsers_name_their_subcommand(capsys):
    from capture.cli import main

    assert main(["merge"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["capture-traces: error: merge: the following arguments are required: OUT.parquet, SHARD.parquet"]


@pytest.mark.parametrize("argv, flag", [(["merge", "--no-such-flag"], "merge: unrecognized arguments: --no-such-flag"),
                                        (["report", "--bogus=1"], "report: unrecognized arguments: --bogus"),
                                        (["--bogus"], "error: unrecognized arguments: --bogus")])
def test_an_unknown_flag_is_named_before_missing_arguments(capsys, argv, flag):
    """argparse names missing required arguments first (`report --bogus` said a trace was missing):
    the unknown flag is what the user typed wrong, so it is named instead."""
    from capture.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("capture-traces: error: ") and err[0].endswith(flag), err


def _raise(exc):
    def command(argv):
        raise exc
    return command


@pytest.mark.parametrize("exc, status, line", [
    (UsageError("bad value\nsecond line"), 2, "prog: error: bad value"),
    (KeyboardInterrupt(), 130, "prog: interrupted; rerun it"),
    (RuntimeError("broke\nmore"), 1, "prog: error: RuntimeError: broke (LEAP_DEBUG=1 for the traceback)"),
    (FileNotFoundError("gone"), 2, "prog: error: gone"),          # one of this command's input errors
])
def test_run_command_maps_each_exception_to_one_line(exc, status, line, capsys, monkeypatch):
    monkeypatch.delenv("LEAP_DEBUG", raising=False)
    assert run_command(_raise(exc), [], "prog", input_errors=(OSError,), interrupt_hint="rerun it") == status
    assert capsys.readouterr().err.splitlines() == [line]


def test_unexpected_error_shows_its_traceback_with_leap_debug(monkeypatch):
    monkeypatch.setenv("LEAP_DEBUG", "1")
    with pytest.raises(RuntimeError):
        run_command(_raise(RuntimeError("broke")), [], "prog")


def test_help_and_return_status_pass_through(capsys):
    parser = OneLineParser(prog="prog")
    assert run_command(lambda argv: parser.parse_args(argv) and None, ["--help"], "prog") == 0
    assert "usage: prog" in capsys.readouterr().out
    assert run_command(lambda argv: 3, [], "prog") == 3
    assert run_command(lambda argv: None, [], "prog") == 0


def test_closed_pipe_is_quiet(capsys):
    # also where OSError counts as bad input: a closed pipe is not the user's mistake
    assert run_command(_raise(BrokenPipeError()), [], "prog", input_errors=(OSError,)) == 141
    assert capsys.readouterr().err == ""
