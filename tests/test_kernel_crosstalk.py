"""Several policy rules' compiled kernels in one process, each byte-identical to the reference engine.

The bug this holds down: numba names a compiled function by module, qualified name, a per-process
counter (the uid) and argument types, and a function a kernel calls is linked into it as a weak
(``linkonce_odr``) symbol. Two rules' kernels compiled in two processes whose counters ran alike
(two fresh ``simulate`` runs, two test subprocesses) held helpers of the same name with different
bodies (``simulator.kernel_order._rekey_sort`` with each rule's key inlined); loaded from numba's
disk cache into one process, the second kernel's calls went to the first one's helper, so the toy
priority policy replayed with another rule's keys. :func:`simulator.kernel.load_kernel` now names
every function of a rule's kernel after that kernel.

Two tests. :func:`test_no_two_rules_kernels_share_a_compiled_name` holds the naming itself (cheap:
nothing is compiled): it failed before the fix, every helper of every rule's kernel had the same
name. :func:`test_rules_kernels_loaded_together_each_replay_the_reference` (slow: it compiles two
kernels, about 1.5 CPU-minutes) makes the collision certain rather than left to the counters' luck: a first subprocess
compiles each rule's kernel into a fresh numba cache with every uid the same, as if each had been
compiled first in a process of its own; a second loads them all from that cache in the order given
and replays each on both engines. It passed on the code before the fix too (the colliding helper's
calls did not change these runs' bytes), so it guards against cross-talk in general, not this
mechanism alone.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
#: the rules' kernels, in load order: the default one (jitted in place), then the toy of
#: docs/extending.md (a copy whose keys are countdown's with a class added: the helpers that collided
#: had one name and two bodies). Two are enough for a collision; a third (MLFQ's) added 40 CPU-s.
ORDER = ("countdown", "toy-priority")
N = 48


def _policy(name: str):
    from policies import make_policy

    if name == "toy-priority":
        from toy_policy import ToyPriority

        return ToyPriority()
    return make_policy(name)


def _workload():
    import pyarrow as pa

    from core.trace import trace_from_arrays

    rng = np.random.default_rng(11)
    trace = trace_from_arrays("crosstalk", rng.integers(4, 40, N), rng.integers(2, 40, N))
    priority = pa.array(rng.integers(0, 3, N), pa.int64())
    trace = dataclasses.replace(trace, table=trace.table.append_column("priority", priority))
    return trace, np.sort(rng.integers(0, 15, N)).astype(np.float64)


def _run(name: str, kernel: str) -> bytes:
    from predictors import make_predictor
    from simulator.engine import EngineConfig, Simulation
    from simulator.profiles.unit import UnitProfile
    from simulator.runner import run_simulation

    trace, arrival = _workload()
    sim = Simulation(trace, arrival, policy=_policy(name), predictor=make_predictor("oracle"), profile=UnitProfile(),
                     config=EngineConfig(max_resident=16, decode_slots=3, wait_cap=0), charge_cost=False)
    result = run_simulation(sim, kernel)
    return b"".join(a.tobytes() for a in (result.finish_s, result.first_token_s, result.admit_s))


def compile_alike(names) -> None:
    """Compile each rule's kernel into numba's cache with every uid numba hands out the same."""
    from numba.core import bytecode

    bytecode.FunctionIdentity._unique_ids = itertools.repeat(7)   # type: ignore[assignment]
    for name in names:
        _run(name, "compiled")


def compare(names) -> None:
    """Load the rules' kernels from the cache in order; each replays the reference byte for byte."""
    for name in names:
        same = _run(name, "reference") == _run(name, "compiled")
        print(name, "same" if same else "DIFFERS", flush=True)


def _compiled_names(kernel) -> dict[tuple[str, str], int]:
    """(module, qualified name) of every kernel or policy-helper function the jitted ``kernel`` calls,
    found through the globals its plain Python reads (rule modules' own functions left out: one
    body each, shared by every kernel), each with the id of its dispatcher."""
    from numba.core.registry import CPUDispatcher

    from simulator.kernel import KERNEL_MODULES, POLICY_SOURCES

    ours = set(KERNEL_MODULES) | set(POLICY_SOURCES)
    seen: set[int] = set()
    names: dict[tuple[str, str], int] = {}
    todo = [kernel]
    while todo:
        fn = todo.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        py = fn.py_func
        if py.__module__ in ours:
            names[py.__module__, py.__qualname__] = id(fn)
        todo.extend(v for k, v in py.__globals__.items() if isinstance(v, CPUDispatcher) and k in py.__code__.co_names)
    return names


@pytest.mark.skipif(importlib.util.find_spec("numba") is None, reason="numba is not installed")
def test_no_two_rules_kernels_share_a_compiled_name():
    """numba names a compiled function by module, name, a per-process counter and types; with the
    counter alike, only the name keeps two rules' helpers apart. Two kernels share a name only where
    they share the function itself (one dispatcher, one body: a helper that never reaches the rule,
    ``simulator.kernel.rule_free``), and every helper that reaches the rule is each kernel's own.
    Nothing is compiled here."""
    import importlib

    from simulator.kernel import KERNEL_MODULES, load_kernel, rule_free

    kernels = {rule: _compiled_names(load_kernel(rule)) for rule in
               ("policies.countdown", "policies.mlfq", "policies.priority", "policies.boost")}
    assert all(len(names) > 20 for names in kernels.values())   # the walk reaches the helpers
    assert ("simulator.kernel_order", "_rekey_sort") in kernels["policies.countdown"]
    free = rule_free([importlib.import_module(m) for m in KERNEL_MODULES])
    assert "_rekey_sort" not in free and "_heap_push" in free
    for a, b in itertools.combinations(kernels, 2):
        both = kernels[a].keys() & kernels[b].keys()
        assert all(kernels[a][k] == kernels[b][k] for k in both), (a, b, sorted(both)[:5])
        kernel_own = {name for module, name in both if module in KERNEL_MODULES}   # policy files' helpers: by their own names
        assert kernel_own <= free, (a, b, sorted(kernel_own - free)[:5])




@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.skipif(importlib.util.find_spec("numba") is None, reason="numba is not installed")
def test_rules_kernels_loaded_together_each_replay_the_reference(tmp_path):
    # the toy as docs/extending.md's recipe has a user write it (tests/test_extending.py)
    from test_extending import TOY_FILES

    (tmp_path / "toy_policy.py").write_text(textwrap.dedent(TOY_FILES["toy_policy.py"]))
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"),
               PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    order = ",".join(ORDER)
    for step in ("compile", "compare"):
        done = subprocess.run([sys.executable, __file__, step, order], cwd=ROOT, env=env, capture_output=True,
                              text=True)
        assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == [word for name in ORDER for word in (name, "same")], done.stdout


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    step, names = sys.argv[1], sys.argv[2].split(",")
    (compile_alike if step == "compile" else compare)(names)
