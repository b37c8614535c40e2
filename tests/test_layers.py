"""The packages stand on floors and import only downwards: a package imports its own modules and
those of packages on LOWER floors, never a sibling on its own floor and never one above. So the
pieces that the live engine reuses (the trace contract, predictors, policies) never drag in the
simulator, and no circle can form. Every import statement counts, also one inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from core.patience import scaled

ROOT = Path(__file__).resolve().parents[1]

#: From the ground up. A new top-level package must be given a floor here.
FLOORS: list[list[str]] = [
    ["core"],                                   # trace contract, io, metrics, read-out, hardware, arrivals
    ["policies", "predictors", "capture", "routers"],  # schedulers, length predictors, the recorder, fleet routers
    ["simulator", "live"],                      # the simulated engine; the vLLM scheduler beside it, never
                                                # importing it (both stand on policies, predictors, capture)
    ["experiments"],                            # command lines, sweeps, report, plots, golden, validation
    ["leap_sched"],                             # vllm serve plugin: the classes vLLM's flags load (imports live)
]
FLOOR_OF = {package: level for level, packages in enumerate(FLOORS) for package in packages}
#: Known imports that still run up, each with its way out; the check fails once one is gone, so the
#: list cannot outlive its reason.
KNOWN_UPWARD: set[tuple[str, str]] = set()


def imported_packages(path: Path) -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import in a file that names a project package."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [(node.lineno, name.split(".")[0]) for name in names if name.split(".")[0] in FLOOR_OF]
    return found


def violations(root: Path) -> list[str]:
    """One line per import that runs sideways or up: ``file:line: pkg (floor i) imports other (floor j)``."""
    out = []
    for package, level in FLOOR_OF.items():
        folder = root / package
        if not folder.is_dir():
            continue
        for path in sorted(folder.rglob("*.py")):
            for line, other in imported_packages(path):
                if (path.relative_to(root).as_posix(), other) in KNOWN_UPWARD and root == ROOT:
                    continue
                if other != package and FLOOR_OF[other] >= level:
                    out.append(f"{path.relative_to(root)}:{line}: {package} (floor {level + 1}) imports "
                               f"{other} (floor {FLOOR_OF[other] + 1})")
    return out


def test_every_import_runs_down_a_floor():
    assert violations(ROOT) == []


def test_known_upward_imports_are_still_there():
    seen = {(path.relative_to(ROOT).as_posix(), other)
            for package in FLOOR_OF if (ROOT / package).is_dir()
            for path in (ROOT / package).rglob("*.py") for _, other in imported_packages(path)}
    assert KNOWN_UPWARD <= seen, f"no longer imported: strike from KNOWN_UPWARD {KNOWN_UPWARD - seen}"


def test_every_package_has_a_floor():
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests"}
    assert packages - set(FLOOR_OF) == set(), "give the new package a floor in FLOORS"


@pytest.mark.parametrize("source, expected", [
    ("from simulator.engine import Simulation\n", ["core/bad.py:1: core (floor 1) imports simulator (floor 3)"]),
    ("def f():\n    import predictors.leap\n", ["core/bad.py:2: core (floor 1) imports predictors (floor 2)"]),
    ("from core.trace import Trace\nfrom . import io\n", []),
])
def test_the_check_sees_an_upward_import(tmp_path, source, expected):
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "bad.py").write_text(source)
    assert violations(tmp_path) == expected


def test_the_check_sees_a_sibling_on_the_same_floor(tmp_path):
    (tmp_path / "capture").mkdir()
    (tmp_path / "capture" / "signal.py").write_text("from predictors.leap import Leap\n")
    assert violations(tmp_path) == ["capture/signal.py:1: capture (floor 2) imports predictors (floor 2)"]


def test_live_never_imports_the_simulator(tmp_path):
    """The live scheduler stands beside the simulator: what both need (policies, predictors, the
    calibration files) sits below them, so a live import of the simulator is a violation."""
    (tmp_path / "live").mkdir()
    (tmp_path / "live" / "calibrate.py").write_text("def fit():\n    from simulator.profiles import make_profile\n")
    assert violations(tmp_path) == ["live/calibrate.py:2: live (floor 3) imports simulator (floor 3)"]


# ----------------------------------------------------------------------------- no circles between modules
def module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_imports(root: Path) -> dict[str, set[str]]:
    """Each project module -> the project modules it imports (every import statement, also one inside
    a function; ``from pkg import sub`` names the submodule ``pkg.sub`` when there is one)."""
    paths = {module_name(root, p): p for package in FLOOR_OF if (root / package).is_dir()
             for p in (root / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(here[:len(here) - node.level + 1] + ([node.module] if node.module else []))
                targets |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in paths else base
                            for alias in node.names}
        graph[name] = {t for t in targets if t in paths and t != name}
    return graph


def import_cycles(root: Path) -> list[list[str]]:
    """The circles of :func:`module_imports`: each strongly connected group of two or more modules, sorted."""
    graph, order, low, stack, out = module_imports(root), {}, {}, [], []

    def visit(v: str) -> None:   # Tarjan's strongly connected components
        order[v] = low[v] = len(order)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in order:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            group = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(graph):
        if v not in order:
            visit(v)
    return sorted(out)


def test_no_module_imports_itself_through_others():
    assert import_cycles(ROOT) == []


def test_the_cycle_check_sees_a_circle_also_through_a_function(tmp_path):
    (tmp_path / "live").mkdir()
    (tmp_path / "live" / "__init__.py").write_text("")
    (tmp_path / "live" / "run.py").write_text("from live.record import record\n")
    (tmp_path / "live" / "record.py").write_text("def record():\n    from live import run\n")
    (tmp_path / "live" / "other.py").write_text("from .run import x\nfrom . import record\n")
    assert import_cycles(tmp_path) == [["live.record", "live.run"]]
    assert module_imports(tmp_path)["live.other"] == {"live.run", "live.record"}


def exponential_draws(root: Path) -> list[str]:
    """``file:line`` of every ``.exponential(`` call in the project's packages."""
    return [f"{path.relative_to(root).as_posix()}:{node.lineno}"
            for package in FLOOR_OF if (root / package).is_dir() for path in sorted((root / package).rglob("*.py"))
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "exponential"]


def test_one_poisson_arrival_process():
    """``core.arrivals.poisson_offsets`` is the one Poisson draw; the simulator and live runs call it."""
    assert [where.split(":")[0] for where in exponential_draws(ROOT)] == ["core/arrivals.py"]


def test_the_poisson_check_sees_a_second_draw(tmp_path):
    (tmp_path / "simulator").mkdir()
    (tmp_path / "simulator" / "workload.py").write_text("import numpy as np\n\n"
                                                        "gaps = np.random.default_rng(0).exponential(2.0, 5)\n")
    assert exponential_draws(tmp_path) == ["simulator/workload.py:3"]


# ----------------------------------------------------------------------------- the engine defines, the runner chooses
#: module -> module-name prefixes it must not reach, directly or through others, and why
KEPT_APART = {
    "simulator.engine": (("simulator.compiled", "simulator.kernel"),
                         "the reference engine is the definition the compiled kernel replays; "
                         "simulator.runner.run_simulation chooses which one runs"),
}


def reached(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for other in graph.get(todo.pop(), set()) - seen:
            seen.add(other)
            todo.append(other)
    return seen


def apart_violations(root: Path) -> list[str]:
    graph = module_imports(root)
    return [f"{module} reaches {other}: {why}" for module, (prefixes, why) in KEPT_APART.items()
            for other in sorted(reached(graph, module)) if other.startswith(prefixes)]


def test_the_engine_does_not_import_the_compiled_kernel():
    assert apart_violations(ROOT) == []


def test_the_apart_check_sees_the_kernel_through_another_module(tmp_path):
    (tmp_path / "simulator").mkdir()
    (tmp_path / "simulator" / "engine.py").write_text("def run():\n    from simulator import scheduler\n")
    (tmp_path / "simulator" / "scheduler.py").write_text("from simulator.kernel_steps import choose\n")
    (tmp_path / "simulator" / "kernel_steps.py").write_text("")
    assert [line.split(":")[0] for line in apart_violations(tmp_path)] == ["simulator.engine reaches simulator.kernel_steps"]


def test_collecting_the_tests_loads_no_numba():
    """A numba loaded in the pytest process breaks every later in-process vLLM engine (tests/conftest.py):
    no test module may import it at collection (found in a clean-clone run: seven engine tests failed)."""
    import subprocess
    import sys

    code = ("import sys, pytest; pytest.main(['-q', '--collect-only', '-p', 'no:cacheprovider', 'tests']); "
            "print('NUMBA', 'numba' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=scaled(600))
    assert "NUMBA False" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
