"""What a cache-aware router reads in a live fleet (``leap-serve --replicas N --router precise-prefix
--kv-blocks B``; docs/semantics.md "Live fleets"): each replica's actual vLLM prefix cache.

At the routing instant (fleet tick k, every replica's step k-1 returned) the arriving request's
prompt is hashed block by block as vLLM names blocks (``hash_block_tokens`` chained from vLLM's
``NONE_HASH``, the engine's ``prefix_caching_hash_algo``, no extra keys: text prompts without LoRA,
images or a cache salt), and each replica's hit is the number of its leading blocks that replica's
block pool holds by name (``get_cached_block``), at most (prompt - 1) // B, as its admission would
find them now: the simulator's ``CacheView`` hits (simulator/fleet_cache.py). Only routers whose
class declares ``live_cache`` run live: they read the hits and the prompt's block count besides the
accounting.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from capture import CaptureError


def check_live_cache_router(args, router_cls) -> None:
    """A cache-reading router runs live only where its class says so, over a bound cache with vLLM's
    prefix caching on, and without a lag (the live fleet reads every replica at each routing)."""
    from live.kv_cache import caches_prefixes

    name = router_cls.name
    if not getattr(router_cls, "live_cache", False):
        raise CaptureError(f"--router {args.router}: the cache-aware routers read the simulator's prefix caches "
                           "and block keys, which a live fleet reports only for precise-prefix")
    if not caches_prefixes(args):
        raise CaptureError(f"--router {name}: reads each replica's prefix cache; give --kv-blocks N with "
                           "vLLM's prefix caching on")
    if ":" in (args.router or ""):
        raise CaptureError(f"--router {args.router}: a live fleet reads the replicas' caches at each routing; "
                           "no settings (lag) live")


def vllm_hit_blocks(engine, token_ids: list[int], block_size: int) -> int:
    """The leading full blocks of ``token_ids`` that the engine's block pool holds by name, at most
    ``(len - 1) // block_size`` (vLLM computes at least one token)."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils

    sched = engine.engine_core.engine_core.scheduler
    hash_fn = get_hash_fn_by_name(sched.cache_config.prefix_caching_hash_algo)
    pool = sched.kv_cache_manager.block_pool
    parent = None
    hits = 0
    for j in range((len(token_ids) - 1) // block_size):
        parent = kv_cache_utils.hash_block_tokens(hash_fn, parent, token_ids[j * block_size:(j + 1) * block_size])
        if pool.get_cached_block(parent, [0]) is None:
            break
        hits += 1
    return hits


def with_hits(view, engines: list, token_ids: list[int], block_size: int):
    """The router's view with each replica's hit and the prompt's full blocks (their count is what the
    score divides by: routers/scorers.py ``precise_prefix``)."""
    hits = np.array([vllm_hit_blocks(e, token_ids, block_size) for e in engines], dtype=np.int64)
    keys = list(range(len(token_ids) // block_size))   # placeholders: the live routers read their count only
    return replace(view, hits=hits, prompt_keys=keys, block_size=block_size)
