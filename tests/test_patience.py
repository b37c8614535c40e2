"""Waits that stretch with the load (core.patience): the server tests' start-up and probe timeouts
and every test's time limit are bounds on a hang, scaled by the load average per CPU (at least 1)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import conftest
import pytest

from core import patience


@pytest.mark.parametrize("load, cpus, factor", [(0.3, 2, 1.0), (2.0, 2, 1.0), (20.0, 2, 10.0), (15.0, 4, 3.75)])
def test_the_factor_is_the_load_per_cpu_at_least_one(monkeypatch, load, cpus, factor):
    monkeypatch.setattr(os, "getloadavg", lambda: (load, 0.0, 0.0))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)))
    assert patience.load_factor() == pytest.approx(factor)
    assert patience.scaled(10.0) == pytest.approx(10.0 * factor)


def _item(marker=None, ini="600"):
    added = []
    item = SimpleNamespace(get_closest_marker=lambda name: marker, add_marker=lambda m, append: added.append(m),
                           config=SimpleNamespace(getini=lambda name: ini))
    return item, added


@pytest.mark.parametrize("marker, want", [(None, 6000.0), (pytest.mark.timeout(120).mark, 1200.0)])
def test_a_tests_limit_is_stretched_before_pytest_timeout_reads_it(monkeypatch, marker, want):
    monkeypatch.setattr(patience, "load_factor", lambda: 10.0)
    item, added = _item(marker)
    hook = conftest.pytest_runtest_protocol(item, None)
    next(hook)   # the part before pytest-timeout's wrapper runs
    assert [m.mark.args for m in added] == [(want,)]


def test_a_quiet_machine_keeps_the_limit(monkeypatch):
    monkeypatch.setattr(patience, "load_factor", lambda: 1.0)
    item, added = _item()
    next(conftest.pytest_runtest_protocol(item, None))
    assert added == []
