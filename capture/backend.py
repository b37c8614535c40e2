"""The small interface shared by the capture backends (vllm, transformers)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class GenRequest:
    request_id: str
    prompt_token_ids: list[int]
    #: vLLM request fields carrying the request's attributes (``core.attributes.live_fields``: priority)
    fields: dict = field(default_factory=dict)


@dataclass
class Finished:
    request: GenRequest
    output_tokens: int
    finish_reason: str  # "stop" | "length"
    token_times_s: list[float]  # per generated token, offset from submission
    last: dict[int, np.ndarray]  # layer -> hidden state at the last prompt token
    decode: list[tuple[int, int, np.ndarray]] = field(default_factory=list)  # (gen, layer, vec)
    arrival_s: float | None = None  # submission offset from the start of the run
    #: engine-step marks (docs/semantics.md "Step clock"): arrival_step, admit_step,
    #: first_token_step, finish_step; None where the backend does not count steps
    step_marks: dict[str, int | None] | None = None


class Backend:
    """``run`` generates for ``requests`` and reports through two callbacks:

    * ``on_finished(list[Finished])`` in chunks, as requests finish;
    * ``on_steps(list[dict])`` with engine-step rows (wall_start_s, step_s, prefill_requests,
      prefill_tokens, decode_requests, decode_tokens, kv_usage; the vLLM backend adds
      decode_context, prefill_sq, probe_s).
    """

    name = "?"

    def info(self) -> dict:  # pragma: no cover - interface
        raise NotImplementedError

    def run(self, requests, sampling, on_finished, on_steps, *, flush_n: int = 32):  # pragma: no cover - interface
        """Generate every request; finished ones reach ``on_finished`` in groups of about ``flush_n``
        (a backend that finishes a whole batch at once hands over each batch)."""
        raise NotImplementedError

    def close(self) -> None:
        pass
