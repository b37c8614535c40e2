"""Block-granular KV memory with preemption by recompute (docs/semantics.md "KV blocks").

A request holds ``ceil(tokens / block_size)`` blocks, ``tokens`` being those whose KV has been
computed: from admission its whole prefill (the prompt, or after a preemption the prompt and every
token generated so far), then one more per decode. A decode that needs a block when none is free
preempts the last resident of :func:`policies.selection.victim_order` (vLLM V1 preempts the last of
its running queue, which the live scheduler orders the same way): its blocks are freed and it goes back to the front of the waiting requests, to be prefilled
again with its generated tokens. The scheduler (:mod:`simulator.scheduler`) asks; this class keeps
the counts and says who goes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from simulator.kv_rule import blocks_for, spare
from simulator.requests import RequestTable


class KVBlocks:
    """One run's KV cache: ``total`` blocks of ``size`` tokens over a :class:`RequestTable`."""

    caches = False   # prefix caching (simulator.prefix_cache.PrefixKVBlocks)

    def __init__(self, table: RequestTable, total: int, size: int):
        self.table, self.total, self.size = table, int(total), int(size)
        self.held = np.zeros(table.n, dtype=np.int64)   # blocks each row holds
        self.used = 0
        self.requeued: list[int] = []                   # preempted rows, the next to readmit last
        self.recompute = np.zeros(table.n, dtype=bool)  # a row whose next prefill is a re-prefill
        self.preemptions = 0

    @property
    def free(self) -> int:
        return self.total - self.used

    def blocks(self, tokens: np.ndarray) -> np.ndarray:
        return blocks_for(tokens, self.size)

    def admissible(self, rows: np.ndarray) -> int:
        """How many of ``rows`` (in admission order) fit: each needs its whole prefill's blocks."""
        need = np.cumsum(self.blocks(self.table.fill[rows]))
        return int(np.searchsorted(need, self.free, side="right"))

    def hold(self, rows: np.ndarray) -> None:
        """Admitted (or readmitted) rows take their prefill's blocks."""
        need = self.blocks(self.table.fill[rows])
        self.held[rows] = need
        self.used += int(need.sum())
        if self.used > self.total:   # the scheduler admits only what fits: a bug, not an input
            raise AssertionError(f"KV blocks over-committed: {self.used} of {self.total}")

    def release(self, done: np.ndarray) -> None:
        self.used -= int(self.held[done].sum())
        self.held[done] = 0

    def grow_decodes(self, chosen: np.ndarray, ordered: Callable[[], np.ndarray]) -> np.ndarray:
        """Give each decode of ``chosen`` the block its next token needs; returns the preempted rows
        (in preemption order; they decode nothing this step). Only in a step short of blocks is
        ``ordered()`` asked (once): every resident in the order a shortage spares them
        (:func:`policies.selection.victim_order`, ``chosen`` its first rows). The decodes then ask
        from its front and, while none is free, the last row not yet preempted goes."""
        t = self.table
        need = self.blocks(t.prompt[chosen] + t.generated[chosen]) - self.held[chosen]
        if int(need.sum()) <= self.free:
            self._grant(chosen, need)
            return chosen[:0]
        if not self.caches:   # the rule the compiled kernel runs too (simulator.kv_rule.spare)
            ranked = ordered()
            out = np.empty(len(ranked), dtype=np.int64)
            n_gone, used = spare(ranked, len(chosen), t.prompt, t.generated, self.held, self.recompute, self.size,
                                 self.used, self.total, out)
            self.used = int(used)
            for row in out[:n_gone].tolist():
                self._requeue(row)
            return out[:n_gone]
        # prefix caching: a victim's blocks go back through the pool (PrefixKVBlocks.release)
        order: list[int] = ordered().tolist()
        gone: list[int] = []
        for r in order[:len(chosen)]:
            if self.recompute[r] or self.blocks(t.prompt[r] + t.generated[r]) <= self.held[r]:
                continue   # preempted already this step, or nothing to add
            while self.free == 0:
                victim = order.pop()
                while self.recompute[victim]:
                    victim = order.pop()
                self._preempt(victim)
                gone.append(victim)
                if victim == r:
                    break
            if not self.recompute[r]:
                self._grant(np.asarray([r]), np.ones(1, dtype=np.int64))
        return np.asarray(gone, dtype=np.int64)

    def _grant(self, rows: np.ndarray, need: np.ndarray) -> None:
        """``rows`` take ``need`` more blocks each (their decodes' next tokens)."""
        self.held[rows] += need
        self.used += int(need.sum())

    def _preempt(self, row: int) -> None:
        """Free the row's blocks; its next prefill recomputes its prompt and generated tokens."""
        self.release(np.asarray([row]))
        self.recompute[row] = True
        self._requeue(row)

    def _requeue(self, row: int) -> None:
        """A row just preempted (its blocks freed): to the front of the re-queue, its next prefill
        its prompt and generated tokens."""
        t = self.table
        if t.fill is t.prompt:   # the first preemption of the run: rows get their own fill arrays
            t.fill, t.fill_sq = t.prompt.copy(), t.prompt_sq.copy()
        t.fill[row] = t.prompt[row] + t.generated[row]
        t.fill_sq[row] = t.fill[row] * t.fill[row]
        t.prefilled[row] = 0
        t.preemptions[row] += 1
        self.requeued.append(row)
        self.preemptions += 1

    def readmit(self, k: int) -> np.ndarray:
        """The first ``k`` rows of the re-queue leave it (the last preempted first)."""
        rows = np.asarray(self.requeued[::-1][:k], dtype=np.int64)
        del self.requeued[len(self.requeued) - k:]
        return rows

    def completed(self, rows: np.ndarray) -> np.ndarray:
        """Of the rows whose prefill completed, those that were re-prefills (the rest are first tokens)."""
        resumed = rows[self.recompute[rows]]
        self.recompute[resumed] = False
        return resumed
