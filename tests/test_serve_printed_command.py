"""The command ``python -m leap_sched.vllm.check`` prints starts as printed (docs/serving.md).

From another folder than the one ``check`` ran in (its read-out given there by a relative path),
with the node's memory taken by a helper process so that less than vLLM's default CPU reservation
(``--gpu-memory-utilization`` 0.92 of the node) is free: without the checked KV size in the command
vLLM's CPU worker dies at start-up ("Available memory on node 0 ... less than desired CPU memory
utilization"); with it (``VLLM_CPU_KVCACHE_SPACE=N`` prefix) the same string serves. And the server
reports what ``check`` printed: the classes, the ``leap`` settings, the dtype, block size and KV blocks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from vllm_server import HAVE, MODEL, ROOT, SKIP_REASON

from core.patience import scaled
from live.http_client import SETTINGS_PATH

pytestmark = [pytest.mark.capture, pytest.mark.skipif(not HAVE, reason=SKIP_REASON)]

#: vLLM's default ``gpu_memory_utilization``: the share of the node its CPU worker asks to be free.
VLLM_CPU_RESERVATION = 0.92
GIB = 2**30
#: Left free after taking memory: the server (API process, engine core, model, 1 GiB KV) needs about this.
SERVER_NEEDS = 5 * GIB


def meminfo() -> tuple[int, int]:
    """(total, available) bytes of this machine (/proc/meminfo; vLLM's CPU worker reads the same)."""
    fields = dict(line.split(":", 1) for line in open("/proc/meminfo"))
    return int(fields["MemTotal"].split()[0]) * 1024, int(fields["MemAvailable"].split()[0]) * 1024


@pytest.fixture(scope="module")
def memory_taken():
    """A helper process holding (written, so resident) enough memory that less than vLLM's default
    reservation is available, 1 GiB under it so other processes' churn cannot undo it."""
    total, available = meminfo()
    take = max(0, available - int(VLLM_CPU_RESERVATION * total) + GIB)
    if available - take < SERVER_NEEDS:
        pytest.skip(f"this machine has {available / GIB:.1f} GiB available: too little to take "
                    f"{take / GIB:.1f} GiB and still start a server")
    hog = subprocess.Popen([sys.executable, "-c", "import sys, numpy as np\n"
                            f"a = np.ones({take}, np.uint8)\nprint('held', flush=True)\nsys.stdin.read()"],
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert hog.stdout.readline().strip() == "held"
        total, available = meminfo()
        assert available < VLLM_CPU_RESERVATION * total, "memory taken, yet vLLM's reservation still fits"
        yield take
    finally:
        hog.stdin.close()
        hog.wait(timeout=scaled(60))


@pytest.fixture(scope="module")
def printed(tmp_path_factory):
    """``check``'s JSON for leap-rls, run in its own folder with the read-out named relative to it."""
    from live.readout import export_readout

    where = tmp_path_factory.mktemp("check_here")
    export_readout("lmsys", where / "leap_readout.npz")
    r = subprocess.run([sys.executable, "-m", "leap_sched.vllm.check", "--model", str(MODEL), "--kv-cache-gib", "1",
                        "--policy", "countdown", "--predictor", "leap-rls", "--readout", "leap_readout.npz",
                        "--max-resident", "8", "--decode-slots", "2", "--update-every", "2"],
                       cwd=where, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                       timeout=scaled(300))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    out["_check_dir"] = str(where)
    serve_with, note = r.stderr.strip().splitlines()
    assert serve_with == f"serve with: {out['serve_command']}" and note.startswith("note: the server compiles")
    return out


def test_without_the_kv_size_the_command_dies_on_taken_memory(printed, memory_taken, server_factory, tmp_path):
    """The failure the KV size in the command prevents, reproduced: the printed string less its prefix."""
    prefix = "VLLM_CPU_KVCACHE_SPACE=1 "
    assert printed["serve_command"].startswith(prefix)
    server = server_factory.command(printed["serve_command"].removeprefix(prefix), "no-kv-size", tmp_path)
    assert server.wait_exit() != 0
    assert "less than desired CPU memory utilization" in server.text(), server.tail()


def test_the_printed_command_serves_from_another_folder_and_reports_what_check_printed(
        printed, memory_taken, server_factory, tmp_path):
    import openai

    server = server_factory.command(printed["serve_command"], "printed", tmp_path, "--max-model-len 512")
    server.wait_ready()
    served = server.get(SETTINGS_PATH)
    assert "--enforce-eager" not in printed["serve_command"] and served["enforce_eager"] is False   # compiled (issue 31)
    assert served["scheduler_cls"] == printed["scheduler_cls"] == "leap_sched.vllm.Scheduler"
    model = printed["model"]
    assert (served["kv_blocks"], served["block_size"], served["dtype"]) == \
           (model["kv_blocks"], model["block_size"], model["dtype"]), (served, model)
    assert served["env"]["VLLM_CPU_KVCACHE_SPACE"] == printed["serve_env"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert served["max_num_seqs"] == printed["leap"]["max_resident"] == 8
    leap = {k: v for k, v in served["leap"].items() if k in printed["leap"] and k not in ("readout", "head_weights")}
    assert leap == {k: printed["leap"][k] for k in leap} and {"policy", "predictor", "decode_slots"} <= set(leap)
    assert served["leap"]["readout"].startswith("leap_readout.npz@sha256:")      # the file check was given
    assert printed["leap"]["readout"] == os.path.join(printed["_check_dir"], "leap_readout.npz")
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="none", max_retries=0, timeout=scaled(300))
    started = time.monotonic()
    for n in (4, 6, 3):
        r = client.completions.create(model=model["path"], prompt="Say something.", max_tokens=n, temperature=0.0,
                                      extra_body={"min_tokens": n, "ignore_eos": True})
        assert r.usage.completion_tokens == n
    assert time.monotonic() - started < scaled(300)
    server.wait_for_line(r"leap_sched: countdown/leap-rls, 2 of 8 decode, over vLLM's Scheduler, wait cap 128, "
                         r"hook on layer \d+ \(/")
