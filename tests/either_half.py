"""pytest plugin (tests/conftest.py loads it): which test files this pytest process runs, for the
test command's shared queue (scripts/pytest_two_halves.sh, the queue in tests/either_half.txt).

The script runs the suite as two processes side by side, the engine tests (``-m capture``) and the
rest; a set of slow files that start no engine waits in a queue, and whichever half ends first takes
the next line, in a pytest process of its own. It tells each process which files are its own:

- ``LEAP_TEST_ONLY="test_a.py test_b.py"``: only those files (a queue line);
- ``LEAP_TEST_SKIP="test_a.py ..."``: every file but those (the rest half's own part: the queued files).

Both select by file name, after the user's arguments and ``-m`` (which the script passes to every
process), so every test runs in exactly one process. Files outside the selection are not imported
either (only a speed-up: the items are selected again after collection, as a file named on the
command line is collected even when ignored). The variables are taken out of the environment when
pytest starts: a pytest a test runs in a subprocess (docs/extending.md's recipe check) selects as
if run by hand."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

#: (only these file names or None, all but these or None), read once when pytest starts
_SELECTION = pytest.StashKey[tuple[set[str] | None, set[str] | None]]()


def _take(var: str) -> set[str] | None:
    value = os.environ.pop(var, None)
    return None if value is None else set(value.split())


def pytest_configure(config) -> None:
    config.stash[_SELECTION] = (_take("LEAP_TEST_ONLY"), _take("LEAP_TEST_SKIP"))


def _keep(config, path: Path) -> bool:
    only, skip = config.stash[_SELECTION]
    return (only is None or path.name in only) and (skip is None or path.name not in skip)


def pytest_ignore_collect(collection_path: Path, config) -> bool | None:
    if collection_path.suffix == ".py" and collection_path.name.startswith("test_") and not _keep(config, collection_path):
        return True
    return None


def pytest_collection_modifyitems(config, items) -> None:
    dropped = [item for item in items if not _keep(config, item.path)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if _keep(config, item.path)]
