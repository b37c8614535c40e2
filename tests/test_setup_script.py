"""scripts/setup_capture_env.sh without a source of torch's CPU build (no index, no wheel folder):
one line naming what is missing and the two ways to provide it, exit 1, nothing installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from core.patience import scaled

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_no_cpu_torch_anywhere_fails_at_once_with_the_way_out(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    # no configuration file, no index, no wheel folder: pip can offer nothing (and needs no network)
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", VENV=str(tmp_path / "venv"), PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "setup_capture_env.sh")], env=env, cwd=tmp_path,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=scaled(600))
    assert proc.returncode == 1, proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("setup_capture_env.sh: torch 2.13.0+cpu (the CPU build) is in no configured")
    assert "PIP_FIND_LINKS=" in lines[0] and "https://download.pytorch.org/whl/cpu" in lines[0]
    venv_site = list((tmp_path / "venv").glob("lib/python*/site-packages"))
    assert venv_site and not list(venv_site[0].glob("torch*"))   # nothing installed
