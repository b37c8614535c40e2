"""A compiled fleet's replica tables start at a share of the workload and grow as rows are routed to
them (simulator/replica_growth.py); the outputs are the reference fleet's bytes whatever the sizes:
tables of one row grown at every doubling, on the compiled fleet loop and on the Python walk."""

from __future__ import annotations

import importlib.util
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from core.trace import load_trace, trace_from_arrays
from routers.snapshot import ReplicaAccounting
from simulator.config import EngineConfig
from simulator.profiles import make_profile
from simulator.replica_growth import ROW_COLUMNS, first_capacity, next_capacity
from simulator.replica_table import AccountedTable
from tests.test_fleet_loop import UNIT_FLEETS, _assert_same, _pair, unit_fleet

needs_numba = pytest.mark.skipif(importlib.util.find_spec("numba") is None,
                                 reason="numba is not installed (extra `fast`): the compiled kernel falls back")


def test_capacities_by_hand():
    assert first_capacity(1_000_000, 16) == 62_500 + 7_812 + 64
    assert first_capacity(100, 4) == 92           # 25 + 3 + 64
    assert first_capacity(100, 2) == 100          # 50 + 6 + 64 > 100: the whole workload
    assert first_capacity(10, 1) == 10
    assert next_capacity(100, 101, 1_000) == 200  # doubled
    assert next_capacity(100, 350, 1_000) == 350  # an instant's burst beyond the double
    assert next_capacity(600, 601, 1_000) == 1_000   # never past the workload


def test_every_per_row_array_of_a_table_is_grown():
    """A column added to the request table must be added to ROW_COLUMNS (or it would keep its size)."""
    n = 37
    trace = trace_from_arrays("toy", np.full(n, 4), np.full(n, 3))
    table = AccountedTable(trace, np.full(n, np.inf), ReplicaAccounting(2, None), 0, events=False)
    per_row = {name for name, value in vars(table).items()
               if isinstance(value, np.ndarray) and value.shape[:1] == (n,)}
    aliases = {"fill", "fill_sq"}   # the prompt's own arrays until a preemption gives them their own
    assert per_row - aliases == set(ROW_COLUMNS)
    assert all(len(a) == n for a in table.attributes)


def _one_row_tables():
    """Every replica's first table one row long: it grows at 2, 4, 8, ... rows."""
    return mock.patch("simulator.compiled_fleet.first_capacity", lambda n, replicas: 1)


@needs_numba
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**UNIT_FLEETS)
def test_grown_tables_give_the_reference_bytes_in_the_loop(n, replicas, gaps, lengths, router, policy, predictor,
                                                           seed):
    with _one_row_tables():
        fleets, results = unit_fleet(n, replicas, gaps, lengths, router, policy, predictor, seed)
    _assert_same(fleets, results)
    assert all(r.routed <= r.parts.table.n <= max(n, 1) for r in fleets[1].fleet)


@needs_numba
@pytest.mark.parametrize(("router", "predictor"), [("least-requests", "trail"), ("least-work", "ssjf"),
                                                   ("queue-depth", "none"), ("queue-depth", "leap-rls")])
def test_grown_tables_give_the_reference_bytes_on_the_python_walk(router, predictor):
    trace = load_trace("lmsys")
    with _one_row_tables():
        fleets, results = _pair(trace.take(np.arange(40)), np.linspace(0.0, 2.0, 40), router, "countdown", predictor,
                                3, 0, make_profile("qwen3-8b-h100", trace), EngineConfig(max_resident=6, decode_slots=3))
    assert fleets[1].loop_fallback is not None   # the Python walk ran
    from tests.test_compiled import assert_identical
    assert_identical(*results)
    assert results[0].replica.tolist() == results[1].replica.tolist()
    assert max(r.parts.table.n for r in fleets[1].fleet) < 40   # grown, not whole-workload tables


@needs_numba
def test_a_replica_table_holds_its_share_not_the_workload():
    """Round-robin over 4 replicas, 400 requests: each table 100 + 12 + 64 rows, never grown."""
    trace = load_trace("lmsys")
    fleets, results = _pair(trace.take(np.arange(400)), np.linspace(0.0, 20.0, 400), "round-robin", "fcfs", "none",
                            4, 0, make_profile("qwen3-8b-h100", trace), EngineConfig())
    _assert_same(fleets, results)
    assert [r.parts.table.n for r in fleets[1].fleet] == [176] * 4
    assert [r.routed for r in fleets[1].fleet] == [100] * 4


def test_a_tiled_trace_shares_the_traces_buffers():
    """``tile_trace``'s whole copies are the trace's rows (features included), not copies of them:
    1M requests of a trace with hidden states cost the ids and times, not a million feature rows."""
    import pyarrow as pa

    from core.trace import tile_trace

    trace = load_trace("lmsys")
    tiled = tile_trace(trace, 2 * len(trace) + 5)
    rows = np.concatenate([np.arange(len(trace))] * 2 + [np.arange(5)])
    for column in ("prompt_tokens", "output_tokens", "feat_last"):
        assert tiled.table.column(column).equals(trace.table.take(pa.array(rows)).column(column))
    chunk = tiled.table.column("feat_last").chunks[1]
    first = trace.table.column("feat_last").chunks[0]
    assert chunk.buffers()[-1].address == first.buffers()[-1].address   # the same memory
