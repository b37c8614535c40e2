"""The scheduler: which requests a step admits (and how much of each prompt) and which decode.

Decode choice is :func:`policies.selection.choose_decodes` (the wait cap first, then the policy's
order), the same function the live vLLM scheduler calls. Admission is strict FCFS up to the prefill
token budget, unless the predictor scores from the prompt alone and the policy orders admission.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from policies.base import Policy, SchedulerView
from policies.selection import choose_decodes, victim_order
from simulator.config import EngineConfig
from simulator.kv_blocks import KVBlocks
from simulator.prefix_cache import PrefixKVBlocks
from simulator.requests import RequestTable

EMPTY = np.empty(0, dtype=np.int64)


class SimulationStalled(RuntimeError):
    """A step with requests in the system admitted and decoded nothing, or a part-prefilled prompt
    took more chunks than its length allows: the run would never end."""


def min_chunk(config: EngineConfig) -> int:
    """The fewest tokens a part-prefilled prompt computes in a step that continues it, unless it
    completes there: the prefill budget less the decodes that may share it (at least 1)."""
    return max(1, config.prefill_token_budget - (config.decode_slots if config.decodes_in_budget else 0))


def chunk_overrun(step: int, now: float, row: int, prompt: int, prefilled: int, chunks: int, least: int) -> str:
    """Why a run stops when a prompt has been continued more often than its length allows (both kernels)."""
    return (f"step {step} at t={now:.6g} s: the prompt of row {row} ({prompt} tokens) is still part-prefilled "
            f"({prefilled} computed) after {chunks} continued chunks of at least {least} tokens; at most "
            f"{-(-prompt // least)} can be needed (a chunk forgot what was computed before it?)")


@dataclass
class Batch:
    """One step's composition."""

    chosen: np.ndarray        # rows decoded, the ``n_forced`` forced by the wait cap first
    n_forced: int
    ready: int                # resident rows able to decode at step start
    waiting: int              # arrived and not admitted, after this step's admissions
    carried: int              # row whose prompt continues from an earlier step (-1: none)
    admit: np.ndarray         # rows admitted this step
    first: np.ndarray         # rows whose prompt completes this step (they emit their first token)
    prefill_tokens: int
    prefill_sq: int           # attention work of the prefill (sum of chunk x (computed before + chunk))
    context: int              # KV tokens read by the decodes
    resumed: np.ndarray = field(default_factory=lambda: EMPTY)    # rows whose re-prefill after a preemption completed (KV blocks)
    readmit: np.ndarray = field(default_factory=lambda: EMPTY)    # preempted rows readmitted this step (not admissions)
    preempted: np.ndarray = field(default_factory=lambda: EMPTY)  # rows preempted this step


class Scheduler:
    """Admission and decode choice for one run over a :class:`RequestTable`."""

    def __init__(self, policy: Policy, config: EngineConfig, table: RequestTable, view: SchedulerView,
                 ordered_admission: bool):
        self.policy, self.config, self.table, self.view = policy, config, table, view
        self.ordered_admission = ordered_admission   # the policy orders admission (arrival-stage scores)
        self.admit_ptr = 0        # rows below it are all admitted
        self.n_admitted = 0
        self.contended = 0        # steps in which the policy's order decided something
        self.kv: KVBlocks | None = None
        if config.kv_bounded:
            kind = PrefixKVBlocks if config.caches_prefixes else KVBlocks
            self.kv = kind(table, config.kv_blocks_total, config.kv_block_size)
            if isinstance(self.kv, PrefixKVBlocks):   # the policy sees the cached prompt tokens
                view.cached = self.kv.seen
        self.carried_chunks = 0   # steps that continued the part-prefilled prompt (bounded: min_chunk)

    def idle(self, arrived: int) -> bool:
        """Nothing resident, nothing part-prefilled, nothing waiting: the engine waits for an arrival."""
        t = self.table
        return len(t.resident) == 0 and t.partial < 0 and self.admit_ptr >= arrived and not (
            self.kv is not None and self.kv.requeued)

    def compose(self, arrived: int, step: int, now: float) -> Batch:
        t, cfg, view = self.table, self.config, self.view
        view.now = now
        view.step = step
        ready = t.resident
        chosen, n_forced = choose_decodes(self.policy, view, ready, decode_slots=cfg.decode_slots,
                                          wait_cap=cfg.wait_cap, step=step, last_served=t.last_served)
        preempted = EMPTY
        if self.kv is not None:
            chosen, n_forced, preempted = self._grow(ready, chosen, n_forced)
        budget = cfg.prefill_token_budget - (len(chosen) if cfg.decodes_in_budget else 0)
        carried = t.partial
        carried_chunk = 0
        if carried >= 0:   # a partly prefilled prompt continues before new admissions
            carried_chunk = int(min(t.fill[carried] - t.prefilled[carried], max(budget, 0)))
            budget -= carried_chunk
        waiting = arrived - self.n_admitted + (len(self.kv.requeued) if self.kv is not None else 0)
        readmit, admit = self._admit(arrived, budget, len(preempted) == 0)
        if not len(admit) and not len(readmit) and not len(chosen) and not carried_chunk and not len(preempted):
            raise SimulationStalled(
                f"step {step} at t={now:.6g} s admitted and decoded nothing with "
                f"{len(ready)} resident and {waiting} waiting requests "
                f"(decode_slots={cfg.decode_slots}, max_resident={cfg.max_resident})")
        # the policy chose: more ready requests than decode slots, (policy-ordered admission)
        # requests left waiting after this step's admissions, or a preemption's victim
        if len(ready) > cfg.decode_slots or (self.ordered_admission and arrived > self.n_admitted) or len(preempted):
            self.contended += 1
        before = int(t.prefilled[carried]) if carried >= 0 else 0
        self.carried_chunks += carried_chunk > 0   # before _prefill, which restarts it for a new partial row
        first, prefill_tokens, prefill_sq = self._prefill(np.concatenate([readmit, admit]) if len(readmit) else admit,
                                                          budget, carried, carried_chunk)
        resumed = self.kv.completed(first) if self.kv is not None else EMPTY
        if len(resumed):
            first = first[~np.isin(first, resumed)]
        if not len(admit) and not len(readmit) and not len(chosen) and not len(preempted) and carried >= 0 and t.prefilled[carried] <= before:
            # a carried chunk that computed nothing: the same step would repeat forever
            raise SimulationStalled(
                f"step {step} at t={now:.6g} s made no progress: the part-prefilled prompt of row {carried} "
                f"stayed at {before} of {int(t.fill[carried])} tokens, nothing admitted or decoded")
        least = min_chunk(cfg)
        if carried_chunk and self.carried_chunks > -(-int(t.fill[carried]) // least):
            raise SimulationStalled(chunk_overrun(step, now, carried, int(t.fill[carried]),
                                                  int(t.prefilled[carried]), self.carried_chunks, least))
        context = int(t.prompt[chosen].sum() + t.generated[chosen].sum())
        return Batch(chosen, n_forced, len(ready), waiting - len(admit) - len(readmit), carried, admit, first,
                     prefill_tokens, prefill_sq, context, resumed, readmit, preempted)

    def _grow(self, ready: np.ndarray, chosen: np.ndarray, n_forced: int) -> tuple[np.ndarray, int, np.ndarray]:
        """KV blocks for the step's decodes (:meth:`KVBlocks.grow_decodes`): the preempted leave the
        residents and the decodes (docs/semantics.md "KV blocks")."""
        assert self.kv is not None
        preempted = self.kv.grow_decodes(chosen, lambda: victim_order(self.policy, self.view, ready, chosen, n_forced))
        if len(preempted):
            t = self.table
            t.resident = t.resident[~np.isin(t.resident, preempted)]
            kept = ~np.isin(chosen, preempted)
            n_forced = int(kept[:n_forced].sum())
            chosen = chosen[kept]
        return chosen, n_forced, preempted

    def _admit(self, arrived: int, budget: int, may_admit: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """(preempted rows readmitted, rows admitted) this step, in admission order."""
        t, cfg = self.table, self.config
        room = cfg.max_resident - len(t.resident) - (t.partial >= 0)
        kv = self.kv
        requeued = kv.requeued[::-1] if kv is not None else []
        if budget <= 0 or not may_admit:
            return EMPTY, EMPTY
        lo = self.admit_ptr
        if room <= 0 or (lo >= arrived and not requeued):
            return EMPTY, EMPTY
        if lo >= arrived:
            cand = EMPTY
        elif self.ordered_admission:
            cand = lo + np.flatnonzero(~t.admitted[lo:arrived])
            if self.policy.reads_cached and isinstance(kv, PrefixKVBlocks):
                kv.look_up(cand)
            keys = self.policy.admission_keys(self.view, cand)
            if keys is not None:
                cand = cand[np.argsort(keys, kind="stable")]
        else:
            cand = np.arange(lo, min(arrived, lo + room))
        if requeued:   # preempted rows first, the last preempted at the front
            cand = np.concatenate([np.asarray(requeued, dtype=np.int64), cand])
        cand = cand[:room]
        if isinstance(kv, PrefixKVBlocks):   # each looks up its cached prefix and takes its blocks in turn
            return self._taken(arrived, cand, kv.admit(cand, budget, cfg.chunked_prefill), len(requeued))
        tokens = np.cumsum(t.fill[cand])
        # strict order: stop at the first request that does not fit; an over-long prompt goes alone
        take = int(np.searchsorted(tokens, budget, side="right"))
        if cfg.chunked_prefill:   # the next one gets what budget is left, as a first chunk
            take += int(take < len(cand) and (tokens[take - 1] if take else 0) < budget)
        else:
            take = max(take, 1)
        if cfg.kv_token_budget is not None:
            fits = int(np.searchsorted(tokens, cfg.kv_token_budget - t.kv_used, side="right"))
            take = min(take, fits if fits or len(t.resident) else 1)  # an empty engine admits one
        if kv is not None:   # each needs its whole prefill's blocks (no request needs more than all)
            take = min(take, kv.admissible(cand[:take]))
        if kv is not None:
            kv.hold(cand[:take])
        return self._taken(arrived, cand, take, len(requeued))

    def _taken(self, arrived: int, cand: np.ndarray, take: int, n_requeued: int) -> tuple[np.ndarray, np.ndarray]:
        """The first ``take`` candidates leave the re-queue (those first) or the waiting requests."""
        t, kv = self.table, self.kv
        n_re = min(take, n_requeued)
        readmit = kv.readmit(n_re) if kv is not None and n_re else EMPTY
        rows = cand[n_re:take]
        if len(rows):
            t.admitted[rows] = True
            self.n_admitted += len(rows)
            while self.admit_ptr < arrived and t.admitted[self.admit_ptr]:
                self.admit_ptr += 1
        return readmit, rows

    def _prefill(self, admit: np.ndarray, budget: int, carried: int,
                 carried_chunk: int) -> tuple[np.ndarray, int, int]:
        """Prompt tokens computed this step: (rows completing their prompt, tokens, attention work)."""
        t = self.table
        prompt = t.fill   # the prompt, or a preempted row's prompt and generated tokens
        if isinstance(self.kv, PrefixKVBlocks):
            return self._prefill_cached(admit, budget, carried, carried_chunk)
        if not self.config.chunked_prefill:
            prefill_tokens = int(prompt[admit].sum()) if len(admit) else 0
            prefill_sq = int(t.fill_sq[admit].sum()) if len(admit) else 0
            return admit, prefill_tokens, prefill_sq
        chunks = np.minimum(prompt[admit], np.maximum(budget - np.concatenate(
            [[0], np.cumsum(prompt[admit])[:-1]]), 0)) if len(admit) else EMPTY
        before = int(t.prefilled[carried]) if carried >= 0 else 0
        prefill_tokens = carried_chunk + int(chunks.sum())
        prefill_sq = carried_chunk * (before + carried_chunk) + int((chunks * chunks).sum())
        t.prefilled[admit] = chunks
        if carried >= 0:
            t.prefilled[carried] += carried_chunk
        first = admit[chunks == prompt[admit]]
        if carried >= 0 and t.prefilled[carried] == prompt[carried]:
            first = np.concatenate([[carried], first]).astype(np.int64)
            t.partial = -1
        if len(admit) and chunks[-1] < prompt[admit[-1]]:
            t.partial = int(admit[-1])
            self.carried_chunks = 0
        return first, prefill_tokens, prefill_sq

    def _prefill_cached(self, admit: np.ndarray, budget: int, carried: int,
                        carried_chunk: int) -> tuple[np.ndarray, int, int]:
        """:meth:`_prefill` where each admitted row starts after its cached tokens (``kv.start``)."""
        t, kv = self.table, self.kv
        assert isinstance(kv, PrefixKVBlocks)
        fill, start = t.fill[admit], kv.start[admit]
        rest = fill - start
        before = int(t.prefilled[carried]) if carried >= 0 else 0
        if not self.config.chunked_prefill:
            return admit, int(rest.sum()), int((rest * fill).sum())
        chunks = np.minimum(rest, np.maximum(budget - np.concatenate([[0], np.cumsum(rest)[:-1]]), 0)) \
            if len(admit) else EMPTY
        prefill_tokens = carried_chunk + int(chunks.sum())
        prefill_sq = carried_chunk * (before + carried_chunk) + int((chunks * (start + chunks)).sum())
        t.prefilled[admit] = start + chunks
        if carried >= 0:
            t.prefilled[carried] += carried_chunk
        first = admit[chunks == rest]
        if carried >= 0 and t.prefilled[carried] == t.fill[carried]:
            first = np.concatenate([[carried], first]).astype(np.int64)
            t.partial = -1
        if len(admit) and chunks[-1] < rest[-1]:
            t.partial = int(admit[-1])
            self.carried_chunks = 0
        return first, prefill_tokens, prefill_sq
