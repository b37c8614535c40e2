"""The relied-on vLLM members (leap_sched/vllm/internals.py) checked in vLLM's own sources, unimported:
the installed CPU build's (agreeing with the start-up check) and the current GPU release's wheel
from PyPI (``leap_sched.vllm.vllm_source``; about 10 s to download its 336 MB wheel once, 3 s to check)."""

from __future__ import annotations

import importlib.util
import socket
from pathlib import Path

import pytest

from leap_sched.vllm import internals
from leap_sched.vllm.vllm_source import CURRENT_RELEASE, Source, SourceError, check_source, download

HAVE_VLLM = importlib.util.find_spec("vllm") is not None


def installed_source() -> Source:
    return Source(Path(importlib.util.find_spec("vllm").origin).parents[1])


def pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


@pytest.mark.skipif(not HAVE_VLLM, reason="needs vllm installed (its sources are read, the classes imported)")
def test_installed_sources_hold_every_member_as_the_start_up_check_finds(monkeypatch):
    src = installed_source()
    assert src.version() == internals.installed_version() == "0.32.0"
    assert check_source(src) == {name: [] for _, name, _ in internals.relied_on()}
    assert internals.missing_internals() == []
    # a planted member and parameter are missing in both checks
    monkeypatch.setattr(internals, "REQUEST_FIELDS", (*internals.REQUEST_FIELDS, "no_such_field"))
    monkeypatch.setitem(internals.SIGNATURES, ("Scheduler", "_free_request"), ("request", "no_such_param"))
    assert check_source(src)["Request"] == ["no_such_field"]
    assert check_source(src)["Scheduler"] == ["_free_request(no_such_param)"]
    assert internals.missing_internals() == ["Request.no_such_field", "Scheduler._free_request(no_such_param)"]


@pytest.mark.skipif(not HAVE_VLLM, reason="needs vllm installed (its sources are read)")
def test_a_class_moved_or_renamed_is_reported(monkeypatch):
    monkeypatch.setattr(internals, "CLASSES", (("vllm.v1.request", "Requests", "REQUEST_FIELDS"),))
    assert check_source(installed_source()) == {"Requests": ["<class not found in vllm.v1.request>"]}


def test_not_a_vllm_source_is_bad_input(tmp_path):
    with pytest.raises(SourceError, match="neither a wheel nor a folder holding vllm/__init__.py"):
        Source(tmp_path)


def test_the_current_gpu_release_holds_every_member(tmp_path):
    if not pypi_reachable():
        pytest.skip("PyPI (pypi.org:443) is unreachable: the current release's wheel cannot be downloaded")
    from core.io import cache_dir

    wheel = download(CURRENT_RELEASE, cache_dir() / "vllm-wheels")
    src = Source(wheel)
    assert src.version().startswith(CURRENT_RELEASE.removesuffix("*"))
    assert check_source(src) == {name: [] for _, name, _ in internals.relied_on()}


def test_cli_bad_source_is_one_line_exit_2(tmp_path, capsys):
    from leap_sched.vllm.vllm_source import main

    assert main(["--source", str(tmp_path)]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.strip().splitlines() == [
        f"vllm_source: --source {tmp_path}: neither a wheel nor a folder holding vllm/__init__.py"]
