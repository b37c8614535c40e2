"""The compiled kernel's data: what each of its functions reads and writes, by name.

The kernel (:mod:`simulator.kernel`, its step's parts in :mod:`simulator.kernel_steps`) works on
four things, passed to every part: the run's per-row arrays (:class:`Rows`, the
:class:`simulator.requests.RequestTable`'s own arrays, written in place), its working arrays
(:class:`Work`: residents, orders, the step's chosen / admitted / first rows, buffers for Python),
its fixed settings (:class:`Settings`) and two one-element record arrays: the run's counters
(:data:`STATE`) and the step being composed (:data:`BATCH`, the twin of
:class:`simulator.scheduler.Batch`). numba compiles namedtuples and records to plain loads and
stores, and caches them across processes. Python reads and writes the records through
:func:`record` (``record(state).finished``).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

PROFILE_UNIT, PROFILE_ROOFLINE, PROFILE_FITTED = 0, 1, 2
# kernel exit status (AFTER_STEP: Python's part of the step just landed: prefill estimates, feedback)
DONE_OR_CHUNK, STALLED, NEEDS_SCORES, AFTER_STEP, NEEDS_EVENT = 0, 1, 2, 3, 4
# a fleet's replica (simulator.compiled_fleet) reached STATE.until: at it, or a step running past it held
UNTIL = 5
REKEY_RESORT = 16                # more re-estimated rows than this: re-key every resident and re-sort
# decode keys: row order (FCFS), countdown's remaining length, a rank predictor's static score
KEY_ROW, KEY_REMAINING, KEY_SCORE = 0, 1, 2
# how estimates reach the kernel
PRED_NONE, PRED_STATIC, PRED_PYTHON, PRED_PREFILL = 0, 1, 2, 3
# the step log's integer columns (Work.log_counts; simulator.engine.StepLog's fields of those names)
LOG_COLUMNS = ("admitted", "decoded", "forced", "ready", "resident", "waiting", "arrived", "finished", "capacity_left")
(LOG_ADMITTED, LOG_DECODED, LOG_FORCED, LOG_READY, LOG_RESIDENT, LOG_WAITING, LOG_ARRIVED, LOG_FINISHED,
 LOG_CAPACITY_LEFT) = range(len(LOG_COLUMNS))

#: the run's counters, carried across kernel calls (Python reads them between calls)
STATE = np.dtype([
    ("step", np.int64), ("finished", np.int64), ("arrived", np.int64),
    ("scored", np.int64),           # rows whose arrival-stage score the kernel has taken in
    ("py_scored", np.int64),        # rows Python has scored (PRED_PYTHON)
    ("n_admitted", np.int64),
    ("admit_ptr", np.int64),        # rows below it are all admitted (kept under SSJF's override)
    ("n_res", np.int64), ("kv_used", np.int64),
    ("heap", np.int64),             # waiting rows in the admission heap
    ("contended", np.int64), ("decodes", np.int64),
    ("partial", np.int64),          # row whose prompt is partly prefilled (-1: none)
    ("carried_chunks", np.int64),   # steps that continued it (bounded: scheduler.min_chunk)
    ("chunk_overrun", np.int64),    # 1: it was continued more often than its prompt allows (a stall)
    ("released", np.int64),         # closed loop: rows submitted so far
    ("lru_head", np.int64), ("lru_tail", np.int64),
    ("n_rekey", np.int64),          # rows Python re-estimated since the last call (in Work.rekey)
    ("yields", np.int64),           # the step loop's SimPy timeouts so far
    ("fb_n", np.int64), ("fb_groups", np.int64),   # finished rows buffered for feedback, and their steps
    ("status", np.int64), ("stall_ready", np.int64), ("stall_waiting", np.int64),
    ("next_yields_before", np.int64),   # the next SimPy event's count of step-loop timeouts before it
    ("ltr_seen", np.int64),         # LTR: rows [0, ltr_seen) seen waiting by an admission call
    ("ltr_idle_ptr", np.int64),     # LTR: rows below it are admitted or past their waiting promotion
    ("held", np.int64),             # a fleet: 1 + residents before the step composed and not landed (0: none)
    ("kv_blocks_used", np.int64),   # KV blocks (simulator.kernel_kv): held now
    ("n_requeued", np.int64),       # ... preempted rows waiting in Work.kv_requeue (the last preempted on top)
    ("preemptions", np.int64),      # ... preemptions so far
    ("pk_head", np.int64), ("pk_tail", np.int64),   # prefix caching (simulator.kernel_prefix): the free queue's ends
    ("now", np.float64), ("abs_error", np.float64),
    ("charge", np.float64),         # the predictor's GPU debt the next step pays
    ("next_event", np.float64), ("gpu_s", np.float64),
    ("aging_clock", np.float64),    # aging: the clock the standing orders' keys were computed at
    ("until", np.float64),          # a fleet: no step starts at or after it, none lands past it (inf: none)
])

#: the step being composed and, once the kernel returns, the last step landed
BATCH = np.dtype([
    ("n_chosen", np.int64), ("n_forced", np.int64),
    ("ord_dirty", np.int64),        # keys changed in Work.ord_rows[:ord_dirty] this step
    ("budget", np.int64),           # prefill tokens left for new admissions
    ("carried", np.int64), ("carried_chunk", np.int64), ("waiting", np.int64),
    ("n_admit", np.int64), ("n_first", np.int64), ("prefill_tokens", np.int64), ("prefill_sq", np.int64),
    ("context", np.int64), ("n_done", np.int64),
    ("ready", np.int64),            # residents at the step's start (Batch.ready)
    ("n_readmit", np.int64),        # KV blocks: preempted rows readmitted (Work.readmit), prefilled before the admitted
    ("n_resumed", np.int64),        # ... rows whose re-prefill completed (Work.resumed; not first tokens)
    ("n_preempted", np.int64),      # ... rows preempted (Work.kv_gone)
    ("n_released", np.int64),       # closed loop: rows its completions submitted (at its end)
    ("start", np.float64), ("duration", np.float64),
])


class Rows(NamedTuple):
    """The run's per-row arrays (:class:`simulator.requests.RequestTable`'s, ``predicted`` the kernel's)."""

    arrival: np.ndarray
    prompt: np.ndarray
    length: np.ndarray
    predicted: np.ndarray
    generated: np.ndarray
    last_served: np.ndarray
    forced_steps: np.ndarray
    admitted: np.ndarray
    admit_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    admit_step: np.ndarray
    first_token_step: np.ndarray
    finish_step: np.ndarray
    first_predicted: np.ndarray
    ready_s: np.ndarray
    prefilled: np.ndarray
    attributes: tuple        # the rows' request attributes (core.attributes.Attributes)
    params: np.ndarray       # the policy rule's numbers (policies/rule.py: CompiledForm.params), float64
    cached: np.ndarray       # prompt tokens found cached (policies/rule.py): zeros (a policy that reads them
                             # falls back to the reference)
    fill: np.ndarray         # tokens each row's next prefill computes (RequestTable.fill): the prompt array
                             # itself without KV blocks, else a copy (a preempted row: prompt + generated)
    preemptions: np.ndarray  # times each row was preempted (RequestTable.preemptions)


class Work(NamedTuple):
    """The kernel's working arrays, kept across calls."""

    resident: np.ndarray     # resident rows in row order (Work.resident[:n_res])
    ord_rows: np.ndarray     # ... in (key, row) order, with their keys
    ord_keys: np.ndarray
    lru_prev: np.ndarray     # ... by last service, a linked list per row
    lru_next: np.ndarray
    heap_keys: np.ndarray    # waiting rows of a policy-ordered admission, a min-heap by (key, row)
    heap_rows: np.ndarray
    chosen: np.ndarray       # the step's decoded rows, forced first
    admit: np.ndarray        # ... admitted rows
    firsts: np.ndarray       # ... rows whose prompt completed (first token)
    done_rows: np.ndarray    # ... rows finished
    scratch: np.ndarray
    err: np.ndarray          # the decodes' estimate errors, summed by kernel_float._pairwise
    pair_stack: np.ndarray   # ... on this stack (int64, 3 x 64)
    pair_sums: np.ndarray    # ... with these partial sums (float64, 64)
    rekey: np.ndarray        # rows Python re-estimated (STATE.n_rekey of them)
    fb_rows: np.ndarray      # finished rows awaiting feedback
    fb_ends: np.ndarray      # ... grouped by the step they finished in
    log_times: np.ndarray    # the step log (record_steps): per step, start and duration (float64, steps x 2)
    log_counts: np.ndarray   # ... and the LOG_COLUMNS (int64, steps x 9); 0 rows without a log
    runs_left: np.ndarray    # LTR's per-row state (policies.ltr_starvation: the policy's own arrays;
    served_seen: np.ndarray  # ... empty for other policies)
    first_waiting: np.ndarray
    kv_held: np.ndarray      # KV blocks (simulator.kernel_kv): blocks each row holds (one element without KV blocks)
    kv_recompute: np.ndarray # ... a row whose next prefill is a re-prefill (bool)
    kv_requeue: np.ndarray   # ... preempted rows waiting (STATE.n_requeued; the last preempted last)
    kv_mark: np.ndarray      # ... per row, 1: a forced decode, 2: another decode of the step (victim order)
    kv_order: np.ndarray     # ... the step's victim order (policies.selection.victim_order)
    kv_gone: np.ndarray      # ... the step's preempted rows (BATCH.n_preempted)
    readmit: np.ndarray      # ... the step's readmitted rows (BATCH.n_readmit)
    resumed: np.ndarray      # ... the step's completed re-prefills (BATCH.n_resumed)
    # prefix caching (simulator.kernel_prefix.prefix_arrays; one element each without it)
    pk_keys: np.ndarray      # each row's block keys, flat (pk_off[r]:pk_off[r + 1])
    pk_off: np.ndarray       # ... per row, where its keys and blocks start
    pk_blocks: np.ndarray    # ... the blocks each row holds, in token order (kv_held[r] of them)
    pk_named: np.ndarray     # ... per row, how many of its leading blocks it has named
    pk_start: np.ndarray     # ... per row, tokens its current prefill found cached
    pk_cached: np.ndarray    # ... per row, those at its first admission (the cached_tokens column)
    pk_hit: np.ndarray       # ... a lookup's hit blocks
    pk_ref: np.ndarray       # per block: its holders
    pk_name: np.ndarray      # ... its key (when pk_has_name)
    pk_has_name: np.ndarray
    pk_qprev: np.ndarray     # ... the free queue's links (STATE.pk_head, pk_tail)
    pk_qnext: np.ndarray
    pk_kprev: np.ndarray     # ... the links among the blocks of one key, the first named first
    pk_knext: np.ndarray
    ht_keys: np.ndarray      # the keys' table (open addressing): a key, whether the slot is taken,
    ht_used: np.ndarray      # ... and its blocks' list's ends
    ht_first: np.ndarray
    ht_last: np.ndarray


class Settings(NamedTuple):
    """The run's fixed settings (engine config, policy's compiled form, predictor, profile)."""

    pred_mode: int
    ordered: bool            # admission by the arrival-stage score
    keys_on: int
    lock_after: float        # TRAIL's limited preemption (-1.0: none)
    starvation_override: bool   # SSJF's: a starving decision goes by arrival (policies.ssjf_starvation)
    starve_after_s: float
    starve_factor: float
    exec_base_s: float
    exec_per_token_s: float
    decode_slots: int
    wait_cap: int
    prefill_budget: int
    decodes_in_budget: bool
    kv_budget: int           # -1: unbounded
    max_resident: int
    chunked: bool
    step_clock: bool
    profile_kind: int
    profile_ints: np.ndarray
    profile_floats: np.ndarray
    charge_prefill: bool     # a prefill-stage predictor's GPU charge per step (PredictionDriver.step_charge)
    charge_per_call: float
    charge_per_request: float
    charge_per_prompt_token: float
    feedback_batch: int      # finished rows per feedback call (0: no feedback)
    refresh_every: int       # decode-time refresh every k tokens (0: none)
    after_prefill: bool      # an arrival-stage predictor observes the prefill (TRAIL's probe)
    record_steps: bool       # keep the step log (Work.log_times, Work.log_counts)
    aging: bool              # TIE's aging of every key (policies.aging)
    keys_rise: bool          # a decode may raise a key: every resident is re-sorted after a step (CompiledForm)
    aging_log_rate: float    # ... log(gamma) / tau
    aging_every_s: float     # ... the aging clock's period
    promotes: bool           # LTR's starvation rule (policies.ltr_starvation)
    promote_after_idle: int  # ... promotes a row idle for this many steps
    promoted_runs: int       # ... for this many runs
    kv_total: int            # KV blocks (docs/semantics.md "KV blocks"; 0: unbounded KV)
    kv_size: int             # ... tokens per block
    kv_caches: bool          # ... cached by prefix (docs/semantics.md "Prefix caching")


def new_record(dtype: np.dtype) -> np.ndarray:
    """A one-element record array of ``dtype``, zeroed (what the kernel takes)."""
    return np.zeros(1, dtype=dtype)


def record(array: np.ndarray) -> np.recarray:
    """Python's named view of a one-element record array: ``record(state).now = 1.0`` writes through."""
    return array.view(np.recarray)[0]
