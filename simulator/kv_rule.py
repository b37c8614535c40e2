"""KV blocks' arithmetic, written once: the reference (:mod:`simulator.kv_blocks`, on arrays) and the
compiled kernel (:mod:`simulator.kernel_kv`, on scalars, numba-compiled) both call these plain
functions (docs/semantics.md "KV blocks")."""

from __future__ import annotations


def blocks_for(tokens, size):
    """Blocks that ``tokens`` computed tokens hold: ceil(tokens / size) (scalars or integer arrays)."""
    return -(-tokens // size)


def spare(order, n_ask, prompt, generated, held, recompute, size, used, total, gone):
    """A step short of blocks (docs/semantics.md "KV blocks" 3): the decodes ``order[:n_ask]`` ask for
    the block their next token needs, from the front; while none is free the last row of ``order``
    not yet preempted goes (its blocks freed, ``recompute`` set), until one is free or the asking
    row was itself the victim. Writes the preempted rows to ``gone`` in preemption order; returns
    (how many, blocks used after). ``held``, ``recompute`` are written in place. Self-contained (the
    kernel compiles it as it is: it calls no other function)."""
    end = len(order)
    n_gone = 0
    for i in range(n_ask):
        r = order[i]
        if recompute[r] or -(-(prompt[r] + generated[r]) // size) <= held[r]:   # blocks_for, inlined
            continue   # preempted already this step, or nothing to add
        while used == total:
            end -= 1
            victim = order[end]
            while recompute[victim]:
                end -= 1
                victim = order[end]
            used -= held[victim]
            held[victim] = 0
            recompute[victim] = True
            gone[n_gone] = victim
            n_gone += 1
            if victim == r:
                break
        if not recompute[r]:
            held[r] += 1
            used += 1
    return n_gone, used
