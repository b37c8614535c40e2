"""The request table: one run's per-request state in numpy arrays indexed by row.

Rows are numbered in (arrival time, trace row) order, so row order is FCFS order and the final
tie-break of every sort. The table holds state only; the scheduler decides, the prediction driver
writes estimates, and the engine's step loop lands each step's tokens here.
"""

from __future__ import annotations

import numpy as np

from core.attributes import of_trace
from core.prefix_hashes import native_chains, output_chains
from core.trace import Trace

NOT_YET = np.nan
NO_STEP = -1   # a step column's value until the event happens (every request finishes in a run)


def clock_step(step: int, now: float, step_clock: bool) -> int:
    """The index a step's events are recorded under (docs/semantics.md, "Step clock"): under the
    step clock the tick the step runs in (unit-time steps counted from 0, idle ticks included: the
    clock's value at the step's start); under the seconds clock the number of steps executed before it."""
    return int(now) if step_clock else step


class RequestTable:
    """Arrays of request state (the true ``length`` is read only to decide completion)."""

    def __init__(self, workload: Trace, arrival: np.ndarray, closed_loop: int | None):
        n = len(workload)
        self.n = n
        self.arrival = arrival                                   # closed loop: later rows +inf until released
        self.prompt = workload.prompt_tokens.astype(np.int64)
        self.prompt_sq = self.prompt * self.prompt
        self.attributes = of_trace(workload)                     # request attributes (core.attributes)
        self.trace_name = workload.name
        self.prefix_chains = native_chains(workload)             # prefix identity (core.prefix_hashes), or None
        self.output_chains = output_chains(workload)             # and of the blocks past the prompt's, or None
        self.source_rows: np.ndarray | None = None               # a fleet replica's: its rows' workload rows
        # tokens the row's next prefill computes: its prompt, or after a preemption its prompt and
        # every token generated so far (recompute; docs/semantics.md "KV blocks")
        self.fill, self.fill_sq = self.prompt, self.prompt_sq
        self.length = workload.output_tokens.astype(np.int64)    # completion only; never shown to policies
        self.generated = np.zeros(n, dtype=np.int64)
        self.predicted = np.zeros(n, dtype=np.float64)           # current estimate (or rank score)
        self.first_predicted = np.full(n, NOT_YET)               # each row's first estimate
        self.ready_s = np.full(n, NOT_YET)                       # when that estimate became usable
        self.admit_s = np.full(n, NOT_YET)
        self.first_token_s = np.full(n, NOT_YET)
        self.finish_s = np.full(n, NOT_YET)
        self.admit_step = np.full(n, NO_STEP, dtype=np.int64)        # step whose schedule first prefills it
        self.first_token_step = np.full(n, NO_STEP, dtype=np.int64)  # step that emits its first token
        self.finish_step = np.full(n, NO_STEP, dtype=np.int64)       # step that emits its last token
        self.last_served = np.zeros(n, dtype=np.int64)           # step of the last decode (or prefill)
        self.forced_steps = np.zeros(n, dtype=np.int64)
        self.admitted = np.zeros(n, dtype=bool)
        self.prefilled = np.zeros(n, dtype=np.int64)             # prompt tokens computed (chunked prefill)
        self.resident = np.empty(0, dtype=np.int64)              # admitted, prompt complete, not finished
        self.partial = -1                                        # row whose prompt is partly prefilled
        self.finished = 0
        self.kv_used = 0
        self.preemptions = np.zeros(n, dtype=np.int64)
        self.released = min(closed_loop, n) if closed_loop is not None else n

    def arrived_by(self, now: float) -> int:
        """Rows [0, k) have arrived by ``now``."""
        return int(np.searchsorted(self.arrival, now, side="right"))

    def set_predictions(self, rows: np.ndarray, values: np.ndarray, now: float) -> None:
        """Publish estimates; a row's first one is kept with the instant it became usable."""
        self.predicted[rows] = values
        fresh = rows[np.isnan(self.first_predicted[rows])]
        if len(fresh):
            self.first_predicted[fresh] = self.predicted[fresh]
            self.ready_s[fresh] = now

    def land(self, step: int, tick: int, start: float, end: float, chosen: np.ndarray, n_forced: int,
             admit: np.ndarray, first: np.ndarray, prefill_tokens: int, resumed: np.ndarray | None = None) -> np.ndarray:
        """Decode tokens and first tokens land at the end of the step (recorded under ``tick``,
        :func:`clock_step`); returns the rows now done. ``resumed``: rows whose re-prefill after a
        preemption completed; each emits its next token (:meth:`KVBlocks.resume`)."""
        generated, length, last_served = self.generated, self.length, self.last_served
        generated[chosen] += 1
        last_served[chosen] = step
        self.forced_steps[chosen[:n_forced]] += 1
        self.kv_used += len(chosen)
        done = chosen[generated[chosen] >= length[chosen]]
        if len(admit):
            self.admit_s[admit] = start
            self.admit_step[admit] = tick
        self.kv_used += prefill_tokens
        if len(first):   # prompts completed this step emit their first token
            self.first_token_s[first] = end
            self.first_token_step[first] = tick
            generated[first] = 1
            last_served[first] = step
            self.kv_used += len(first)
            one_token = first[length[first] <= 1]
            if len(one_token):
                done = np.concatenate([done, one_token])
        if resumed is not None and len(resumed):
            generated[resumed] += 1
            last_served[resumed] = step
            done = np.concatenate([done, resumed[generated[resumed] >= length[resumed]]])
        self.finish_step[done] = tick
        return done

    def retire(self, done: np.ndarray, first: np.ndarray, end: float, keep_row_order: bool) -> None:
        """Finish ``done``, make completed prompts (and re-prefills, listed first) resident, and
        (closed loop) release one row per completion."""
        resident = self.resident
        if len(done):
            self.finish_s[done] = end
            self.finished += len(done)
            self.kv_used -= int(self.prompt[done].sum() + self.length[done].sum())
            resident = resident[np.isnan(self.finish_s[resident])]
        if len(first):
            resident = np.concatenate([resident, first[np.isnan(self.finish_s[first])]])
            if keep_row_order:
                resident.sort(kind="stable")
        self.resident = resident
        if self.released < self.n and len(done):   # closed loop: each completion submits the next row
            fresh = min(len(done), self.n - self.released)
            self.arrival[self.released:self.released + fresh] = end
            self.released += fresh
