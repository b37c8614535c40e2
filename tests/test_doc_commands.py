"""Every command in a ```bash block of README.md and docs/*.md runs as written.

Each block line (continuations joined, comment lines dropped, a ``VAR=value`` line kept for the
lines after it) runs through ``bash`` in a scratch copy of the checkout: its top-level entries
linked, ``../shared/data`` linked beside it when the data folder exists, and the console scripts
(``simulate``, ``leap-validate``, ...) and ``python`` on ``PATH`` importing this checkout. So the
relative paths of the docs (``traces/...``, ``docs/examples/...``, ``../shared/data/...``) mean
what they mean to a user, and every file a command writes (``--out runs/sweep``, a read-out) lands
in the scratch folder.

Bounded to about a minute on two cores, by one rule each, all in this file:
- ``simulate`` gets ``--requests 200`` unless the command names ``--requests``, ``--config``,
  ``--tile`` or a hand example (``--trace docs/examples/...``, run whole) (``--requests`` only shortens the trace: every flag still parses, every check runs,
  every run and output is made). ``--tile N`` is cut to 2,000 requests the same way.
- commands in :data:`NOT_RUN` are not run here, each for the reason given (installs from an index,
  the whole suite, a live server, minutes of runs that another test already runs small).
- commands in :data:`SLOW` (each 15-60 CPU-s: the serving runs' validations, the every-predictor
  sweep) run only with ``LEAP_DOC_COMMANDS=all``; otherwise they skip saying so.
- ``python3 -m venv`` and ``pip install`` steps joined by ``&&`` are not run (network); the extras
  they name must exist in pyproject.toml, and the rest of the line runs.
- a command naming ``../shared`` skips, saying so, where the data folder is absent.
- a command given in several places (the same text once bounded) runs once; each place's test reads
  that run's result.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import tomllib

from core.io import DataDirMissing, data_dir
from core.patience import scaled

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
EXTRAS = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
SIM_REQUESTS, SIM_TILE = 200, 2000

#: A command starting with one of these (a regular expression) is not run here; the value says why.
NOT_RUN = {
    "bash scripts/test.sh": "the whole test suite (the integrator runs it)",
    "pip install": "installs from an index (network); its extras are checked against pyproject.toml",
    "leap-report": "minutes of runs; tests/test_report.py runs it end to end on a small load",
    "leap-serve --server": "needs a running `vllm serve` (tests/test_serve_plugin.py starts one)",
    "bash scripts/live_server_runs.sh": "records live runs against `vllm serve` (capture env, an hour)",
    "python -m leap_sched.vllm.check --model MODEL": "MODEL is the user's; tests/test_serve_plugin.py "
                                                    "runs the check on the bundled model",
    "git clone ": "clones this repository: the test runs in a checkout already",
    "bash scripts/setup_capture_env.sh": "builds the capture environment (scripts/test.sh builds it before the tests)",
    r"(python3? -m venv \S+ && )?\. \S+/bin/activate": "activates a virtual environment the lines above made",
    r"python -m leap_sched\.vllm\.vllm_source --vllm": "downloads vLLM's wheel (336 MB); tests/test_vllm_source.py "
                                                        "runs the same check",
    "python -m leap_sched.vllm.check --platform gpu --model MODEL": "a GPU operator's model; tests/test_serve_plugin.py "
                                                                   "runs the check on the bundled model",
    "LEAP_ALLOW_UNTESTED_VLLM=1 <the printed": "starts a GPU server from the printed command",
    "python scripts/fetch_data.py$": "downloads from the public hosts (network); tests/test_shared_data.py "
                                     "checks the download path and the hashes offline",
}
#: Lines that read ../shared/data without naming it.
NEEDS_DATA = ("python scripts/fetch_data.py --check",)
#: Run only with LEAP_DOC_COMMANDS=all: a prefix of the command -> why it is slow and what holds it.
SLOW = {
    "leap-validate traces/live/": "replays every serving run of a set (15-30 CPU-s each); "
                                  "tests/test_validate_live.py and tests/test_interleaved_sets.py hold them",
    "simulate --predictor all": "about 50 runs (a minute of CPU); tests/test_simulate_cli.py runs sweeps",
    "python benchmarks/bench_public_trace.py": "a benchmark: a million tiled requests' start-up and memory",
}
SETUP_STEP = re.compile(r"^(python3? -m venv \S+|(\S*/)?pip install .*)$")
FENCE = re.compile(r"^( *)```bash\n(.*?)^\1```", re.S | re.M)


def doc_commands() -> list[tuple[str, str, dict[str, str]]]:
    """(where, command, variables set by earlier lines of its block) for every fenced bash line."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for block in FENCE.finditer(text):
            line_no = text[:block.start()].count("\n") + 2
            variables: dict[str, str] = {}
            lines = [line[len(block.group(1)):] for line in block.group(2).splitlines()]
            joined = "\n".join(lines).replace("\\\n", " ")
            for offset, line in enumerate(joined.splitlines()):
                line = line.split("  #")[0].strip()
                if not line or line.startswith("#"):
                    continue
                assignment = re.fullmatch(r"([A-Z_]+)=(\S+)", line)
                if assignment:
                    variables[assignment.group(1)] = assignment.group(2)
                    continue
                found.append((f"{doc.relative_to(ROOT)}:{line_no + offset}", line, dict(variables)))
    return found


def _bounded(command: str) -> str:
    """The command with the simulate bound of the module docstring."""
    def bound(match: re.Match) -> str:
        text = match.group(0)
        text = re.sub(r"--tile \d+", f"--tile {SIM_TILE}", text)
        if not re.search(r"--(requests|config|tile)\b|--trace docs/examples/", text):
            text += f" --requests {SIM_REQUESTS}"
        return text
    return re.sub(r"\bsimulate\b[^;|&]*", bound, command)


def _runnable(command: str) -> str:
    """The part of a line that runs here: set-up steps (venv, pip) checked and dropped."""
    kept = []
    for step in (s.strip() for s in command.split("&&")):
        if SETUP_STEP.match(step):
            for extra in re.findall(r"\[([a-z,]+)\]", step):
                assert set(extra.split(",")) <= EXTRAS, f"{step!r}: no such extra in pyproject.toml"
            continue
        kept.append(re.sub(r"^\.venv/bin/", "", step))
    return " && ".join(kept)


def _scratch(base: Path) -> Path:
    """A checkout of links, console scripts on PATH, ../shared/data beside it when it exists."""
    checkout, bin_dir = base / "checkout", base / "bin"
    checkout.mkdir()
    bin_dir.mkdir()
    for entry in ROOT.iterdir():
        if not entry.name.startswith("."):
            (checkout / entry.name).symlink_to(entry)
    try:
        (base / "shared").mkdir()
        (base / "shared" / "data").symlink_to(data_dir())
    except DataDirMissing:
        pass
    launchers = {"python": f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n'}
    for name, target in SCRIPTS.items():
        module, _, func = target.partition(":")
        launchers[name] = (f"#!{sys.executable}\nimport sys\nsys.argv[0] = {name!r}\n"
                           f"from {module} import {func}\nsys.exit({func}())\n")
    for name, text in launchers.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return checkout


def _plan(where: str, command: str, variables: dict[str, str], has_data: bool) -> tuple[str | None, str]:
    """(why it is not run, or None; the command as it runs here)."""
    if command.startswith("pip install"):
        _runnable(command)   # its extras exist
    reason = next((why for prefix, why in NOT_RUN.items() if re.match(prefix, command)), None)
    command = _bounded(_runnable(command))
    for name, value in variables.items():
        command = command.replace(f"${name}", value)
    slow = next((why for prefix, why in SLOW.items() if command.startswith(prefix)), None)
    if reason is None and slow and os.environ.get("LEAP_DOC_COMMANDS") != "all":
        reason = f"slow, runs with LEAP_DOC_COMMANDS=all: {slow}"
    if reason is None and ("../shared" in command or command.startswith(NEEDS_DATA)) and not has_data:
        reason = "needs ../shared/data (the prompt sets and arrival traces), absent here"
    return reason, command


COMMANDS = doc_commands()


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> dict[str, subprocess.CompletedProcess | str]:
    """Every command's result (or why it did not run), two at a time: the machine has two cores."""
    checkout = _scratch(tmp_path_factory.mktemp("docs"))
    has_data = (checkout.parent / "shared" / "data").exists()
    env = dict(os.environ, PATH=f"{checkout.parent / 'bin'}{os.pathsep}{os.environ['PATH']}",
               PYTHONPATH=str(ROOT), COLUMNS="100", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
               MKL_NUM_THREADS="1")
    if has_data:   # the scripts resolve their checkout past the links: name the data folder
        env["LEAP_DATA_DIR"] = str(checkout.parent / "shared" / "data")
    results: dict[str, subprocess.CompletedProcess | str] = {}
    where_run: dict[str, list[str]] = {}   # a command the docs give in several places runs once
    for where, command, variables in COMMANDS:
        reason, command = _plan(where, command, variables, has_data)
        if reason:
            results[where] = reason
        else:
            where_run.setdefault(command, []).append(where)

    def run(command: str) -> None:
        done = subprocess.run(["bash", "-c", command], cwd=checkout, env=env, capture_output=True, text=True,
                              timeout=scaled(600))
        for where in where_run[command]:
            results[where] = done

    todo = list(where_run)
    if todo:   # the first alone: a cold numba cache compiles the kernel once, not in two processes at once
        run(todo[0])
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(run, todo[1:]))
    return results


def test_the_docs_hold_commands():
    assert len(COMMANDS) >= 30, [c for _, c, _ in COMMANDS]


@pytest.mark.parametrize("where, command", [(w, c) for w, c, _ in COMMANDS], ids=[w for w, _, _ in COMMANDS])
def test_doc_command_runs(where, command, ran):
    done = ran[where]
    if isinstance(done, str):
        pytest.skip(f"{where}: not run here: {done}")
    assert done.returncode == 0, (f"{where}: {done.args[-1]} exited {done.returncode}:\n"
                                  f"{done.stderr[-2000:]}")
