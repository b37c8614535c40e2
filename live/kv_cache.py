"""A live engine whose KV memory binds: ``leap-serve --kv-blocks N --kv-block-size B``.

The engine's KV cache gets exactly N usable blocks of B tokens (vLLM's ``num_gpu_blocks_override``
is N + 1: vLLM's block pool keeps one block aside as its null block), so a decode that cannot get a
block makes vLLM preempt by recompute, as the simulator's ``--kv-blocks`` does (docs/semantics.md
"KV blocks"). vLLM preempts the last request of its running queue; the live scheduler hands it the
queue in :func:`policies.selection.victim_order` (:func:`running_order`), the simulator's own rule.
Everything here is per engine: each engine of a fleet takes the same flags and records its own
requests' ``preemptions``.

With the bound cache vLLM's prefix caching is on by default (``--prefix-caching on|off``), as in vLLM
and as the simulator's default wherever KV blocks are modelled (docs/semantics.md "Prefix caching"):
vLLM's own block pool, of exactly those N blocks, decides every hit. The run records per request
``cached_tokens`` (vLLM's hit at the request's first admission, its ``num_cached_tokens``) and
``prefix_hashes``: the prompt's full blocks of B tokens hashed in a chain from its token ids
(:func:`core.prefix_hashes.token_block_hashes`, metadata ``prefix_block_size`` = B), so that a replay
names the same blocks vLLM named. Without ``--kv-blocks`` the engine's cache is not modelled by the
simulator and caching stays off (``--prefix-caching on`` is refused).
"""

from __future__ import annotations

import math

from capture import CaptureError

CPU_BLOCK_MULTIPLE = 32   # vLLM's CPU attention wants block sizes in multiples of 32
DEFAULT_BLOCK_SIZE = 32


def add_kv_flags(p) -> None:
    p.add_argument("--kv-blocks", type=int, metavar="N",
                   help="give the engine exactly N KV blocks, so that memory binds and vLLM preempts "
                        "(docs/semantics.md \"KV blocks\"; default: what --kv-space-gib holds)")
    p.add_argument("--kv-block-size", type=int, metavar="B",
                   help=f"tokens per KV block with --kv-blocks (a multiple of {CPU_BLOCK_MULTIPLE}; "
                        f"default {DEFAULT_BLOCK_SIZE})")
    p.add_argument("--prefix-caching", choices=("on", "off"),
                   help="with --kv-blocks: vLLM's prefix caching over those blocks (default on, as vLLM and the "
                        "simulator; records cached_tokens and prefix_hashes per request); off without --kv-blocks")


def check_kv_flags(args) -> None:
    """The flags alone, before any file is read."""
    if args.kv_blocks is None:
        if args.kv_block_size is not None:
            raise CaptureError("--kv-block-size applies with --kv-blocks N only")
        if getattr(args, "prefix_caching", None) == "on":
            raise CaptureError("--prefix-caching on: needs --kv-blocks N (the simulator models the cache over "
                               "those blocks; the engine's own cache is not replayed)")
        return
    if args.kv_blocks < 1:
        raise CaptureError(f"--kv-blocks {args.kv_blocks}: must be >= 1")
    size = block_size(args)
    if size < 1 or size % CPU_BLOCK_MULTIPLE:
        raise CaptureError(f"--kv-block-size {size}: must be a positive multiple of {CPU_BLOCK_MULTIPLE} "
                           "(vLLM's CPU attention)")
    if args.server is not None:
        raise CaptureError("--kv-blocks sizes the in-process engine's KV cache; a --server run uses the "
                           "server's own")


def block_size(args) -> int:
    return DEFAULT_BLOCK_SIZE if args.kv_block_size is None else int(args.kv_block_size)


def caches_prefixes(args) -> bool:
    """Whether vLLM's prefix caching is on: with --kv-blocks unless --prefix-caching off."""
    return args.kv_blocks is not None and getattr(args, "prefix_caching", None) != "off"


def prompt_hashes(token_ids, args) -> list[int] | None:
    """The prompt's chained hashes of its full blocks of the engine's block size, with the cache on."""
    if not caches_prefixes(args):
        return None
    from core.prefix_hashes import token_block_hashes

    return token_block_hashes(token_ids, block_size(args))


def check_kv_requests(reqs, args) -> None:
    """Refuse a request that alone can never fit: its prompt and output above N x B tokens (the
    engine's longest sequence, vLLM's ``max_model_len``, is then N x B)."""
    n, size = args.kv_blocks, block_size(args)
    for row, r in enumerate(reqs):
        tokens = len(r.prompt_token_ids) + r.length
        if math.ceil(tokens / size) > n:
            raise CaptureError(f"--kv-blocks {n}: request {row} ({r.request_id}) needs "
                               f"{math.ceil(tokens / size)} blocks of {size} tokens for its prompt and "
                               f"output ({tokens} tokens) alone")


def engine_args(args, max_model_len: int) -> dict:
    """vLLM engine keywords for the bound cache (none without --kv-blocks): vLLM refuses a
    ``max_model_len`` its cache cannot hold, so it is capped at N x B tokens."""
    if args.kv_blocks is None:
        return {}
    size = block_size(args)
    return {"num_gpu_blocks_override": int(args.kv_blocks) + 1, "block_size": size,
            "max_model_len": min(max_model_len, int(args.kv_blocks) * size),
            "enable_prefix_caching": caches_prefixes(args)}


def serving_fields(args) -> dict:
    """The serving metadata a replay reads (``simulate --preset recorded``): the bound, if any."""
    if args.kv_blocks is None:
        return {}
    return {"kv_blocks_bound": int(args.kv_blocks), "kv_block_size": block_size(args),
            "prefix_caching": caches_prefixes(args)}


def check_engine_blocks(reported: int | None, args) -> None:
    """The engine's usable blocks (its pool less the null block) are exactly --kv-blocks."""
    if args.kv_blocks is not None and reported is not None and reported - 1 != args.kv_blocks:
        raise CaptureError(f"--kv-blocks {args.kv_blocks}: the engine reports {reported} blocks "
                           f"(expected {args.kv_blocks + 1}, one of them vLLM's null block)")


def running_order(decodes: list, others: list, rest: list) -> list:
    """vLLM's running queue for a step: the decodes (victim order's front) first, then requests
    mid-prefill, then the residents not decoding (victim order's tail, the last preempted first).
    vLLM schedules from the front and preempts from the back."""
    return decodes + others + rest
