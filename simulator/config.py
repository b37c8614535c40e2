"""Engine limits: what one simulated serving engine may hold and do per step."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Upper bounds of the engine limits, checked before anything is sized by them: the capacity
#: measurement replays 8 x max_resident requests, and the kernels size per-step arrays by the
#: caps; a token budget above 2**31 - 1 tokens per step is a typo, not an engine.
MAX_ENGINE_SEQS = 65536
MAX_TOKEN_BUDGET = 2**31 - 1


@dataclass(frozen=True)
class EngineConfig:
    """Engine limits (defaults: the paper's vLLM setup)."""

    max_resident: int = 512
    decode_slots: int = 64
    prefill_token_budget: int = 8192
    kv_token_budget: int | None = None   # optional second admission limit, off by default
    wait_cap: int = 128                  # steps without a decode before a request is forced; 0 = off
    # vLLM V1 scheduling (both off by default; `--preset recorded` turns them on):
    chunked_prefill: bool = False        # a prompt longer than the budget left is prefilled in chunks
    decodes_in_budget: bool = False      # each decode takes one token of prefill_token_budget first

    def __post_init__(self) -> None:
        for name in ("max_resident", "decode_slots", "prefill_token_budget"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name.replace('_', '-')} must be a positive integer, got {value!r}")
        for name, limit in (("max_resident", MAX_ENGINE_SEQS), ("decode_slots", MAX_ENGINE_SEQS),
                            ("prefill_token_budget", MAX_TOKEN_BUDGET), ("kv_token_budget", MAX_TOKEN_BUDGET)):
            value = getattr(self, name)
            if isinstance(value, (int, np.integer)) and value > limit:
                flag = {"prefill_token_budget": "prefill-budget", "kv_token_budget": "kv-budget"}.get(
                    name, name.replace("_", "-"))
                raise ValueError(f"{flag} {value} is above the largest engine this simulator sizes ({limit})")
        if not isinstance(self.wait_cap, (int, np.integer)) or self.wait_cap < 0:
            raise ValueError(f"wait-cap must be an integer >= 0, got {self.wait_cap!r}")
        for name in ("chunked_prefill", "decodes_in_budget"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name.replace('_', '-')} must be true or false")
        if self.kv_token_budget is not None and (
            not isinstance(self.kv_token_budget, (int, np.integer)) or self.kv_token_budget < 1
        ):
            raise ValueError(f"kv-budget must be a positive integer, got {self.kv_token_budget!r}")
        if self.kv_token_budget is not None and self.max_resident > self.kv_token_budget:
            raise ValueError(f"max-resident {self.max_resident} is above kv-budget {self.kv_token_budget} "
                             "(each resident request holds at least one KV token): lower --max-resident")
