"""pytest plugin (tests/conftest.py loads it): a TERM unwinds the run as Ctrl-C does, so fixtures
tear down and the servers they started stop. The test command's engine half runs in the background,
where a script ignores SIGINT; it is stopped with TERM (scripts/pytest_two_halves.sh)."""

from __future__ import annotations

import signal


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupt)
