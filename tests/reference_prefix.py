"""The reference's prefix cache (tests/reference_sim.py, ``prefix_caching=True``), stated on its own:
plain lists and dicts, no code shared with simulator/prefix_cache.py.

- A pool of ``total`` blocks; ``free`` lists the blocks with no holder, the next one reused first.
- Block j of request i (tokens j*B .. (j+1)*B - 1) is named ``key(i, j)``: the caller's prefix key
  where it gives one (``prefix_keys[i][j]``, at most ``prompt // B`` of them), else ``("own", i, j)``.
  A block gets its name once full (see :meth:`Pool.hold` and :meth:`Pool.release`); a name is dropped
  when its block is taken from ``free`` for new tokens.
- Lookup: the request's blocks 0, 1, ... while a block of that name exists (of several, the one
  named first), at most ``(fill - 1) // B``.
"""

from __future__ import annotations


class Pool:
    def __init__(self, total: int, size: int, prompt: list, prefix_keys: list | None):
        self.size, self.prompt, self.prefix_keys = size, prompt, prefix_keys
        self.free = list(range(total))
        self.holders = {b: 0 for b in range(total)}
        self.name: dict = {}        # block -> (key, when named)
        self.clock = 0
        self.blocks: dict = {}      # request -> its blocks in token order
        self.n_named: dict = {}     # request -> how many of its first blocks are named
        self.start: dict = {}       # request -> tokens its current prefill found cached

    def key(self, i: int, j: int):
        given = self.prefix_keys[i] if self.prefix_keys is not None else []
        if j < min(len(given), self.prompt[i] // self.size):
            return ("given", given[j])
        return ("own", i, j)

    def find(self, key):
        named = [(when, b) for b, (k, when) in self.name.items() if k == key]
        return min(named)[1] if named else None

    def lookup(self, i: int, fill: int) -> list:
        hit = []
        for j in range((fill - 1) // self.size):
            b = self.find(self.key(i, j))
            if b is None:
                break
            hit.append(b)
        return hit

    def needs(self, hit: list, fill: int) -> int:
        """Free blocks an admission takes: the new ones and the hit ones that had no holder."""
        return -(-fill // self.size) - len(hit) + sum(1 for b in hit if self.holders[b] == 0)

    def take(self, count: int) -> list:
        out = []
        for _ in range(count):
            b = self.free.pop(0)
            self.name.pop(b, None)
            self.holders[b] = 1
            out.append(b)
        return out

    def _name_up_to(self, i: int, full: int) -> None:
        for j in range(self.n_named[i], full):
            self.name[self.blocks[i][j]] = (self.key(i, j), self.clock)
            self.clock += 1
        self.n_named[i] = max(self.n_named[i], full)

    def hold(self, i: int, hit: list, fill: int) -> None:
        for b in hit:
            if self.holders[b] == 0:
                self.free.remove(b)
            self.holders[b] += 1
        self.blocks[i] = list(hit) + self.take(-(-fill // self.size) - len(hit))
        self.n_named[i] = len(hit)
        self._name_up_to(i, fill // self.size)

    def grow(self, i: int) -> None:
        self.blocks[i] += self.take(1)

    def release(self, i: int, computed: int) -> None:
        """Name the full blocks of the ``computed`` tokens; free the blocks, the request's last block
        first: those without a name go to the front of ``free`` in that order (its last block is the
        next reused), those with one to the back."""
        self._name_up_to(i, computed // self.size)
        front = []
        for b in reversed(self.blocks.pop(i)):
            self.holders[b] -= 1
            if self.holders[b] == 0:
                if b in self.name:
                    self.free.append(b)
                else:
                    front.append(b)
        self.free = front + self.free


def grow(decoded, ranked, prompt, generated, pool) -> list:
    """The reference's decode rule over the pool: each decode in turn, when its next token needs a
    block and none is free, preempts the last of ``ranked`` not yet preempted (its blocks freed at
    once) until one is free or it went itself."""
    preempted: list = []
    for i in decoded:
        if i in preempted or -(-(prompt[i] + generated[i]) // pool.size) <= len(pool.blocks[i]):
            continue
        while not pool.free:
            victim = [j for j in ranked if j not in preempted][-1]
            preempted.append(victim)
            pool.release(victim, prompt[victim] + generated[victim] - 1)
            if victim == i:
                break
        if i not in preempted:
            pool.grow(i)
    return preempted


def with_prefix_hashes(trace, prefix: list, native: int):
    """``trace`` with the column ``prefix_hashes`` (per request, its keys at ``native`` tokens a block)."""
    import pyarrow as pa

    from core.prefix_hashes import COLUMN, META_KEY
    from core.trace import Trace

    table = trace.table.append_column(COLUMN, pa.array([list(p) for p in prefix], pa.list_(pa.int64())))
    return Trace(name=trace.name, path=None, table=table, metadata={**trace.metadata, META_KEY: native},
                 content_hash=trace.content_hash + repr(prefix))
