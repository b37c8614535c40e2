"""A brute-force reference simulator, written from the semantics alone (not from the engine's code).

Plain Python lists and a loop over engine steps: no SimPy, no numpy, nothing clever. Every step
re-derives everything (who has arrived, who is waiting, who is resident) from per-request state,
so it is slow and obviously correct. ``tests/test_invariants.py`` checks that the engine agrees
with it request for request and step for step.

Semantics implemented (docs/semantics.md):

- Rows: requests are ordered by (arrival_s, caller's order): ties keep submission order; that
  order is FCFS and the last tie-break of every sort.
- Options (off by default), vLLM V1 style: ``decodes_in_budget``: the step's decodes take one token
  each of prefill_token_budget before any prefill; ``chunked_prefill``: a partly prefilled prompt
  continues first with min(rest, budget left), then admission takes whole prompts while they fit
  and gives the next one what is left as a first chunk; a prompt emits its first token in the step
  that completes it (prefill work of a chunk: chunk * (computed before + chunk)).
  ``closed_loop=N`` (a batch: every arrival_s equal): the first N rows arrive at that time, every
  later row when an earlier one finishes (at that step's end), in row order.
- A step starts at time t. If nothing is resident and nothing has arrived-but-not-admitted, the
  engine idles until the next arrival (no step is taken, the step counter does not advance).
- Admission: candidates = waiting requests in admission order (fcfs: row order; countdown:
  predicted length; aging: predicted length * 0.9 ** (wait / 30), wait = max(0, floor(t/5)*5 -
  arrival)), ties by row, at most (max_resident - resident) of them; take the longest prefix whose
  prompt tokens fit in prefill_token_budget; if none fits, the first candidate alone.
- KV budget (``kv_token_budget``, off by default): a request holds its prompt tokens computed so
  far plus its generated tokens until it finishes; admission keeps the longest prefix of the
  admitted candidates whose whole prompts fit in the budget minus what is held; with nothing
  resident (after decodes finish, before admission) the first candidate is admitted anyway.
- KV blocks (``kv_blocks`` of ``block_size`` tokens, off by default): a resident request holds
  ceil((prompt + generated - 1) / block_size) blocks (every token but the last sampled one has its
  KV computed); one admitted and still prefilling holds its whole prefill's blocks. Decode choice
  comes first; each decoded request, in decode order, needs ceil((prompt + generated) /
  block_size) blocks; while it needs one more than it holds and none is free, the resident request
  last in the step's sparing order that is not yet preempted this step is preempted (it may be the
  request itself). The sparing order: the wait cap's forced decodes, then the other decodes in the
  policy's decode order, then the residents not decoded in that order (fcfs: row order, so the
  highest row not decoded goes first); the decodes ask for blocks in that order too. A preempted
  request decodes nothing, holds nothing, and waits in front of every other waiting request (the last preempted
  first); its next prefill is prompt + generated tokens and emits its next token (not a first
  token, not an admission). A step that preempted admits nothing. Otherwise admission takes the
  re-queued requests first, then the usual candidates, the longest prefix that also fits the free
  blocks (each its whole prefill's blocks).
- Prefix caching (``prefix_caching``, with KV blocks; tests/reference_prefix.py): blocks are named,
  shared and kept after release until reused. Each candidate in turn looks up its cached blocks
  (seeing those taken before it), counts only its other tokens against the budget, needs free
  blocks for the rest and for its hit blocks without a holder, and its prefill starts after the
  hit. Requests finishing in a step free their blocks in order: decodes, then first tokens, then
  re-prefills; a preempted request frees its blocks when preempted.
- Decode: the requests resident before the step. All of them if they fit in decode_slots, else
  starving ones first (step - last_served > wait_cap, wait_cap > 0; if too many, smallest
  last_served, ties by row), then the policy order (fcfs: row; countdown: max(pred - generated,
  0.5); aging: that * 0.9 ** (wait / 30)), ties by row.
- Duration = step_time(prefill tokens, sum of squared prompts, decode batch, decode context), where
  decode context = sum over decoded of prompt + tokens generated before the step.
- At the step end: admitted requests get admit_s = t, first_token_s = end, 1 token; decoded
  requests get one more token; a request whose generated count reaches its output length finishes
  at the end of the step and leaves residency.
"""

from __future__ import annotations

import functools
import math
from decimal import Decimal, localcontext
from fractions import Fraction

import reference_prefix
from reference_prefix import Pool

POLICIES = ("fcfs", "countdown", "aging")


class NotModelled(ValueError):
    """A policy this reference does not model: never silently simulated as another one."""

    def __init__(self, policy: str):
        super().__init__(f"the reference simulator does not model policy {policy!r} (models: {', '.join(POLICIES)})")

TAU_S = 30.0
AGING_PERIOD_S = 5.0
REMAINING_FLOOR = 0.5


def unit_step_time(prefill_tokens, prefill_sq, decode_batch, decode_context):
    return 1.0


DIGITS = 60


def _decimal(x: Fraction) -> Decimal:
    with localcontext() as ctx:
        ctx.prec = DIGITS
        return Decimal(x.numerator) / Decimal(x.denominator)


@functools.cache
def _ln(x: Fraction) -> Decimal:
    with localcontext() as ctx:
        ctx.prec = DIGITS
        return _decimal(x).ln()


LN_GAMMA = _ln(Fraction(9, 10))   # gamma = 0.9 exactly


def _aging_key(score, t, arrival):
    """score * 0.9 ** (wait / 30) as an exactly comparable value.

    Floating point cannot decide ties of this product: 30 * 0.9 ** (40/30) and 27 * 0.9 ** (10/30)
    are equal, yet their float64 values differ in the last bit, in either direction. So the key is
    compared as its logarithm, ln(score) + (wait / 30) * ln(0.9), evaluated from the exact inputs
    with 60 significant digits and rounded to 1e-40: mathematically equal keys tie (and fall back
    to row order, as the semantics say), unequal ones keep their order.
    """
    clock = math.floor(t / AGING_PERIOD_S) * AGING_PERIOD_S
    wait = max(Fraction(0), Fraction(clock) - Fraction(arrival))
    score = Fraction(score)
    assert score > 0
    with localcontext() as ctx:
        ctx.prec = DIGITS
        key = _ln(score) + _decimal(wait / Fraction(TAU_S)) * LN_GAMMA
        return key.quantize(Decimal("1e-40"))


def _remaining(predicted, generated):
    """Predicted remaining tokens, floored at 0.5 (exact: a float minus an integer)."""
    return max(Fraction(predicted) - generated, Fraction(REMAINING_FLOOR))


def simulate(prompt_tokens, output_tokens, arrival_s, *, policy="fcfs", predicted=None,
             step_time=unit_step_time, max_resident=512, decode_slots=64,
             prefill_token_budget=8192, wait_cap=128, request_ids=None, chunked_prefill=False,
             decodes_in_budget=False, closed_loop=None, kv_token_budget=None, kv_blocks=None, block_size=16,
             prefix_caching=False, prefix_keys=None):
    """Run the reference. Per-request inputs are in the caller's order; so are the outputs.

    Returns a dict: ``admit_s``, ``first_token_s``, ``finish_s``, ``forced_steps`` (lists in the
    caller's order), ``row_order`` (caller indices in row order) and ``steps`` (one dict per step:
    start_s, duration_s, admitted, decoded, forced (caller indices), ready, resident, waiting,
    arrived, finished (counts)).
    """
    n = len(prompt_tokens)
    assert len(output_tokens) == n and len(arrival_s) == n
    if policy not in POLICIES:
        raise NotModelled(policy)
    if policy != "fcfs":
        assert predicted is not None and len(predicted) == n, "this policy needs predictions"
    if request_ids is None:
        request_ids = [f"r{i}" for i in range(n)]
    prompt = [int(p) for p in prompt_tokens]
    length = [int(o) for o in output_tokens]
    arrival = [float(a) for a in arrival_s]
    pred = [float(p) for p in predicted] if predicted is not None else None
    assert all(o >= 1 for o in length) and all(p >= 1 for p in prompt)

    # row order: (arrival, id as a string)
    rows = sorted(range(n), key=lambda i: (arrival[i], i))
    if closed_loop is not None:
        for i in rows[closed_loop:]:
            arrival[i] = math.inf
    row_of = [0] * n
    for position, i in enumerate(rows):
        row_of[i] = position

    WAITING, RESIDENT, DONE = "waiting", "resident", "done"
    state = [WAITING] * n            # WAITING also covers "not arrived yet"; arrival decides
    generated = [0] * n
    last_served = [None] * n
    forced_steps = [0] * n
    admit_s = [None] * n
    first_token_s = [None] * n
    finish_s = [None] * n
    computed = [0] * n              # prompt tokens prefilled so far (chunked prefill)
    fill = list(prompt)             # tokens the next prefill computes (prompt + generated after a preemption)
    requeued = []                   # preempted requests, waiting; the last one is readmitted first
    preemptions = [0] * n
    released = min(closed_loop, n) if closed_loop is not None else n
    log = []
    pool = Pool(kv_blocks, block_size, prompt, prefix_keys) if kv_blocks is not None and prefix_caching else None
    cached_tokens = [0] * n

    t = 0.0
    step = 0
    n_done = 0
    while n_done < n:
        arrived = [i for i in rows if arrival[i] <= t]
        waiting = [i for i in arrived if state[i] == WAITING and i not in requeued]
        resident = [i for i in rows if state[i] == RESIDENT]
        partial = [i for i in rows if state[i] == "prefilling"]
        if not waiting and not resident and not partial and not requeued:
            t = min(arrival[i] for i in range(n) if arrival[i] > t)
            continue

        done_before = n_done
        ready = resident
        forced, decoded = _decode_choice(policy, ready, decode_slots, wait_cap, step, last_served, row_of, pred,
                                         generated, t, arrival)
        preempted, grown = [], 0
        if kv_blocks is not None:
            ranked = _policy_order(policy, ready, row_of, pred, generated, t, arrival)
            spared = forced + [i for i in ranked if i in decoded and i not in forced] + [
                i for i in ranked if i not in decoded]   # decodes ask from the front, victims from the back
            if pool is not None:
                preempted = reference_prefix.grow(spared[:len(decoded)], spared, prompt, generated, pool)
            else:
                preempted, grown = _grow_blocks(spared[:len(decoded)], spared, prompt, generated, computed, fill, state,
                                                kv_blocks, block_size, rows)
            for i in preempted:
                state[i] = WAITING
                computed[i] = 0
                fill[i] = prompt[i] + generated[i]
                preemptions[i] += 1
                requeued.append(i)
            decoded = [i for i in decoded if i not in preempted]
            forced = [i for i in forced if i not in preempted]
            resident = [i for i in resident if i not in preempted]
        # ---- admission: the budget left after decodes and a carried chunk
        admitted = []
        readmitted = []
        chunk_of = {}
        room = max_resident - len(resident) - len(partial)
        budget = prefill_token_budget - (len(decoded) if decodes_in_budget else 0)
        for i in partial:
            c = min(fill[i] - computed[i], max(budget, 0))
            chunk_of[i] = c
            budget -= c
        if kv_blocks is not None and not preempted and room > 0 and budget > 0 and (requeued or waiting):
            readmitted, admitted = _admit_blocks(policy, requeued[::-1], waiting, room, budget, fill, chunk_of,
                                                 chunked_prefill, pred, row_of, t, arrival, kv_blocks, block_size,
                                                 prompt, generated, state, rows, grown, pool)
            del requeued[len(requeued) - len(readmitted):]
            for i in readmitted + admitted:   # the prefill starts after the cached tokens
                computed[i] = pool.start[i] if pool is not None else 0
                if pool is not None and preemptions[i] == 0:
                    cached_tokens[i] = pool.start[i]
        elif kv_blocks is None and room > 0 and waiting and budget > 0:
            if policy == "fcfs":
                candidates = list(waiting)
            elif policy == "countdown":
                candidates = sorted(waiting, key=lambda i: (pred[i], row_of[i]))
            elif policy == "aging":
                candidates = sorted(waiting, key=lambda i: (_aging_key(pred[i], t, arrival[i]), row_of[i]))
            else:
                raise NotModelled(policy)
            candidates = candidates[:room]
            total = 0
            for i in candidates:
                if total + prompt[i] > budget:
                    if chunked_prefill and total < budget:
                        admitted.append(i)
                        chunk_of[i] = budget - total
                    break
                admitted.append(i)
                chunk_of[i] = prompt[i]
                total += prompt[i]
            if not admitted:
                admitted = [candidates[0]]
                chunk_of[candidates[0]] = prompt[candidates[0]]
            if kv_token_budget is not None:
                held = sum(computed[i] + generated[i] for i in resident + partial)
                fits, total = 0, 0
                for i in admitted:
                    if total + prompt[i] > kv_token_budget - held:
                        break
                    total += prompt[i]
                    fits += 1
                for i in admitted[fits if fits or resident else 1:]:
                    del chunk_of[i]
                admitted = admitted[:fits if fits or resident else 1]

        # ---- step time
        prefill_tokens = sum(chunk_of.values())
        prefill_sq = sum(c * (computed[i] + c) for i, c in chunk_of.items())
        context = sum(prompt[i] + generated[i] for i in decoded)
        duration = step_time(prefill_tokens, prefill_sq, len(decoded), context)
        end = t + duration

        # ---- the step's effects land at its end
        finishers = ([], [], [])   # decodes, first tokens, re-prefills: the order they free their blocks
        for i in decoded:
            generated[i] += 1
            last_served[i] = step
            if generated[i] == length[i]:
                state[i] = DONE
                finish_s[i] = end
                n_done += 1
                finishers[0].append(i)
        for i in forced:
            forced_steps[i] += 1
        completes = []
        for i, c in chunk_of.items():
            computed[i] += c
            if computed[i] == fill[i]:
                completes.append(i)
            else:
                state[i] = "prefilling"
        for i in admitted:
            admit_s[i] = t
        for i in completes:
            resumed = first_token_s[i] is not None
            if not resumed:
                first_token_s[i] = end
                generated[i] = 1
            else:   # a re-prefill after a preemption emits the next token
                generated[i] += 1
            last_served[i] = step
            state[i] = RESIDENT
            if generated[i] == length[i]:
                state[i] = DONE
                finish_s[i] = end
                n_done += 1
                finishers[2 if resumed else 1].append(i)
        for i in (finishers[0] + finishers[1] + finishers[2]) if pool is not None else ():
            pool.release(i, prompt[i] + generated[i] - 1)

        if closed_loop is not None:   # each request finished this step submits the next row
            for _ in range(n_done - done_before):
                if released < n:
                    arrival[rows[released]] = end
                    released += 1
        log.append({
            "start_s": t, "duration_s": duration,
            "admitted": len(admitted), "decoded": len(decoded), "forced": len(forced),
            "ready": len(ready),
            "resident": len(ready) - len(preempted) + len(admitted) + len(readmitted) + len(partial),
            "waiting": len(waiting) + len(requeued) - len(admitted), "arrived": len(arrived), "finished": n_done,
            "preempted_ids": list(preempted), "readmitted_ids": list(readmitted),
            "admitted_ids": list(admitted), "decoded_ids": list(decoded), "forced_ids": list(forced),
        })
        t = end
        step += 1

    return {"admit_s": admit_s, "first_token_s": first_token_s, "finish_s": finish_s,
            "forced_steps": forced_steps, "row_order": rows, "steps": log, "preemptions": preemptions,
            "cached_tokens": cached_tokens}


def _decode_key(policy, i, row_of, pred, generated, t, arrival):
    if policy == "fcfs":
        return (row_of[i],)
    if policy == "countdown":
        return (_remaining(pred[i], generated[i]), row_of[i])
    if policy == "aging":
        return (_aging_key(_remaining(pred[i], generated[i]), t, arrival[i]), row_of[i])
    raise NotModelled(policy)


def _policy_order(policy, rows_in, row_of, pred, generated, t, arrival):
    return sorted(rows_in, key=lambda i: _decode_key(policy, i, row_of, pred, generated, t, arrival))


def _decode_choice(policy, ready, decode_slots, wait_cap, step, last_served, row_of, pred, generated, t, arrival):
    """(forced, decoded): the wait cap's starving first, then the policy's order."""
    if len(ready) <= decode_slots:
        return [], list(ready)
    starving = [i for i in ready if step - last_served[i] > wait_cap] if wait_cap > 0 else []
    if len(starving) >= decode_slots:
        forced = sorted(starving, key=lambda i: (last_served[i], row_of[i]))[:decode_slots]
        return forced, list(forced)
    rest = [i for i in ready if i not in starving]
    ranked = _policy_order(policy, rest, row_of, pred, generated, t, arrival)
    return list(starving), starving + ranked[:decode_slots - len(starving)]


def _held_blocks(i, state, prompt, generated, fill, size):
    if state[i] == "resident":
        return -(-(prompt[i] + generated[i] - 1) // size)
    if state[i] == "prefilling":
        return -(-fill[i] // size)
    return 0


def _grow_blocks(decoded, ranked, prompt, generated, computed, fill, state, total, size, rows):
    """(the requests preempted so that each decode gets the block its next token needs, the blocks
    the decodes got)."""
    preempted = []
    extra = {}   # blocks granted this step (a preempted request's are freed with the rest)

    def free():
        held = sum(_held_blocks(i, state, prompt, generated, fill, size) + extra.get(i, 0)
                   for i in rows if i not in preempted)
        return total - held

    for i in decoded:
        if i in preempted:
            continue
        if -(-(prompt[i] + generated[i]) // size) <= _held_blocks(i, state, prompt, generated, fill, size):
            continue
        while free() < 1:
            victim = [j for j in ranked if j not in preempted][-1]
            preempted.append(victim)
            if victim == i:
                break
        if i not in preempted:
            extra[i] = 1
    return preempted, sum(extra[i] for i in extra if i not in preempted)


def _admit_blocks(policy, requeued, waiting, room, budget, fill, chunk_of, chunked, pred, row_of, t, arrival,
                  total, size, prompt, generated, state, rows, grown, pool=None):
    """(readmitted, admitted): re-queued first, then the admission order; budget, room and free blocks."""
    if policy == "fcfs":
        fresh = list(waiting)
    elif policy == "countdown":
        fresh = sorted(waiting, key=lambda i: (pred[i], row_of[i]))
    else:
        fresh = sorted(waiting, key=lambda i: (_aging_key(pred[i], t, arrival[i]), row_of[i]))
    candidates = (list(requeued) + fresh)[:room]
    free = total - grown - sum(_held_blocks(i, state, prompt, generated, fill, size) for i in rows)
    taken, tokens = [], 0
    for i in candidates:   # with a prefix cache each looks up its hit after those taken before it
        hit = pool.lookup(i, fill[i]) if pool is not None else []
        rest = fill[i] - len(hit) * size
        chunk = rest
        if tokens + rest > budget:
            if chunked and tokens < budget:
                chunk = budget - tokens
            elif taken or chunked:
                break
        need = pool.needs(hit, fill[i]) if pool is not None else -(-fill[i] // size)
        if need > (len(pool.free) if pool is not None else free):
            break
        free -= need
        if pool is not None:
            pool.hold(i, hit, fill[i])
            pool.start[i] = len(hit) * size
        taken.append(i)
        chunk_of[i] = chunk
        tokens += rest
        if chunk < rest:
            break
    readmitted = [i for i in taken if i in requeued]
    return readmitted, [i for i in taken if i not in requeued]
