"""Console-script entry points (``[project.scripts]``): set the process up, then run the command.

Two things every command needs before its own code loads:

- One BLAS thread by default. numpy reads ``OPENBLAS_NUM_THREADS`` (and MKL/OpenMP builds their
  variables) once, when it is first imported, so they are set here, before the command module
  imports numpy. Multi-threaded BLAS made ``simulate --predictor all`` cost 5.7x the CPU on two
  cores and changed results with the core count (floating-point sums split across threads); with
  one thread the same seed gives the same figures on any machine. Worker processes (sweeps, Ray)
  inherit the environment. The variables are only defaults: a value the user exported is kept.
- A closed output pipe (``simulate --json | head``) ends the command quietly, as it does ``head``'s
  other writers, instead of a "Broken pipe" error (the commands' one error path, ``core.errors``,
  does the same for a pipe closed during the command; this covers the final flush).

This module imports nothing heavy (``core.errors`` neither): it must run before numpy is loaded.
"""

from __future__ import annotations

import importlib
import os
import sys

from core.errors import BROKEN_PIPE_STATUS, quiet_stdout

#: BLAS/OpenMP thread variables pinned to 1 unless already set.
BLAS_THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
#: capture-traces sizes torch's OpenMP/MKL threads itself (``--threads``); only numpy's OpenBLAS
#: is pinned there, which torch's CPU build does not use.
NUMPY_ONLY_VARS = ("OPENBLAS_NUM_THREADS",)


def pin_blas_threads(names: tuple[str, ...] = BLAS_THREAD_VARS) -> None:
    """Default each variable to one thread; a value already in the environment wins."""
    for name in names:
        os.environ.setdefault(name, "1")


def _run(target: str, thread_vars: tuple[str, ...] = BLAS_THREAD_VARS) -> int:
    pin_blas_threads(thread_vars)
    module, _, func = target.partition(":")
    try:
        status = getattr(importlib.import_module(module), func)()
        sys.stdout.flush()   # a pipe closed after the last write shows up here
        return status
    except BrokenPipeError:
        quiet_stdout()   # the reader went away: nothing more can be shown
        return BROKEN_PIPE_STATUS


def simulate() -> int:
    return _run("experiments.cli:main")


def leap_report() -> int:
    return _run("experiments.report:main")


def evaluate_predictors() -> int:
    return _run("predictors.evaluate:main")


def capture_traces() -> int:
    return _run("capture.cli:main", NUMPY_ONLY_VARS)


def leap_validate() -> int:
    return _run("experiments.validate:main")


def leap_serve() -> int:
    """``leap-serve``, and ``leap-serve calibrate`` (the host's step profile, ``live.calibrate``)."""
    if sys.argv[1:2] == ["calibrate"]:
        del sys.argv[1]
        return _run("live.calibrate:main", NUMPY_ONLY_VARS)
    return _run("live.serve:main", NUMPY_ONLY_VARS)
