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
             decodes_in_budget=False, closed_loop=None, kv_token_budget=None):
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
    released = min(closed_loop, n) if closed_loop is not None else n
    log = []

    t = 0.0
    step = 0
    n_done = 0
    while n_done < n:
        arrived = [i for i in rows if arrival[i] <= t]
        waiting = [i for i in arrived if state[i] == WAITING]
        resident = [i for i in rows if state[i] == RESIDENT]
        partial = [i for i in rows if state[i] == "prefilling"]
        if not waiting and not resident and not partial:
            t = min(arrival[i] for i in range(n) if arrival[i] > t)
            continue

        done_before = n_done
        # ---- admission (see below: the budget left after decodes and a carried chunk)
        admitted = []
        chunk_of = {}
        room = max_resident - len(resident) - len(partial)
        budget = prefill_token_budget - (min(len(resident), decode_slots) if decodes_in_budget else 0)
        for i in partial:
            c = min(prompt[i] - computed[i], max(budget, 0))
            chunk_of[i] = c
            budget -= c
        if room > 0 and waiting and budget > 0:
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

        # ---- decode choice among the requests resident before this step
        ready = resident
        forced = []
        if len(ready) <= decode_slots:
            decoded = list(ready)
        else:
            starving = []
            if wait_cap > 0:
                starving = [i for i in ready if step - last_served[i] > wait_cap]
            if len(starving) >= decode_slots:
                forced = sorted(starving, key=lambda i: (last_served[i], row_of[i]))[:decode_slots]
                decoded = list(forced)
            else:
                forced = list(starving)
                rest = [i for i in ready if i not in starving]
                if policy == "fcfs":
                    ranked = rest
                elif policy == "countdown":
                    ranked = sorted(rest, key=lambda i: (_remaining(pred[i], generated[i]), row_of[i]))
                elif policy == "aging":
                    ranked = sorted(rest, key=lambda i: (_aging_key(_remaining(pred[i], generated[i]), t,
                                                                    arrival[i]), row_of[i]))
                else:
                    raise NotModelled(policy)
                decoded = forced + ranked[:decode_slots - len(forced)]

        # ---- step time
        prefill_tokens = sum(chunk_of.values())
        prefill_sq = sum(c * (computed[i] + c) for i, c in chunk_of.items())
        context = sum(prompt[i] + generated[i] for i in decoded)
        duration = step_time(prefill_tokens, prefill_sq, len(decoded), context)
        end = t + duration

        # ---- the step's effects land at its end
        for i in decoded:
            generated[i] += 1
            last_served[i] = step
            if generated[i] == length[i]:
                state[i] = DONE
                finish_s[i] = end
                n_done += 1
        for i in forced:
            forced_steps[i] += 1
        completes = []
        for i, c in chunk_of.items():
            computed[i] += c
            if computed[i] == prompt[i]:
                completes.append(i)
            else:
                state[i] = "prefilling"
        for i in admitted:
            admit_s[i] = t
        for i in completes:
            first_token_s[i] = end
            generated[i] = 1
            last_served[i] = step
            state[i] = RESIDENT
            if length[i] == 1:
                state[i] = DONE
                finish_s[i] = end
                n_done += 1

        if closed_loop is not None:   # each request finished this step submits the next row
            for _ in range(n_done - done_before):
                if released < n:
                    arrival[rows[released]] = end
                    released += 1
        log.append({
            "start_s": t, "duration_s": duration,
            "admitted": len(admitted), "decoded": len(decoded), "forced": len(forced),
            "ready": len(ready), "resident": len(ready) + len(admitted) + len(partial),
            "waiting": len(waiting) - len(admitted), "arrived": len(arrived), "finished": n_done,
            "admitted_ids": list(admitted), "decoded_ids": list(decoded), "forced_ids": list(forced),
        })
        t = end
        step += 1

    return {"admit_s": admit_s, "first_token_s": first_token_s, "finish_s": finish_s,
            "forced_steps": forced_steps, "row_order": rows, "steps": log}
