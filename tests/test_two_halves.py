"""scripts/pytest_two_halves.sh (the test command's runner, scripts/test.sh): the engine tests (marker
``capture``) and the rest run as two pytest processes side by side; every test runs in exactly one
half, a failure in either half fails the command, and the arguments reach both halves; the shared
queue's lines (tests/either_half.txt) each run once, in whichever half ends its own tests first.
Checked on a tiny suite of its own (a temporary folder with its own pytest.ini and queue)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from core.patience import scaled

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "pytest_two_halves.sh"
TESTS = Path(__file__).resolve().parent

INI = """[pytest]
markers =
    capture: an engine test
"""
ENGINE = """import os, pytest

@pytest.mark.capture
def test_engine_a():
    print("ran engine_a in", os.getpid())

@pytest.mark.capture
def test_engine_b():
    assert os.environ.get("FAIL_ENGINE") != "1"
"""
REST = """import os, time
from pathlib import Path

def test_rest_a():
    print("ran rest_a in", os.getpid())
    if os.environ.get("WAIT_FOR_QUEUE"):   # busy until the queue's first test has run elsewhere
        deadline = time.monotonic() + float(os.environ.get("WAIT_S", "60"))
        while not Path(os.environ["WROTE"], "queued_a").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert Path(os.environ["WROTE"], "queued_a").exists(), "no queued test ran while this one waited"

def test_rest_b():
    assert os.environ.get("FAIL_REST") != "1" and "LEAP_TEST_SKIP" not in os.environ
"""


#: the queue's files: each test writes a file when it runs (WROTE names the folder)
QUEUED = """import os
from pathlib import Path

def test_queued_a():
    assert "LEAP_TEST_ONLY" not in os.environ   # a pytest this test started would run all its files
    Path(os.environ["WROTE"], "queued_a").write_text(str(os.getpid()))

def test_queued_b():
    assert os.environ.get("FAIL_QUEUED") != "1"
"""
MORE = """def test_more_a():
    pass
"""
QUEUE = """# a comment line
test_queued.py   # the first line
test_more.py
"""


def _run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    env = {"WROTE": str(tmp_path), "WAIT_S": str(scaled(60)), "PYTHONPATH": str(TESTS), "LEAP_EITHER_HALF": str(tmp_path / "queue.txt"), **env}
    return subprocess.run(["bash", str(SCRIPT), sys.executable, *args], cwd=tmp_path, capture_output=True,
                          text=True, env={**os.environ, **env}, timeout=scaled(300))


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    (tmp_path / "pytest.ini").write_text(INI)
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["either_half"]\n')   # as tests/conftest.py
    (tmp_path / "test_engine.py").write_text(ENGINE)
    (tmp_path / "test_rest.py").write_text(REST)
    return tmp_path


@pytest.fixture
def queued_suite(suite: Path) -> Path:
    (suite / "test_queued.py").write_text(QUEUED)
    (suite / "test_more.py").write_text(MORE)
    (suite / "queue.txt").write_text(QUEUE)
    return suite


def test_the_queue_names_existing_files_once():
    """tests/either_half.txt: each line's files exist; a file named twice would run twice."""
    lines = (line.split("#", 1)[0].split() for line in (TESTS / "either_half.txt").read_text().splitlines())
    files = [name for line in lines for name in line]
    assert files and len(files) == len(set(files)), files
    assert all((TESTS / name).is_file() and name.startswith("test_") for name in files), files


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_each_test_runs_once_in_its_half_and_a_failure_in_either_half_fails(suite):
    ok = _run(suite, "-rA")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    for name in ("test_engine_a", "test_engine_b", "test_rest_a", "test_rest_b"):
        assert ok.stdout.count(f"PASSED test_{name.split('_')[1]}.py::{name}") == 1, ok.stdout
    rest_out, engine_out = ok.stdout.split("the engine tests (-m capture) in", 1)
    assert "2 passed, 2 deselected" in rest_out and "2 passed, 2 deselected" in engine_out, ok.stdout
    assert "test_engine_a" not in rest_out and "test_rest_a" not in engine_out
    for flag in ("FAIL_ENGINE", "FAIL_REST"):
        bad = _run(suite, **{flag: "1"})
        assert bad.returncode == 1, (flag, bad.stdout)
    # the arguments reach both halves: -k selects in each; nothing selected anywhere is pytest's 5
    one = _run(suite, "-k", "engine_a or rest_a", "-rA")
    assert one.returncode == 0 and "PASSED test_engine.py::test_engine_a" in one.stdout, one.stdout
    assert "PASSED test_rest.py::test_rest_a" in one.stdout and "test_rest_b" not in one.stdout, one.stdout
    assert _run(suite, "-k", "no_such_test").returncode == 5


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_each_queue_line_runs_once_and_the_engine_half_takes_lines_when_the_rest_is_busy(queued_suite):
    """The rest half's own test waits until a queued test has run: only the engine half, done with
    its own tests, can have run it. Every test runs once; a failing queued test fails the command."""
    ok = _run(queued_suite, "-rA", WAIT_FOR_QUEUE="1")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    for name in ("engine_a", "engine_b", "rest_a", "rest_b", "queued_a", "queued_b", "more_a"):
        assert len(re.findall(rf"PASSED test_\w+\.py::test_{name}\b", ok.stdout)) == 1, (name, ok.stdout)
    assert re.search(r"the engine half ran queue line 1 \(test_queued\.py\) in \d+ s \(exit 0\)", ok.stdout), ok.stdout
    assert len(re.findall(r"half ran queue line 2 \(test_more\.py\)", ok.stdout)) == 1, ok.stdout
    assert len(re.findall(r"half ran queue line", ok.stdout)) == 2, ok.stdout
    bad = _run(queued_suite, FAIL_QUEUED="1")
    assert bad.returncode == 1, bad.stdout
    # the arguments reach the queue's processes too; nothing selected anywhere is still pytest's 5
    one = _run(queued_suite, "-k", "queued_b or rest_b", "-rA")
    assert one.returncode == 0, one.stdout + one.stderr
    assert re.findall(r"PASSED \S+", one.stdout) == ["PASSED test_rest.py::test_rest_b",
                                                     "PASSED test_queued.py::test_queued_b"], one.stdout
    assert _run(queued_suite, "-k", "no_such_test").returncode == 5


SLEEPER = """import os, time, pytest
from pathlib import Path

@pytest.fixture
def server():
    yield
    Path(os.environ["PID_FILE"] + ".down").write_text("stopped")

@pytest.mark.capture
def test_engine_sleeps(server):
    Path(os.environ["PID_FILE"] + ".tmp").write_text(str(os.getpid()))
    os.replace(os.environ["PID_FILE"] + ".tmp", os.environ["PID_FILE"])
    time.sleep(600)
"""


@pytest.mark.skipif(shutil.which("setsid") is None, reason="needs setsid (util-linux)")
def test_a_term_stops_the_engine_half_too(tmp_path):
    """Ctrl-C or TERM ends the command and the engine half it runs in the background (whose SIGINT a
    script ignores): its fixtures tear down (tests/term_unwinds.py), so no server is left behind."""
    import signal
    import time

    (tmp_path / "pytest.ini").write_text(INI)
    (tmp_path / "test_engine.py").write_text(SLEEPER)
    pid_file = tmp_path / "engine.pid"
    env = {**os.environ, "PID_FILE": str(pid_file), "PYTHONPATH": str(Path(__file__).parent)}
    proc = subprocess.Popen(["bash", str(SCRIPT), sys.executable, "-p", "term_unwinds"], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + scaled(120)
    while not pid_file.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pid_file.exists(), "the engine half never started"
    engine_pid = int(pid_file.read_text())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=scaled(30)) != 0
    deadline = time.monotonic() + scaled(10)
    while _running(engine_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(engine_pid), "the engine half outlived the command"
    assert (tmp_path / "engine.pid.down").exists(), "the engine half's fixtures were not torn down"


def _running(pid: int) -> bool:
    """Alive and not a zombie (a killed orphan waits for init to reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")
