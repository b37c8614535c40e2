"""The one error path of every console script (``simulate``, ``capture-traces``,
``evaluate-predictors``, ``leap-report``, ``leap-validate``, ``leap-serve``).

The project's rule for bad input is one line on stderr naming the problem and exit status 2, never
a usage block or a traceback. argparse prints a usage block and exits by itself, so every command
parses with :class:`OneLineParser`, whose ``error()`` raises :class:`UsageError` instead, and runs
its body through :func:`run_command`, which turns what escapes into one line and a status:

======================================  =====================================================
escapes                                 becomes
======================================  =====================================================
:class:`UsageError` (incl. subclasses   ``PROG: error: MESSAGE`` (first line only), status 2
such as ``CaptureError``) or one of the
command's ``input_errors``
``KeyboardInterrupt``                   ``PROG: interrupted[; HINT]``, status 130
``BrokenPipeError`` (reader went away)  nothing; stdout pointed at /dev/null, status 141
``SystemExit`` (``--help``)             its own status
any other exception                     ``PROG: error: Type: MESSAGE (LEAP_DEBUG=1 for the
                                        traceback)``, status 1; re-raised with LEAP_DEBUG=1
======================================  =====================================================

Nothing heavy is imported here: ``experiments.entry`` may load this before numpy.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

#: Exit status of bad input, of an interrupt and of a closed output pipe (as a shell reports SIGPIPE).
USAGE_STATUS, INTERRUPT_STATUS, BROKEN_PIPE_STATUS = 2, 130, 128 + 13
#: Set (to anything) to see the traceback of an unexpected error instead of its one line.
DEBUG_VARIABLE = "LEAP_DEBUG"


class UsageError(Exception):
    """Bad input (flag, value, file): printed as one line on stderr, exit status 2."""


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors raise :class:`UsageError` (one line) instead of printing a
    usage block and exiting. A subcommand's parser (``prog="capture-traces merge"``) names its
    subcommand first: ``capture-traces: error: merge: the following arguments are required: ...``."""

    _argv: list[str] = []

    def parse_known_args(self, args=None, namespace=None):
        self._argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        _, _, subcommand = self.prog.partition(" ")
        unknown = self._unknown_flags()
        if unknown and message.startswith("the following arguments are required"):
            message = f"unrecognized arguments: {' '.join(unknown)}"   # the typo, not what it hid
        raise UsageError(f"{subcommand}: {message}" if subcommand else message)

    def _unknown_flags(self) -> list[str]:
        """Flags on the command line that no option of this parser takes (argparse names missing
        required arguments before them, so ``report --bogus`` would say a trace is missing)."""
        unknown = []
        for token in self._argv:
            if token == "--":
                break
            if not token.startswith("-") or token == "-" or self._negative_number_matcher.match(token):
                continue
            flag = token.split("=", 1)[0]
            if flag in self._option_string_actions:
                continue
            if self.allow_abbrev and flag.startswith("--") and any(
                    option.startswith(flag) for option in self._option_string_actions):
                continue
            unknown.append(flag)
        return unknown


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message (or its type's name)."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def say(prog: str, message: str) -> None:
    print(f"{prog}: {message}", file=sys.stderr, flush=True)


def run_command(command: Callable[[list[str]], int | None], argv: Sequence[str] | None, prog: str, *,
                input_errors: tuple[type[BaseException], ...] = (),
                interrupt_hint: str | None = None) -> int:
    """Run ``command(argv)`` (``argv`` defaults to ``sys.argv[1:]``) and return its exit status,
    mapping what escapes to one stderr line as in the module's table. ``input_errors`` are the
    command's own bad-input exceptions besides :class:`UsageError` (e.g. ``TraceError``, ``OSError``
    where every OS error is about a named input or output path)."""
    args = list(sys.argv[1:] if argv is None else argv)
    bad_input: tuple[type[BaseException], ...] = (UsageError, *input_errors)
    try:
        status = command(args)
        return 0 if status is None else int(status)
    except BrokenPipeError:   # first: it is an OSError, which some commands count as bad input
        quiet_stdout()
        return BROKEN_PIPE_STATUS
    except bad_input as exc:
        say(prog, f"error: {first_line(exc)}")
        return USAGE_STATUS
    except SystemExit as exc:   # --help / --version: argparse printed what was asked
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else USAGE_STATUS)
    except KeyboardInterrupt:
        say(prog, "interrupted" + (f"; {interrupt_hint}" if interrupt_hint else ""))
        return INTERRUPT_STATUS
    except Exception as exc:   # a last net: one line, not a traceback
        if os.environ.get(DEBUG_VARIABLE):
            raise
        say(prog, f"error: {type(exc).__name__}: {first_line(exc)} ({DEBUG_VARIABLE}=1 for the traceback)")
        return 1


def quiet_stdout() -> None:
    """After the reader of stdout went away: point stdout at /dev/null, so that the interpreter's
    final flush does not print a second error."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):   # stdout is not a file (captured): nothing to silence
        pass
    finally:
        os.close(devnull)
