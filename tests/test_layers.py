"""The packages stand on floors and import only downwards: a package imports its own modules and
those of packages on LOWER floors, never a sibling on its own floor and never one above. So the
pieces that the live engine reuses (the trace contract, predictors, policies) never drag in the
simulator, and no circle can form. Every import statement counts, also one inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

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
