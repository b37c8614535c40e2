"""``leap-serve --server URL``: the serving run driven over HTTP against a real ``vllm serve`` with the plugin.

One server (FCFS, 1 decode slot of 8), seven forced-length alpaca requests sent 1.5 s apart by
``leap-serve --server`` (an arrival CSV): the trace loads, its columns are consistent, the
requests finished in arrival order through HTTP, its metadata holds what the server reported,
and ``leap-validate`` replays it at a committed calibration's profile. The bad-input tests need
no vLLM: an unreachable URL, and a server that answers ``/health`` without the plugin's settings
endpoint, are refused with one line and exit 2 before anything is written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from vllm_server import HAVE, MODEL, ROOT, SKIP_REASON

from core.patience import scaled

SPACING_S = 1.5            # between sends
EARLY_S = 0.05             # the client never sends before the planned time (a timer may wake this early)
N = 7
MAX_LENGTH = 12
CALIBRATION = ROOT / "traces" / "live" / "calibration" / "alpaca100-1.3.calibration.json"


def run_cli(args: list[str], tmp_path: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", LEAP_CACHE_DIR=str(tmp_path / "cache"))
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def serve_args(url: str, out: Path, arrivals: str = "poisson") -> list[str]:
    extra = ["--rate", "1"] if arrivals == "poisson" else []
    return ["-m", "live.serve", "--server", url, "--from", "traces/alpaca.parquet", "--requests", str(N),
            "--force-lengths", "--max-length", str(MAX_LENGTH), "--max-resident", "8", "--decode-slots", "1",
            "--wait-cap", "0", "--max-model-len", "512", "--max-num-batched-tokens", "512", "--dtype", "float32",
            "--arrivals", arrivals, *extra, "--out", str(out), "--model", str(MODEL)]


# ----------------------------------------------------------------------------- bad input (no vLLM)
def test_unreachable_server_is_refused_before_anything(tmp_path):
    import socket

    with socket.socket() as s:           # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "run.parquet"
    r = run_cli(serve_args(f"http://127.0.0.1:{port}", out), tmp_path, timeout=scaled(120))
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().count("\n") == 0 and f"--server http://127.0.0.1:{port}: cannot reach it" in r.stderr
    assert not out.exists() and not out.with_name(out.name + ".parts").exists()


class _NoPlugin(BaseHTTPRequestHandler):
    """A server that is up (``/health``) but has no ``/leap_sched/settings``: vLLM without the plugin."""

    def do_GET(self):  # noqa: N802 -- http.server's name
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("flags, want", [
    ((), "does not run the leap_sched plugin"),
    (("--threads", "0"), "--server: --threads applies to the in-process engine"),
])
def test_server_without_the_plugin_or_in_process_flags_are_refused(tmp_path, flags, want):
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _NoPlugin)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        out = tmp_path / "run.parquet"
        r = run_cli([*serve_args(f"http://127.0.0.1:{httpd.server_address[1]}", out), *flags], tmp_path, timeout=scaled(120))
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and want in r.stderr, r.stderr
    assert not out.exists() and not out.with_name(out.name + ".parts").exists()


# ----------------------------------------------------------------------------- a real server
@pytest.mark.capture
@pytest.mark.slow
@pytest.mark.skipif(not HAVE, reason=SKIP_REASON)
def test_fcfs_run_through_http_is_a_valid_serving_trace(fcfs_server, tmp_path):
    """On the session's shared FCFS server (tests/conftest.py)."""
    from core.trace import load_trace

    server = fcfs_server
    url = f"http://127.0.0.1:{server.port}"
    csv = tmp_path / "arrivals.csv"
    csv.write_text("arrival_s\n" + "".join(f"{i * SPACING_S}\n" for i in range(N)))
    out = tmp_path / "runs" / "alpaca7-fcfs-server.parquet"
    out.parent.mkdir()

    wrong = run_cli([*serve_args(url, tmp_path / "wrong.parquet", str(csv)), "--decode-slots", "2"], tmp_path)
    assert wrong.returncode == 2 and "runs leap.decode_slots = 1, this run needs 2" in wrong.stderr, wrong.stderr
    assert not (tmp_path / "wrong.parquet").exists()

    r = run_cli(serve_args(url, out, str(csv)), tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    trace = load_trace(out)
    rows = trace.table.to_pylist()
    assert len(rows) == N
    for row in rows:
        times = row["token_times_s"]
        assert row["output_tokens"] == row["max_tokens"] == len(times) == min(row["source_output_tokens"], MAX_LENGTH)
        assert times == sorted(times) and row["ttft_s"] == times[0] <= row["e2e_s"] == times[-1]
        # how late a send is depends on the machine's load (a figure for benchmarks, not a test)
        assert row["arrival_s"] >= row["planned_arrival_s"] - EARLY_S
    source = {r["request_id"]: r["prompt_tokens"] for r in load_trace("traces/alpaca.parquet").table.to_pylist()}
    assert all(row["prompt_tokens"] == source[row["request_id"]] for row in rows)
    assert [row["planned_arrival_s"] for row in rows] == [i * SPACING_S for i in range(N)]
    by_arrival = sorted(rows, key=lambda row: row["arrival_s"])
    assert [row["planned_arrival_s"] for row in by_arrival] == [i * SPACING_S for i in range(N)]   # sent in order
    # FCFS, 1 slot: each request is decoded to its end before the next admitted one, so they finish
    # in the order their first tokens came (the engine's admission order). Not the send order: on a
    # loaded machine two sends 1.5 s apart can reach the engine in either order.
    by_first = sorted(rows, key=lambda row: row["arrival_s"] + row["ttft_s"])
    by_finish = sorted(rows, key=lambda row: row["arrival_s"] + row["e2e_s"])
    assert [row["request_id"] for row in by_finish] == [row["request_id"] for row in by_first]

    serving = trace.metadata["serving"]
    assert serving["mode"] == "server" and serving["server"] == f"127.0.0.1:{server.port}"
    got = serving["server_settings"]
    assert got["scheduler_cls"] == "leap_sched.vllm.Scheduler"
    assert (got["leap"]["policy"], got["leap"]["predictor"], got["leap"]["decode_slots"]) == ("fcfs", "none", 1)
    assert str(MODEL) not in json.dumps(trace.metadata)      # no machine path

    v = run_cli(["-m", "experiments.validate", str(out), "--profile-from", str(CALIBRATION), "--json"], tmp_path)
    assert v.returncode == 0, v.stderr[-2000:]
    report = json.loads(v.stdout.strip().splitlines()[-1])
    assert (report["requests"], report["policy"], report["decode_slots"]) == (N, "fcfs", 1)
    assert report["clock"] == "seconds" and report["real_mean_e2e_s"] > 0 and report["sim_mean_e2e_s"] > 0


def test_a_servers_cpu_binding_is_read_without_this_process_affinity():
    """The client runs pinned to the other core than the server: the server's binding is counted,
    not checked against the client's own CPUs (``--threads`` for the in-process engine still is)."""
    from capture import CaptureError
    from capture.backend_vllm import parse_cpu_list

    elsewhere = str(max(os.sched_getaffinity(0)) + 1)
    assert parse_cpu_list(elsewhere, local=False) == [int(elsewhere)]
    with pytest.raises(CaptureError, match="CPUs must be among"):
        parse_cpu_list(elsewhere)
