"""Every flag of the commands a newcomer runs first says what it does in ``--help``."""

from __future__ import annotations

import argparse
import importlib

import pytest

COMMANDS = {"simulate": "experiments.cli", "evaluate-predictors": "predictors.evaluate",
            "leap-report": "experiments.report", "leap-validate": "experiments.validate"}


@pytest.mark.parametrize("command", COMMANDS)
def test_every_flag_has_help_text(command, monkeypatch):
    parsers: list[argparse.ArgumentParser] = []

    def capture(self, args=None, namespace=None):   # the parser as the command builds it, not run
        parsers.append(self)
        raise SystemExit(0)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    assert importlib.import_module(COMMANDS[command]).main(["--help"]) == 0   # SystemExit(0), as --help
    assert parsers, f"{command} built no parser"
    silent = [a.option_strings for a in parsers[0]._actions if not (a.help or "").strip()]
    assert not silent, f"{command}: flags without help text: {silent}"


#: Every console script and subcommand whose --help a user reads (pyproject's scripts, and the
#: subcommands they dispatch to).
HELP_COMMANDS = [("simulate",), ("capture-traces",), ("evaluate-predictors",), ("leap-report",),
                 ("leap-validate",), ("leap-serve",), ("leap-serve", "calibrate"),
                 *[("capture-traces", sub) for sub in ("prepare-model", "report", "repack", "merge", "signal")]]


@pytest.mark.parametrize("command", HELP_COMMANDS, ids=" ".join)
def test_help_fits_79_columns(command):
    """On an 80-column terminal no --help line wraps (argparse fills the flags' text; the
    descriptions are the modules' docstrings, printed as written)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    func = command[0].replace("-", "_")
    done = subprocess.run([sys.executable, "-c", f"import sys; from experiments.entry import {func} as f; sys.exit(f())",
                           *command[1:], "--help"], capture_output=True, text=True, cwd=Path(__file__).parents[1],
                          env=dict(os.environ, COLUMNS="80"))
    assert done.returncode == 0, done.stderr
    wide = [line for line in done.stdout.splitlines() if len(line) > 79]
    assert not wide, f"{' '.join(command)} --help: {len(wide)} line(s) over 79 columns: {wide[0]!r}"
