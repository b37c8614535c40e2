"""LEAP with tensor parallel 2 on vLLM's own ``mp`` executor, over HTTP (docs/serving.md, "Tensor parallel").

The model is the bundled SmolLM2-135M padded to 12 heads / 4 KV heads (tests/tp_model.py: same
outputs; 9 heads do not split over 2 ranks). ``python -m leap_sched.vllm.check --tensor-parallel-size
2`` prints the command; it is served as printed from another folder, two ranks on one core each
(``VLLM_CPU_OMP_THREADS_BIND=0|1``). Rank 0's hook runs in a worker process and its estimates reach
the scheduler in the engine-core process through ``live.tp_channel``: the leap-rls server counts
them (every request estimated by the hook) and its RLS updates (its own log lines); the oracle
server finishes shortest first. A TP-2 engine takes minutes to start on two shared cores: one
server per predictor, several checks each.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_serve_plugin import send
from vllm_server import HAVE, MODEL, ROOT, SKIP_REASON

from core.patience import scaled
from live.http_client import SETTINGS_PATH

# a compiled TP-2 start (two ranks tracing and compiling on one core each) took over 10 minutes under load
#: Seconds to /health for a compiled TP-2 start on two shared cores.
START_TIMEOUT_S = 1800
pytestmark = [pytest.mark.capture, pytest.mark.skipif(not HAVE, reason=SKIP_REASON), pytest.mark.timeout(START_TIMEOUT_S + 600)]


@pytest.fixture(scope="module")
def padded(tmp_path_factory):
    from tp_model import padded_model

    return padded_model(MODEL, tmp_path_factory.mktemp("padded") / "smollm2-tp")


def check(padded, where, *args: str) -> dict:
    """``check``'s JSON for TP 2 on the padded model, run in ``where``."""
    r = subprocess.run([sys.executable, "-m", "leap_sched.vllm.check", "--model", str(padded), "--kv-cache-gib", "1",
                        "--tensor-parallel-size", "2", "--max-resident", "8", "--decode-slots", "2", *args],
                       cwd=where, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                       timeout=scaled(300))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def served(printed: dict, server_factory, tmp_path, name: str):
    """The printed command served from another folder; its settings must say TP 2 on vLLM's mp executor."""
    assert printed["serve_env"]["VLLM_CPU_OMP_THREADS_BIND"] == "0|1"
    assert "VLLM_CPU_OMP_THREADS_BIND='0|1' " in printed["serve_command"]
    assert "--distributed-executor-backend mp --middleware" in printed["serve_command"]
    assert printed["executor"] == "mp" and printed["tensor_parallel_size"] == 2
    assert "--enforce-eager" not in printed["serve_command"]          # compiled: each worker taps before tracing
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    server = server_factory.command(printed["serve_command"], name, elsewhere,
                                    "--max-model-len 512 --max-num-batched-tokens 512")
    server.wait_ready(timeout_s=START_TIMEOUT_S)
    settings = server.get(SETTINGS_PATH)
    assert (settings["tensor_parallel_size"], settings["distributed_executor_backend"]) == (2, "mp"), settings
    assert settings["env"]["VLLM_CPU_OMP_THREADS_BIND"] == "0|1" and settings["enforce_eager"] is False
    assert settings["kv_blocks"] == printed["model"]["kv_blocks"]       # each rank: 2 of the 4 KV heads
    return server


def busy_totals(server, predictor: str, source: str) -> tuple[int, int, int]:
    """(finished, estimated by ``source``, decodes held back) summed over the stats lines of the busy period
    (a line every 10 s while busy, the last once idle: 0 requests held)."""
    head = rf"leap_sched: countdown/{predictor}, 2 of 8 decode: \d+ steps, "
    server.wait_for_line(head + r".* 0 requests held")
    lines = re.findall(head + rf"(\d+) finished \((\d+) estimated by {source}, \d+ on the prior\), (\d+) decodes held back",
                       server.text())
    return tuple(sum(int(line[i]) for line in lines) for i in range(3))   # type: ignore[return-value]


def test_leap_rls_estimates_cross_from_rank_0_and_rls_updates_publish(padded, server_factory, tmp_path):
    from live.readout import export_readout

    where = tmp_path / "check_here"
    where.mkdir()
    export_readout("lmsys", where / "leap_readout.npz")
    printed = check(padded, where, "--policy", "countdown", "--predictor", "leap-rls", "--readout",
                    "leap_readout.npz", "--wait-cap", "16", "--update-every", "2")
    assert "--worker-extension-cls leap_sched.vllm.WorkerExtension" in printed["serve_command"]
    server = served(printed, server_factory, tmp_path, "tp-leap-rls")
    # the tap is in rank 0's compiled model: the AOT artifact vLLM saved (or loaded) holds the op's code
    m = server.wait_for_line(r"\(Worker_TP0 pid=\d+\).*(?:saved AOT compiled function to|Directly load AOT "
                             r"compilation from path) (\S+)", timeout_s=5)
    assert b"leap_live.tap_rows" in Path(m.group(1)).read_bytes()
    lengths = [12, 4, 20, 8, 16, 6, 10, 14]
    _, tokens = send(server, lengths, one_by_one=False, model=padded)
    assert tokens == lengths
    assert busy_totals(server, "leap-rls", "the hook")[:2] == (8, 8)      # so none on the prior
    server.wait_for_line(r"leap_sched: RLS update 4 published \(2 requests")
    assert len(re.findall(r"leap_sched: RLS update \d+ published", server.text())) == 4


def test_countdown_oracle_finishes_shortest_first(padded, server_factory, tmp_path):
    printed = check(padded, tmp_path, "--policy", "countdown", "--predictor", "oracle", "--wait-cap", "0")
    server = served(printed, server_factory, tmp_path, "tp-oracle")
    lengths = [24, 8, 40, 16, 48, 32]
    order, tokens = send(server, lengths, one_by_one=False, model=padded)
    assert tokens == lengths
    assert [lengths[i] for i in order] == sorted(lengths)
    finished, estimated, held = busy_totals(server, "oracle", "arrival")
    assert finished == estimated == len(lengths) and held > 0
