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
