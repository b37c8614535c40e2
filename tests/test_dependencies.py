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
