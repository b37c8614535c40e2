"""Routers' compiled forms: plain functions the compiled fleet loop (simulator/fleet_loop.py)
compiles in, as a policy's rule is compiled into the engine's kernel (policies/rule.py).

A router declares its rule on its class (``Router.compiled_rule``, None: it routes in Python on the
compiled kernel too). Every rule has one signature, ``rule(state, outstanding, work, true_work,
draws) -> replica``: ``state`` is the router's own int64 counters (``state[0]`` the requests routed
so far, ``state[1]`` the next unread entry of ``draws``), ``outstanding`` / ``true_work`` the
accounting's int64 counters, ``work`` the predicted work (float64, routers/snapshot.py), ``draws``
the router's random 32-bit words in generator order (power-of-two). Each rule is the same decision
as its router's ``choose``, ties to the lowest index (``np.argmin``'s first minimum). A rule
returns -1 when it ran out of ``draws`` (the loop stops with an error; never silently).
"""

from __future__ import annotations

import numpy as np

#: the rules' per-run counters (``state``): requests routed, next unread draw
ROUTED, NEXT_DRAW = 0, 1
STATE_SIZE = 2


def _lowest(values):
    """The index of the first minimum of ``values`` (int64 counters or float64 work: numba
    compiles one specialisation per dtype)."""
    best = 0
    for i in range(1, values.shape[0]):
        if values[i] < values[best]:
            best = i
    return best


def round_robin(state, outstanding, work, true_work, draws):
    """routers/round_robin.py: request k (arrival order) to replica k mod N."""
    replica = state[ROUTED] % outstanding.shape[0]
    state[ROUTED] += 1
    return replica


def least_requests(state, outstanding, work, true_work, draws):
    """routers/least_requests.py: the fewest outstanding requests."""
    state[ROUTED] += 1
    return _lowest(outstanding)


def least_work(state, outstanding, work, true_work, draws):
    """routers/least_work.py: the least predicted outstanding work."""
    state[ROUTED] += 1
    return _lowest(work)


def oracle_work(state, outstanding, work, true_work, draws):
    """routers/oracle_work.py: the least true outstanding work."""
    state[ROUTED] += 1
    return _lowest(true_work)


def _bounded(draws, state, rng):
    """numpy's ``random_bounded_uint64(0, rng)`` for 0 < rng < 2**32 - 1: Lemire's method on the
    generator's 32-bit words (``buffered_bounded_lemire_uint32``); -1 when ``draws`` ran out."""
    rng_excl = np.uint64(rng + 1)
    i = state[NEXT_DRAW]
    if i >= draws.shape[0]:
        return -1
    m = np.uint64(draws[i]) * rng_excl
    i += 1
    leftover = m & np.uint64(0xFFFFFFFF)
    if leftover < rng_excl:
        threshold = (np.uint64(0xFFFFFFFF) - np.uint64(rng)) % rng_excl
        while leftover < threshold:
            if i >= draws.shape[0]:
                return -1
            m = np.uint64(draws[i]) * rng_excl
            i += 1
            leftover = m & np.uint64(0xFFFFFFFF)
    state[NEXT_DRAW] = i
    return np.int64(m >> np.uint64(32))


def power_of_two(state, outstanding, work, true_work, draws):
    """routers/power_of_two.py: ``Generator.choice(N, 2, replace=False)`` replayed word for word
    (numpy's Floyd sampling for N <= 10,000, then its shuffle of the pair, one word), the pair
    sorted; the one with fewer outstanding requests, on a tie the lower index. One replica: it,
    nothing drawn."""
    n = outstanding.shape[0]
    state[ROUTED] += 1
    if n == 1:
        return 0
    first = _bounded(draws, state, n - 2) if n > 2 else 0   # rng 0: numpy draws nothing
    drawn = _bounded(draws, state, n - 1)
    if first < 0 or drawn < 0 or state[NEXT_DRAW] >= draws.shape[0]:
        return -1
    second = n - 1 if drawn == first else drawn
    state[NEXT_DRAW] += 1   # the shuffle of the pair: random_interval(1), one word, order undone by the sort
    a, b = min(first, second), max(first, second)
    return b if outstanding[b] < outstanding[a] else a


def words(generator: np.random.Generator, count: int) -> np.ndarray:
    """The next ``count`` 32-bit words a fresh PCG64 ``generator`` hands its bounded draws
    (``next_uint32``: the low half of a 64-bit output, then its high half), as uint32. The
    generator's own state advances by those outputs (it is spent for the run)."""
    bits = generator.bit_generator
    if type(bits).__name__ != "PCG64" or bits.state["has_uint32"]:
        raise ValueError("power-of-two's compiled rule replays a fresh PCG64 generator")
    raw = bits.random_raw((count + 1) // 2).astype(np.uint64)
    out = np.empty(2 * len(raw), dtype=np.uint32)
    out[0::2] = (raw & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    out[1::2] = (raw >> np.uint64(32)).astype(np.uint32)
    return out[:count]


#: every rule, for the loop's compile (one loop per rule) and the tests
RULES = (round_robin, least_requests, least_work, oracle_work, power_of_two)
