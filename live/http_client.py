"""The HTTP side of ``leap-serve --server URL``: one asyncio loop, one streamed request per arrival.

Each request is a streamed chat completion (``/v1/chat/completions``): the server applies the
model's chat template to the one user message, as the in-process run does with the tokenizer
(``live.serve._source_prompts``). Forced lengths ride in the request body as vLLM's own fields
(``min_tokens``, ``max_tokens``, ``ignore_eos``); ``return_token_ids`` makes every streamed chunk
carry its token ids, so a chunk that bundles several tokens (the front end merges deltas when it
falls behind) still counts as that many tokens, each stamped with the chunk's arrival time.

Times are the client's: ``arrival_s`` is when the request was sent (seconds from the segment's
start), ``token_times_s`` when each token's chunk was read, from the send. All requests share
one ``httpx.AsyncClient`` with a connection per stream in flight (no thread per request).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

#: The plugin's settings endpoint (served by ``leap_sched.vllm.endpoint``; the client reads it here).
SETTINGS_PATH = "/leap_sched/settings"
#: Seconds to wait for the server to answer a pre-flight request (health, settings, tokenize) on an
#: idle machine; stretched by the load (``core.patience``): a busy host answers slower, not wrongly.
PROBE_TIMEOUT_S = 10.0


def probe_timeout_s() -> float:
    from core.patience import scaled

    return scaled(PROBE_TIMEOUT_S)
#: A streamed request may wait this long between chunks (a long queue on a slow host).
READ_TIMEOUT_S = 1800.0


def base_url(server: str) -> str:
    """The server's root (its ``/v1`` suffix, if given, dropped): the plugin's and vLLM's paths start here."""
    return server.rstrip("/").removesuffix("/v1")


class ServerError(Exception):
    """The server refused or broke a request (one line: what and why)."""


@dataclass
class Sent:
    """One request as the client saw it (``serve_records.serve_table`` reads these attributes)."""

    request: Any                        # has ``request_id``
    arrival_s: float                    # send time, seconds from the segment's start
    token_times_s: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    step_marks: dict | None = None      # engine steps: the client cannot see them


def chat_body(model: str, text: str, sampling: dict, max_tokens: int, forced: bool, extra: dict | None,
              fields: dict | None = None) -> dict:
    """The JSON body of one streamed chat completion with the run's sampling and (forced) length;
    ``fields``: the request's attributes as vLLM request fields (``priority``)."""
    body = {"model": model, "messages": [{"role": "user", "content": text}], "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True,
            "temperature": sampling["temperature"], "top_p": sampling["top_p"],
            "repetition_penalty": sampling["repetition_penalty"], "max_tokens": max_tokens}
    if forced:
        body.update(min_tokens=max_tokens, ignore_eos=True)
    if extra:
        body["vllm_xargs"] = extra
    body.update(fields or {})
    return body


async def get_json(client, url: str) -> tuple[int, object]:
    r = await client.get(url, timeout=probe_timeout_s())
    try:
        return r.status_code, r.json()
    except ValueError:
        return r.status_code, None


async def tokenize_chat(client, base: str, model: str, text: str) -> list[int]:
    """The prompt token ids the server makes of one user message (its chat template, generation prompt)."""
    r = await client.post(f"{base}/tokenize", timeout=probe_timeout_s(), json={
        "model": model, "messages": [{"role": "user", "content": text}], "add_generation_prompt": True})
    if r.status_code != 200:
        raise ServerError(f"POST {base}/tokenize answered {r.status_code}: {r.text[:200]}")
    return list(r.json()["tokens"])


async def stream_one(client, url: str, body: dict, sent: Sent, t_sent: float) -> Sent:
    """Send one streamed request and fill ``sent`` from its chunks (``t_sent``: ``perf_counter`` at the send)."""
    async with client.stream("POST", url, json=body) as r:
        if r.status_code != 200:
            text = (await r.aread()).decode(errors="replace")
            raise ServerError(f"request {sent.request.request_id}: the server answered {r.status_code}: {text[:300]}")
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            now = time.perf_counter() - t_sent
            chunk = json.loads(data)
            if "error" in chunk:
                raise ServerError(f"request {sent.request.request_id}: {chunk['error']}")
            for choice in chunk.get("choices") or []:
                sent.token_times_s.extend([now] * len(choice.get("token_ids") or []))
                if choice.get("finish_reason"):
                    sent.finish_reason = choice["finish_reason"]
            usage = chunk.get("usage")
            if usage:
                sent.prompt_tokens = usage["prompt_tokens"]
                sent.output_tokens = usage["completion_tokens"]
    return sent


async def serve_schedule(base: str, schedule, on_finished, flush_n: int) -> dict:
    """Send each ``(offset_s, request, body)`` at ``offset_s`` after the start; ``on_finished(list[Sent])``
    (a coroutine) gets the finished requests in batches of ``flush_n`` (and the rest at the end or on
    cancellation). Returns ``wall_s`` and the submission lags (send time - planned offset)."""
    import httpx

    url = f"{base}/v1/chat/completions"
    pending: list[Sent] = []
    lags: list[float] = []

    async def flush() -> None:
        if pending:
            batch = pending[:]
            del pending[:]
            await on_finished(batch)

    async def one(req, body, t_sent: float, arrival: float) -> None:
        sent = await stream_one(client, url, body, Sent(req, arrival), t_sent)
        pending.append(sent)
        if len(pending) >= flush_n:
            await flush()

    limits = httpx.Limits(max_connections=len(schedule) + 4, max_keepalive_connections=len(schedule) + 4)
    timeout = httpx.Timeout(probe_timeout_s(), read=READ_TIMEOUT_S)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        t0 = time.perf_counter()
        tasks = []
        try:
            for offset, req, body in schedule:
                wait = t0 + offset - time.perf_counter()
                if wait > 0:
                    await asyncio.sleep(wait)
                t_sent = time.perf_counter()
                lags.append(t_sent - t0 - offset)
                tasks.append(asyncio.create_task(one(req, body, t_sent, t_sent - t0)))
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await flush()
    return {"wall_s": time.perf_counter() - t0, "submit_lag_s": lags}
