"""Byte-identical across numpy releases: scripts/check_numpy_versions.py builds a venv with the other
of numpy 2.3.5 / 2.4 (PyPI) and compares a reduced leap-report byte for byte. About 70 CPU-s
(the script's docstring); skipped, with the reason, where no package index is reachable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from core.patience import scaled

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_reduced_report_is_byte_identical_under_the_other_numpy(tmp_path):
    pytest.importorskip("matplotlib", reason="the report draws figures with matplotlib")
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_numpy_versions.py"), "--keep",
                           str(tmp_path / "work")], capture_output=True, text=True, timeout=scaled(1740))
    if done.returncode == 2:
        pytest.skip(done.stderr.strip())
    assert done.returncode == 0, done.stderr
    assert "byte-identical" in done.stdout
