"""Sweeps stop on SIGINT/SIGTERM without waiting for the runs in progress, leave no orphan workers,
keep finished runs, and a rerun of the same command skips the runs already complete (judged by
their stored config).

No test races a wall-clock deadline, so they hold on a loaded machine: each waits for an event (a
run's summary.json on disk, the streamed results table, the process's exit), and once a run has
finished the workers are frozen (SIGSTOP) before the signal, so the sweep can neither finish
meanwhile nor stop by waiting for its runs: it stops only by killing its workers. The time limits
left (pytest-timeout, ``communicate``'s) only bound a failure, e.g. a sweep waiting for frozen
workers.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiments.cli import main

ROOT = Path(__file__).resolve().parents[1]
# 24 runs of about 0.7 s each (two decode slots make many steps): the workers are frozen after the
# first finishes, far from the end of the sweep (a sweep that ends before the signal proves nothing)
SWEEP = ["--trace", "sharegpt-lengths", "--predictor", "none,oracle", "--load", "1x,2x", "--seeds", "6",
         "--requests", "400", "--decode-slots", "2", "--jobs", "2", "--quiet", "--json"]
RUNS = 24
#: Bounds a failure only (a sweep that waits for frozen workers, workers that outlive their parent).
HUNG_S = 120

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc for worker pids")


@pytest.fixture
def env(tmp_path_factory):
    env = dict(os.environ, LEAP_CACHE_DIR=str(tmp_path_factory.getbasetemp() / "cache"))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """Running or sleeping (a zombie left for an init that does not reap is dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def default_signals() -> None:
    """The sweep as started from a terminal: SIGINT and SIGTERM at their defaults (a test process
    may have inherited SIGINT ignored, e.g. under a background shell, and children inherit that)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.fixture
def launch(env):
    """Starts a sweep and waits for its first finished run; a sweep a failed test leaves running is
    killed with its workers at teardown."""
    started: list[tuple[subprocess.Popen, list[int]]] = []

    def start(out: Path) -> tuple[subprocess.Popen, list[int]]:
        proc = subprocess.Popen([sys.executable, "-m", "experiments.cli", *SWEEP, "--out", str(out)], env=env,
                                preexec_fn=default_signals,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        started.append((proc, []))
        wait_for(lambda: list(out.glob("*/summary.json")), proc)
        workers = children(proc.pid)
        started[-1] = (proc, workers)
        assert workers, "the sweep runs in worker processes"
        return proc, workers

    yield start
    for proc, workers in started:
        for pid in [proc.pid, *workers]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            stream.close()


def wait_for(condition, proc: subprocess.Popen) -> None:
    """Poll until ``condition()`` holds; the sweep ending first fails (pytest-timeout bounds a hang)."""
    while not condition():
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)


def freeze(pids: list[int]) -> None:
    """Stop the workers where they are: no further run finishes until they are killed."""
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)


def wait_gone(pids: list[int], timeout_s: float = HUNG_S) -> list[int]:
    """Wait for each process to exit (its pidfd becomes readable then); returns those still alive."""
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            poller.poll(timeout_s * 1000)
        finally:
            os.close(fd)
    return [p for p in pids if alive(p)]


def check_run_folders(out: Path) -> int:
    """Every folder left is a complete, readable run; returns how many there are."""
    import pyarrow.parquet as pq

    assert not list(out.glob("**/.*.tmp"))
    complete = 0
    for folder in out.iterdir():
        if not folder.is_dir():
            continue
        if (folder / "summary.json").exists():
            assert json.loads((folder / "summary.json").read_text())["completed"] == 400
            assert json.loads((folder / "config.json").read_text())["requests_used"] == 400
            assert pq.read_table(folder / "requests.parquet").num_rows == 400
            complete += 1
    return complete


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_stops_sweep_without_waiting_keeps_finished_runs(tmp_path, launch, signum):
    out = tmp_path / "sweep"
    proc, workers = launch(out)
    freeze(workers)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=HUNG_S)   # frozen workers: it ends only by killing them
    assert proc.returncode == 128 + signum
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("simulate: interrupted: "), err
    finished = check_run_folders(out)
    assert 1 <= finished < RUNS
    assert lines[0] == f"simulate: interrupted: {finished} of {RUNS} runs finished, kept in {out}"
    assert not [p for p in workers if alive(p)], "orphan workers"
    check_partial_results(out, finished)


def check_partial_results(out: Path, finished: int) -> int:
    """The streamed results table of a stopped sweep: valid Parquet and CSV, one row per run whose
    result reached the parent (at most the complete folders), each equal to its folder's summary."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    if not (out / "results.parquet").exists():
        return 0
    table = pq.read_table(out / "results.parquet")
    assert 1 <= table.num_rows <= finished
    assert pacsv.read_csv(out / "results.csv").num_rows == table.num_rows
    for row in table.to_pylist():
        at = f"{row['load']:g}x"
        summary = json.loads((out / f"{row['predictor']}-{row['policy']}-{at}-seed{row['seed']}" / "summary.json")
                             .read_text())
        assert row["mean_e2e_s"] == summary["mean_e2e_s"] and row["completed"] == summary["completed"]
    return table.num_rows


def test_results_table_streams_and_survives_a_stop(tmp_path, launch):
    """Each finished run reaches results.parquet while the sweep runs; SIGINT leaves it valid."""
    out = tmp_path / "sweep"
    proc, workers = launch(out)
    wait_for(lambda: (out / "results.parquet").exists(), proc)   # streamed before the sweep ends
    freeze(workers)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=HUNG_S)
    assert proc.returncode == 130
    assert check_partial_results(out, check_run_folders(out)) >= 1


@pytest.mark.timeout(1800)   # 47 runs in all: on a fully loaded core they took over the default 900 s
def test_rerun_skips_finished_runs_and_matches_an_uninterrupted_sweep(tmp_path, launch, capsys):
    out = tmp_path / "sweep"
    proc, workers = launch(out)
    freeze(workers)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=HUNG_S)
    finished = check_run_folders(out)
    assert finished < RUNS
    kept = {p: p.stat().st_mtime_ns for p in out.glob("*/summary.json")}
    assert main([*SWEEP, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"skipped {finished} of {RUNS} runs already complete in {out}" in err
    assert {p: p.stat().st_mtime_ns for p in kept} == kept     # reused, not rewritten
    assert check_run_folders(out) == RUNS
    assert main([*SWEEP, "--out", str(tmp_path / "whole")]) == 0
    for name in ("results.parquet", "results.csv"):
        assert (out / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()


def test_parent_killed_takes_its_workers_with_it(tmp_path, launch):
    proc, workers = launch(tmp_path / "sweep")
    proc.kill()
    proc.wait()
    assert not wait_gone(workers), "workers outlived a killed parent"
    proc.communicate(timeout=HUNG_S)   # the pipes close once no worker holds them


def test_kill_9_leaves_a_results_table_listing_every_complete_run(tmp_path, launch):
    """kill -9 of the sweep's process (no handler runs): results.csv/parquet still list every complete
    run folder, because the table is rewritten after each run before its summary.json marks it
    complete (at most one more row: a run killed between the two, whose folder a rerun redoes)."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    out = tmp_path / "sweep"
    proc, workers = launch(out)
    wait_for(lambda: len(list(out.glob("*/summary.json"))) >= 3, proc)   # several runs, streamed quickly
    freeze(workers)
    proc.kill()
    proc.wait()
    assert not wait_gone(workers), "workers outlived a killed parent"
    proc.communicate(timeout=HUNG_S)
    # (a write cut by kill -9 may leave its temporary file: nothing can remove it at that moment)
    complete = {folder.name for folder in out.iterdir() if (folder / "summary.json").exists()}
    assert len(complete) >= 3
    # each table is rewritten before the mark, so each lists every complete run (the kill may fall
    # between the parquet's and the csv's rewrite: they may differ by the run being written)
    for table in (pq.read_table(out / "results.parquet"), pacsv.read_csv(out / "results.csv")):
        listed = {f"{r['predictor']}-{r['policy']}-{r['load']:g}x-seed{r['seed']}" for r in table.to_pylist()}
        assert complete <= listed and len(listed - complete) <= 1, (sorted(complete), sorted(listed))


def test_changed_config_or_incomplete_run_is_recomputed(tmp_path, capsys):
    base = ["--trace", "sharegpt-lengths", "--predictor", "none,oracle", "--requests", "120", "--jobs", "1",
            "--quiet", "--json", "--out", str(tmp_path)]
    assert main(base) == 0
    first = capsys.readouterr().out
    assert main([*base, "--decode-slots", "8"]) == 0     # same folder names, another config
    changed = capsys.readouterr()
    assert "skipped" not in changed.err and changed.out != first
    (tmp_path / "oracle-countdown-1x-seed0" / "summary.json").unlink()   # as if killed mid-run
    assert main([*base, "--decode-slots", "8"]) == 0
    again = capsys.readouterr()
    assert "skipped 1 of 2 runs" in again.err
    assert [json.loads(x)["mean_e2e_s"] for x in again.out.splitlines()] == [
        json.loads(x)["mean_e2e_s"] for x in changed.out.splitlines()]
