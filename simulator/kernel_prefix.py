"""The compiled kernel's prefix caching, beside its twin in the reference
(:class:`simulator.prefix_cache.PrefixKVBlocks`; docs/semantics.md "Prefix caching").

The pool is arrays over the blocks: a reference count, a name (a block key) and whether it has one,
the free queue as a doubly-linked list (``STATE.pk_head`` is the next block reallocated), and per
name the blocks holding it (a doubly-linked list, the first named first). Names map to their lists
through an open-addressing table (linear probing, deletion by backward shift): at most one live
entry per block, so twice the pool's size never fills. Each row's block keys (its trace's prefix
hashes, output hashes, its own keys beyond: :class:`simulator.prefix_cache.BlockKeys`) and the
blocks it holds sit in two flat arrays over the same per-row offsets (:func:`prefix_arrays`, built
once in Python). ``STATE.kv_blocks_used`` counts the blocks out of the queue. Plain Python that
numba compiles (inlined into the step).
"""

from __future__ import annotations

import numpy as np

from simulator import kv_rule
from simulator.kernel_order import _lru_append, _lru_remove
from simulator.kv_rule import blocks_for as _blocks_for


def _pk_home(key, mask):
    """Where a key's probe starts in a table of ``mask + 1`` slots (keys are hashes: their bits mixed)."""
    return (key ^ (key >> 29)) & mask


def _pk_slot(ht_keys, ht_used, key):
    """The table's slot of ``key``, or of the empty slot where it would go."""
    mask = ht_keys.shape[0] - 1
    i = _pk_home(key, mask)
    while ht_used[i] and ht_keys[i] != key:
        i = (i + 1) & mask
    return i


def _pk_unlist(w, i):
    """Empty slot ``i`` of the table, shifting back the entries probed past it."""
    mask = w.ht_keys.shape[0] - 1
    j = i
    while True:
        j = (j + 1) & mask
        if not w.ht_used[j]:
            break
        key = w.ht_keys[j]
        home = _pk_home(key, mask)
        if (i < home <= j) if i <= j else (i < home or home <= j):
            continue   # its probe starts after the hole: it stays
        w.ht_keys[i], w.ht_first[i], w.ht_last[i] = key, w.ht_first[j], w.ht_last[j]
        i = j
    w.ht_used[i] = False


def _pk_evict(w, block):
    """PrefixKVBlocks._evict: a block about to be reallocated loses its name."""
    if not w.pk_has_name[block]:
        return
    i = _pk_slot(w.ht_keys, w.ht_used, w.pk_name[block])
    p, q = w.pk_kprev[block], w.pk_knext[block]
    if p >= 0:
        w.pk_knext[p] = q
    else:
        w.ht_first[i] = q
    if q >= 0:
        w.pk_kprev[q] = p
    else:
        w.ht_last[i] = p
    if w.ht_first[i] < 0:
        _pk_unlist(w, i)
    w.pk_has_name[block] = False


def _pk_take(w, st, r, count):
    """PrefixKVBlocks._take: ``count`` blocks from the queue's head, unnamed, appended to row ``r``'s."""
    at = w.pk_off[r] + w.kv_held[r]
    for j in range(count):
        block = st.pk_head
        st.pk_head, st.pk_tail = _lru_remove(block, w.pk_qprev, w.pk_qnext, st.pk_head, st.pk_tail)
        _pk_evict(w, block)
        w.pk_ref[block] = 1
        w.pk_blocks[at + j] = block
    w.kv_held[r] += count
    st.kv_blocks_used += count


def _pk_name(w, r, upto):
    """PrefixKVBlocks._name: row ``r``'s blocks up to ``upto`` take their keys (each joins its
    key's holders, last)."""
    off = w.pk_off[r]
    for j in range(w.pk_named[r], upto):
        block, key = w.pk_blocks[off + j], w.pk_keys[off + j]
        w.pk_name[block], w.pk_has_name[block] = key, True
        i = _pk_slot(w.ht_keys, w.ht_used, key)
        w.pk_knext[block] = -1
        if w.ht_used[i]:
            last = w.ht_last[i]
            w.pk_kprev[block], w.pk_knext[last] = last, block
        else:
            w.ht_used[i], w.ht_keys[i], w.ht_first[i] = True, key, block
            w.pk_kprev[block] = -1
        w.ht_last[i] = block
    if upto > w.pk_named[r]:
        w.pk_named[r] = upto


def _pk_lookup(w, s, r, fill):
    """PrefixKVBlocks.lookup: the cached blocks that start row ``r``'s fill (at most
    ``(fill - 1) // B``, each its key's first holder) into ``pk_hit``; returns how many."""
    off, n = w.pk_off[r], 0
    for j in range((fill - 1) // s.kv_size):
        i = _pk_slot(w.ht_keys, w.ht_used, w.pk_keys[off + j])
        if not w.ht_used[i]:
            break
        w.pk_hit[n] = w.ht_first[i]
        n += 1
    return n


def _pk_admit(t, w, s, st, r, n_hit):
    """PrefixKVBlocks.admit's block check and _hold: row ``r`` takes its ``n_hit`` cached blocks
    (shared) and free ones for the rest of its fill, if enough are free (else False)."""
    fill = t.fill[r]
    need = _blocks_for(fill, s.kv_size) - n_hit
    for j in range(n_hit):
        if w.pk_ref[w.pk_hit[j]] == 0:
            need += 1
    if need > s.kv_total - st.kv_blocks_used:
        return False
    off = w.pk_off[r]
    for j in range(n_hit):
        block = w.pk_hit[j]
        if w.pk_ref[block] == 0:
            st.pk_head, st.pk_tail = _lru_remove(block, w.pk_qprev, w.pk_qnext, st.pk_head, st.pk_tail)
            st.kv_blocks_used += 1
        w.pk_ref[block] += 1
        w.pk_blocks[off + j] = block
    w.kv_held[r] = n_hit
    _pk_take(w, st, r, _blocks_for(fill, s.kv_size) - n_hit)
    w.pk_named[r] = n_hit
    _pk_name(w, r, fill // s.kv_size)
    w.pk_start[r] = n_hit * s.kv_size
    if not w.kv_recompute[r]:
        w.pk_cached[r] = w.pk_start[r]
    return True


def _pk_release(t, w, s, st, r):
    """PrefixKVBlocks.release of row ``r``: its computed tokens' full blocks named, then its blocks
    freed tail first: named ones to the queue's tail, unnamed ones to its head (the row's last first)."""
    _pk_name(w, r, (t.prompt[r] + t.generated[r] - 1) // s.kv_size)
    off, held = w.pk_off[r], w.kv_held[r]
    for j in range(held - 1, -1, -1):
        block = w.pk_blocks[off + j]
        w.pk_ref[block] -= 1
        if w.pk_ref[block] == 0 and w.pk_has_name[block]:
            st.pk_head, st.pk_tail = _lru_append(block, w.pk_qprev, w.pk_qnext, st.pk_head, st.pk_tail)
            st.kv_blocks_used -= 1
    for j in range(held):   # each to the head (the list mirrored: its head is the mirror's tail)
        block = w.pk_blocks[off + j]
        if w.pk_ref[block] == 0 and not w.pk_has_name[block]:
            st.pk_tail, st.pk_head = _lru_append(block, w.pk_qnext, w.pk_qprev, st.pk_tail, st.pk_head)
            st.kv_blocks_used -= 1
    w.kv_held[r] = 0
    w.pk_named[r] = 0


def _pk_grant(t, w, s, st, b):
    """KVBlocks.grow_decodes with prefix caching, when enough blocks are free: each decode of the
    step takes the block its next token needs (in decode order). False (nothing taken): a step short
    of blocks (:func:`_pk_spare`)."""
    need, size = 0, s.kv_size
    for j in range(b.n_chosen):
        r = w.chosen[j]
        need += _blocks_for(t.prompt[r] + t.generated[r], size) - w.kv_held[r]
    if need > s.kv_total - st.kv_blocks_used:
        return False
    for j in range(b.n_chosen):
        r = w.chosen[j]
        _pk_take(w, st, r, _blocks_for(t.prompt[r] + t.generated[r], size) - w.kv_held[r])
    return True


def _pk_name_decodes(t, w, s, b):
    """PrefixKVBlocks.grow_decodes: the step's decodes still resident name their full blocks up to
    the token they compute (so that a request admitted later in the step may find them)."""
    for j in range(b.n_chosen):
        r = w.chosen[j]
        _pk_name(w, r, (t.prompt[r] + t.generated[r]) // s.kv_size)


def _pk_spare(t, w, s, st, b):
    """KVBlocks.grow_decodes with prefix caching in a step short of blocks: down the victim order
    (``kv_order[:n_res]``), each decode asks for its block and, while none is free, the last row not
    yet preempted goes (its blocks back through the pool: :func:`_pk_release`). The victims into
    ``kv_gone``; returns how many."""
    order, end, n_gone = w.kv_order, st.n_res, 0
    for i in range(b.n_chosen):
        r = order[i]
        if w.kv_recompute[r] or _blocks_for(t.prompt[r] + t.generated[r], s.kv_size) <= w.kv_held[r]:
            continue   # preempted already this step, or nothing to add
        while st.kv_blocks_used == s.kv_total:
            end -= 1
            victim = order[end]
            while w.kv_recompute[victim]:
                end -= 1
                victim = order[end]
            _pk_release(t, w, s, st, victim)
            w.kv_recompute[victim] = True
            w.kv_gone[n_gone] = victim
            n_gone += 1
            if victim == r:
                break
        if not w.kv_recompute[r]:
            _pk_take(w, st, r, 1)
    return n_gone


def _pk_hit_blocks(ht_keys, ht_used, keys):
    """PrefixKVBlocks.hit_blocks: how many of ``keys`` are cached, stopping at the first miss (a
    cache-aware router's read of a compiled replica, from Python: :func:`hit_blocks`)."""
    for j in range(keys.shape[0]):
        if not ht_used[_pk_slot(ht_keys, ht_used, keys[j])]:
            return j
    return keys.shape[0]


def hit_blocks(work, keys: np.ndarray) -> int:
    """:func:`_pk_hit_blocks` over a compiled run's pool (``work``), jitted by the kernel's load."""
    return int(_pk_hit_blocks(work.ht_keys, work.ht_used, keys))


def prefix_arrays(table, cfg, keys, routed: bool = False) -> dict[str, np.ndarray]:
    """The prefix cache's working arrays (:class:`simulator.kernel_layout.Work`) for ``table`` with
    ``keys`` (a :class:`simulator.prefix_cache.BlockKeys`, None: no prefix caching, one element
    each). Each row's keys cover every block it may name or hold (its prompt and output); ``routed``
    (a fleet's replica): none yet, each row's written when it is routed (:func:`add_row_keys`)."""
    n = table.n
    if keys is None:
        one, flag = np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.bool_)
        return {name: one.copy() for name in _ROW_ARRAYS + _POOL_ARRAYS + _TABLE_ARRAYS} | {
            "pk_off": np.zeros(2, dtype=np.int64), "pk_has_name": flag, "ht_used": flag.copy()}
    size, total = int(cfg.kv_block_size), int(cfg.kv_blocks_total)
    off = np.zeros(n + 1, dtype=np.int64)
    if routed:
        flat = np.zeros(1024, dtype=np.int64)
    else:
        width = row_width(table.prompt, table.length, size)
        np.cumsum(width, out=off[1:])
        flat = np.concatenate([np.asarray(keys.of(r, int(width[r])), dtype=np.int64) for r in range(n)]) if n \
            else np.zeros(1, dtype=np.int64)
    slots = 1 << max(int(2 * total).bit_length(), 1)
    queue_prev, queue_next = np.arange(-1, total - 1, dtype=np.int64), np.arange(1, total + 1, dtype=np.int64)
    queue_next[-1] = -1
    rows = np.zeros(max(n, 1), dtype=np.int64)
    most = int(row_width(table.prompt, table.length, size).max(initial=1)) if not routed else total + 1
    return {"pk_keys": flat, "pk_off": off, "pk_blocks": np.zeros(len(flat), dtype=np.int64),
            "pk_named": rows.copy(), "pk_start": rows.copy(), "pk_cached": rows.copy(),
            "pk_hit": np.zeros(most, dtype=np.int64),
            "pk_ref": np.zeros(total, dtype=np.int64), "pk_name": np.zeros(total, dtype=np.int64),
            "pk_has_name": np.zeros(total, dtype=np.bool_), "pk_qprev": queue_prev, "pk_qnext": queue_next,
            "pk_kprev": np.full(total, -1, dtype=np.int64), "pk_knext": np.full(total, -1, dtype=np.int64),
            "ht_keys": np.zeros(slots, dtype=np.int64), "ht_used": np.zeros(slots, dtype=np.bool_),
            "ht_first": np.zeros(slots, dtype=np.int64), "ht_last": np.zeros(slots, dtype=np.int64)}


def row_width(prompt, length, size):
    """Keys (and block places) a row needs: one past the blocks of its prompt and output."""
    return kv_rule.blocks_for(prompt + length, size) + 1   # (the kernel's _blocks_for is jitted)


def add_row_keys(run, k: int, row: int) -> None:
    """A fleet replica's local row ``k`` (the workload's ``row``, just routed) gets its block keys
    after the last routed row's, the keys' and blocks' arrays doubled when full (between calls)."""
    table, w = run.table, run.work
    width = int(row_width(table.prompt[k], table.length[k], run.keys.size))
    start = int(w.pk_off[k])
    if start + width > len(w.pk_keys):
        room = max(2 * len(w.pk_keys), start + width)
        grown = {name: np.zeros(room, dtype=np.int64) for name in ("pk_keys", "pk_blocks")}
        for name, new in grown.items():
            new[:start] = getattr(w, name)[:start]
        run.work = w = w._replace(**grown)
        run.kernel_args = (run.rows, run.work, run.settings, run.state, run.batch)
    w.pk_keys[start:start + width] = run.keys.of_request(row, int(table.prompt[k]), width)
    w.pk_off[k + 1] = start + width


_ROW_ARRAYS = ("pk_keys", "pk_blocks", "pk_named", "pk_start", "pk_cached", "pk_hit")
_POOL_ARRAYS = ("pk_ref", "pk_name", "pk_qprev", "pk_qnext", "pk_kprev", "pk_knext")
_TABLE_ARRAYS = ("ht_keys", "ht_first", "ht_last")

JITTED = ("_pk_home", "_pk_slot", "_pk_unlist", "_pk_evict", "_pk_take", "_pk_name", "_pk_lookup", "_pk_admit", "_pk_release",
          "_pk_grant", "_pk_name_decodes", "_pk_spare", "_pk_hit_blocks")
