"""Engine limits: what one simulated serving engine may hold and do per step."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: ``kv_blocks`` value asking for the blocks the engine profile's GPU memory holds (resolved by
#: :func:`simulator.runner.prepare` from :func:`core.hardware.kv_blocks_in_memory`)
KV_BLOCKS_FROM_PROFILE = "profile"
#: vLLM's default KV block size (tokens per block)
DEFAULT_KV_BLOCK_SIZE = 16

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
    # block-granular KV memory with preemption by recompute (docs/semantics.md "KV blocks"); off by
    # default (unbounded, as before); an int, or KV_BLOCKS_FROM_PROFILE until the runner resolves it
    kv_blocks: int | str | None = None
    kv_block_size: int = DEFAULT_KV_BLOCK_SIZE
    # prefix caching over the KV blocks (docs/semantics.md "Prefix caching"): None = on wherever KV
    # blocks are modelled (vLLM's default), off without them; True needs kv_blocks
    prefix_caching: bool | None = None

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
        self._check_kv_blocks()
        self._check_prefix_caching()
        if self.kv_token_budget is not None and self.max_resident > self.kv_token_budget:
            raise ValueError(f"max-resident {self.max_resident} is above kv-budget {self.kv_token_budget} "
                             "(each resident request holds at least one KV token): lower --max-resident")

    def _check_kv_blocks(self) -> None:
        size, blocks = self.kv_block_size, self.kv_blocks
        if not isinstance(size, (int, np.integer)) or isinstance(size, bool) or not 1 <= size <= MAX_TOKEN_BUDGET:
            raise ValueError(f"block-size must be an integer between 1 and {MAX_TOKEN_BUDGET}, got {size!r}")
        if blocks is None or blocks == KV_BLOCKS_FROM_PROFILE:
            return
        if not isinstance(blocks, (int, np.integer)) or isinstance(blocks, bool) or blocks < 1:
            raise ValueError(f"kv-blocks must be a positive integer or {KV_BLOCKS_FROM_PROFILE!r}, got {blocks!r}")
        if blocks * size > MAX_TOKEN_BUDGET * 1024:
            raise ValueError(f"kv-blocks {blocks} x block-size {size} is above the largest KV cache this "
                             f"simulator sizes ({MAX_TOKEN_BUDGET * 1024} tokens)")
        if self.kv_token_budget is not None:
            raise ValueError("kv-blocks and kv-budget are two models of one KV cache: give one of them")

    def _check_prefix_caching(self) -> None:
        if self.prefix_caching is not None and not isinstance(self.prefix_caching, bool):
            raise ValueError(f"prefix-caching must be on or off, got {self.prefix_caching!r}")
        if self.prefix_caching and self.kv_blocks is None:
            raise ValueError("--prefix-caching on caches KV blocks: give --kv-blocks N (or profile) too")

    @property
    def kv_blocks_total(self) -> int:
        """The KV cache's blocks, once ``profile`` is resolved (``simulator.runner.resolve_kv_blocks``)."""
        if not isinstance(self.kv_blocks, (int, np.integer)) or isinstance(self.kv_blocks, bool):
            raise ValueError(f"kv-blocks {self.kv_blocks!r} must be resolved to a number of blocks before a run")
        return int(self.kv_blocks)

    @property
    def kv_bounded(self) -> bool:
        """Whether the block-granular KV model (admission by blocks, preemption) is on."""
        return self.kv_blocks is not None

    @property
    def caches_prefixes(self) -> bool:
        """Whether KV blocks are cached by prefix (on by default wherever KV blocks are modelled)."""
        return self.kv_bounded and self.prefix_caching is not False
