"""A kernel's first call in a process holds its cache folder's lock, so that a sweep's workers
starting together on an empty numba cache compile it once (the others wait, then load it)."""

from __future__ import annotations

import multiprocessing

from core.jit import compile_lock
from simulator import kernel


def _hold(folder: str, held, release, trying=None) -> None:
    if trying is not None:
        trying.set()
    with compile_lock(folder):
        held.set()
        release.wait(60)


def test_a_second_process_waits_for_the_lock(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    held, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(str(tmp_path / "kernel-x"), held, release))
    holder.start()
    try:
        assert held.wait(60)
        waiter_held, waiter_release, trying = ctx.Event(), ctx.Event(), ctx.Event()
        waiter = ctx.Process(target=_hold, args=(str(tmp_path / "kernel-x"), waiter_held, waiter_release, trying))
        waiter.start()
        assert trying.wait(60)
        assert not waiter_held.wait(1.0)   # blocked while the holder holds the lock
        release.set()
        assert waiter_held.wait(60)        # and gets it once the holder lets go
        waiter_release.set()
        waiter.join(60)
        assert waiter.exitcode == 0
    finally:
        release.set()
        holder.join(60)
    assert holder.exitcode == 0
    with compile_lock(str(tmp_path / "kernel-x")):   # free again once the holder ends
        pass


class _Dispatcher:
    """Stands for a numba dispatcher: no signatures until its first call compiles one."""

    def __init__(self):
        self.signatures: list = []

    def __call__(self, x):
        self.signatures.append("int64")
        return x + 1


def test_first_call_locks_the_rules_folder_once(monkeypatch):
    taken = []

    class Recording:
        def __init__(self, folder):
            taken.append(folder)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr("core.jit.compile_lock", Recording)
    fn = _Dispatcher()
    assert kernel.first_call(fn, kernel.DEFAULT_RULE, 1) == 2
    assert kernel.first_call(fn, kernel.DEFAULT_RULE, 2) == 3
    assert taken == [kernel.numba_cache_folder(kernel.DEFAULT_RULE)]
    assert kernel.first_call(lambda x: x * 2, kernel.DEFAULT_RULE, 4) == 8   # plain Python: no lock
    assert len(taken) == 1
