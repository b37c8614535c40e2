"""Prefix caching over the KV blocks, vLLM V1's (docs/semantics.md "Prefix caching").

Blocks are physical: a pool of ``total`` with reference counts and a free queue (head: the next to
be reallocated). A full block is named by its request's chained key (:mod:`core.prefix_hashes`);
freed, it stays cached in the queue until reallocated, when its name is dropped (evicted). A freed
request's blocks enter the queue tail-first: its unnamed blocks at the head (reused first), its
named ones at the tail (LRU). Admission looks up the fill's full blocks from the first and stops at
the first miss, taking at most ``(fill - 1) // B`` blocks (vLLM computes at least the last token);
the hit blocks are shared (reference counts), and the request needs free blocks for the rest plus
the hit blocks that were free. A fill's full blocks are named at admission, a decode's when the step
that computes its last token schedules it (vLLM's ``allocate_slots``), and what is left when the
request frees them (at its finish or preemption). Blocks past the prompt's are the request's own,
unless the trace's ``output_hashes`` name them by their tokens (a live run's: vLLM's names).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from core.contract import TraceError
from core.prefix_hashes import OUTPUT_COLUMN, block_keys, check_block_size, output_keys, own_keys
from simulator.kv_blocks import KVBlocks
from simulator.requests import RequestTable


class BlockKeys:
    """Each row's block keys at one block size: its trace's prefix hashes where it has them
    (``core.prefix_hashes.block_keys``), its own beyond."""

    def __init__(self, table: RequestTable, size: int):
        self.prompt, self.size, self.chains, self.table = table.prompt, size, table.prefix_chains, table
        self.outputs = table.output_chains
        if self.chains is not None:
            check_block_size(self.chains[2], size, f"trace {table.trace_name!r}")
            if self.outputs is not None and self.chains[2] != size:
                raise TraceError(f"--block-size {size}: trace {table.trace_name!r} names the blocks past its prompts "
                                 f"({OUTPUT_COLUMN}) at {self.chains[2]} tokens; give --block-size {self.chains[2]}")

    def of(self, row: int, count: int) -> list[int]:
        """The keys of the row's first ``count`` blocks."""
        source = self.table.source_rows
        request = int(source[row]) if source is not None else row   # the workload's row (a fleet's replica)
        return self.of_request(request, int(self.prompt[row]), count)

    def of_request(self, request: int, prompt: int, count: int) -> list[int]:
        """The keys of the first ``count`` blocks of the workload's row ``request`` (``prompt`` tokens)."""
        named = np.empty(0, dtype=np.int64)
        if self.chains is not None:
            offsets, hashes, native = self.chains
            named = block_keys(hashes[offsets[request]:offsets[request + 1]], native, self.size, prompt)[:count]
            if self.outputs is not None and len(named) < count:   # the blocks past the prompt's, by their tokens
                starts, values = self.outputs
                more = output_keys(values[starts[request]:starts[request + 1]], native)
                named = np.concatenate([named, more])[:count]
        if len(named) >= count:
            return named.tolist()
        return named.tolist() + own_keys(request, len(named), count).tolist()


class PrefixKVBlocks(KVBlocks):
    """:class:`KVBlocks` with named, shared, cached blocks (admission by :meth:`admit`)."""

    caches = True

    def __init__(self, table: RequestTable, total: int, size: int):
        super().__init__(table, total, size)
        self.keys = BlockKeys(table, size)
        self.queue: OrderedDict[int, None] = OrderedDict((b, None) for b in range(self.total))
        self.ref = [0] * self.total
        self.name: list[int | None] = [None] * self.total
        self.cached: dict[int, list[int]] = {}      # key -> its blocks, the first named first
        self.owned: dict[int, list[int]] = {}       # row -> its blocks in token order
        self.named = np.zeros(table.n, dtype=np.int64)      # of them, the leading ones named
        self.start = np.zeros(table.n, dtype=np.int64)      # tokens the current prefill found cached
        self.cached_tokens = np.zeros(table.n, dtype=np.int64)   # at the first admission (vLLM's num_cached_tokens)
        # what a policy sees (SchedulerView.cached): cached_tokens once admitted, a waiting row's last lookup before
        self.seen = np.zeros(table.n, dtype=np.int64)

    @property
    def free(self) -> int:
        return len(self.queue)

    @property
    def used(self) -> int:
        """Blocks with a holder (shared ones once); the pool counts them itself."""
        return self.total - len(self.queue)

    @used.setter
    def used(self, value: int) -> None:
        pass   # KVBlocks' own count is not kept here

    def hit_blocks(self, keys: list[int]) -> int:
        """How many of ``keys`` (a request's blocks from the first) are cached here, stopping at the first miss."""
        count = 0
        for key in keys:
            if key not in self.cached:
                break
            count += 1
        return count

    def _evict(self, block: int) -> None:
        key = self.name[block]
        if key is not None:
            holders = self.cached[key]
            holders.remove(block)
            if not holders:
                del self.cached[key]
            self.name[block] = None

    def _take(self, count: int) -> list[int]:
        if count > len(self.queue):   # the scheduler asks only for what is free: a bug, not an input
            raise AssertionError(f"KV blocks over-committed: {count} asked, {len(self.queue)} free")
        out = []
        for _ in range(count):
            block, _ = self.queue.popitem(last=False)
            self._evict(block)
            self.ref[block] = 1
            out.append(block)
        return out

    def _name(self, row: int, upto: int) -> None:
        """Name the row's blocks up to ``upto`` (full ones)."""
        blocks, first = self.owned[row], int(self.named[row])
        if upto <= first:
            return
        for block, key in zip(blocks[first:upto], self.keys.of(row, upto)[first:], strict=True):
            self.name[block] = key
            self.cached.setdefault(key, []).append(block)
        self.named[row] = upto

    def lookup(self, row: int, fill: int) -> list[int]:
        """The cached blocks that start the row's fill (at most ``(fill - 1) // B``)."""
        hit: list[int] = []
        for key in self.keys.of(row, (fill - 1) // self.size):
            holders = self.cached.get(key)
            if holders is None:
                break
            hit.append(holders[0])
        return hit

    def admit(self, cand: np.ndarray, budget: int, chunked: bool) -> int:
        """How many of ``cand`` (in admission order) are admitted: each in turn looks up its hit (seeing
        those admitted before it), needs its uncached tokens in the prefill budget (chunked: the
        first that does not fit gets what is left; unchunked: an over-long first goes alone) and its
        blocks free; the first that fails stops admission. The admitted take their blocks."""
        fill, size, tokens = self.table.fill, self.size, 0
        for j, row in enumerate(cand.tolist()):
            f = int(fill[row])
            hit = self.lookup(row, f)
            rest = f - len(hit) * size
            last = tokens + rest > budget
            if last and not ((chunked and tokens < budget) or (not chunked and j == 0)):
                return j
            if -(-f // size) - len(hit) + sum(self.ref[b] == 0 for b in hit) > self.free:
                return j
            self._hold(row, hit, f)
            tokens += rest
            if last:
                return j + 1
        return len(cand)

    def _hold(self, row: int, hit: list[int], fill: int) -> None:
        for block in hit:
            if self.ref[block] == 0:
                del self.queue[block]
            self.ref[block] += 1
        blocks = hit + self._take(-(-fill // self.size) - len(hit))
        self.owned[row] = blocks
        self.named[row] = len(hit)
        self._name(row, fill // self.size)
        self.held[row] = len(blocks)
        self.start[row] = len(hit) * self.size
        if not self.recompute[row]:
            self.cached_tokens[row] = self.seen[row] = self.start[row]

    def look_up(self, rows: np.ndarray) -> None:
        """Each waiting row's hit now (:meth:`lookup` of its fill, in tokens) into :attr:`seen`."""
        fill = self.table.fill
        for row in rows.tolist():
            self.seen[row] = len(self.lookup(row, int(fill[row]))) * self.size

    def grow_decodes(self, chosen: np.ndarray, ordered) -> np.ndarray:
        """:meth:`KVBlocks.grow_decodes`, then each decode still resident names its full blocks up to
        the token it computes this step (prompt + generated), as vLLM does when it schedules it, so
        that a request admitted later in the step may find them."""
        gone = super().grow_decodes(chosen, ordered)
        t = self.table
        for row in chosen.tolist():
            if not self.recompute[row]:
                self._name(row, int(t.prompt[row] + t.generated[row]) // self.size)
        return gone

    def _grant(self, rows: np.ndarray, need: np.ndarray) -> None:
        for row, count in zip(rows.tolist(), need.tolist(), strict=True):
            if count:
                self.owned[row].extend(self._take(count))
                self.held[row] += count

    def release(self, done: np.ndarray) -> None:
        """Name the full blocks of what each row computed (prompt + generated - 1 tokens), then free
        its blocks tail first: unnamed ones to the queue's head, named ones to its tail."""
        t = self.table
        for row in done.tolist():
            self._name(row, int(t.prompt[row] + t.generated[row] - 1) // self.size)
            front = []
            for block in reversed(self.owned.pop(row)):
                self.ref[block] -= 1
                if self.ref[block] == 0:
                    if self.name[block] is None:
                        front.append(block)
                    else:
                        self.queue[block] = None
            for block in reversed(front):
                self.queue[block] = None
                self.queue.move_to_end(block, last=False)
            self.held[row] = 0
            self.named[row] = 0


def cached_tokens_of(fleet, n: int) -> np.ndarray:
    """A fleet's per-request cached tokens at first admission, by workload row."""
    out = np.zeros(n, dtype=np.int64)
    for replica in fleet:
        kv, k = replica.parts.scheduler.kv, replica.routed
        out[replica.rows[:k]] = kv.cached_tokens[:k]
    return out
