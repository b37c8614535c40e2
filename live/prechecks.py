"""``leap-serve`` checks that need no engine: each refuses bad input with one line before vLLM
starts (which costs about 20 s and a core), so a run that cannot succeed never begins. None of
them imports vLLM or torch; ``live.serve`` calls them in order as soon as their inputs are known.
"""

from __future__ import annotations

from pathlib import Path

from capture import CaptureError


def check_resume(resume: bool, out: Path | None) -> None:
    """``--resume`` continues what an earlier run left at ``--out``: with nothing there, it would
    silently start a new run."""
    if not resume or out is None:
        return
    parts = out.with_name(out.name + ".parts")
    if not out.exists() and not parts.exists():
        raise CaptureError(f"--resume: nothing to resume at {out} (no {out.name} and no {parts.name}); "
                           "drop --resume to start a new run")


def check_arrivals_file(arrivals: str | None, clock: str = "seconds") -> None:
    """A CSV of arrival times is read now, so that an empty or unreadable one is refused before the
    engine starts (it is read again when the arrival times are planned). A CSV of arrival steps
    (``--clock steps``) is checked by :mod:`live.stepclock` instead."""
    if arrivals is None or arrivals == "poisson" or clock == "steps":
        return
    from core.arrivals import read_timestamps_csv

    try:
        read_timestamps_csv(Path(arrivals))
    except ValueError as exc:
        raise CaptureError(str(exc)) from None


def check_prompt_text(source: str, meta: dict, columns: list[str], texts: list) -> None:
    """The requests' prompts must be recoverable: from the trace's ``prompt_text`` column, or from
    the prompt sources its metadata names. A file source that is not here means the trace has no
    prompt text to serve, which is what the user needs to hear (not a bare "file not found")."""
    if "prompt_text" in columns and all(t is not None for t in texts):
        return
    sources = meta.get("prompt_sources") or (meta.get("run_config") or {}).get("prompt_sources") or []
    what = "has no prompt text" if "prompt_text" not in columns else "lacks the prompt text of some requests"
    if not sources:
        raise CaptureError(f"{source}: the trace {what} and names no prompt source to re-read it from")
    from capture.prompts import FILE_KINDS, SOURCES

    for spec in sources:
        name = str(spec).partition("@")[0]
        kind, colon, path = name.partition(":")
        if colon and kind in FILE_KINDS and not Path(path).is_file():
            raise CaptureError(f"{source}: the trace {what}, and its prompt source {spec} is not a file "
                               "here; serve a trace recorded with prompt text, or place that file")
        if not (colon and kind in FILE_KINDS) and name not in SOURCES:   # e.g. a dataset described in words
            raise CaptureError(f"{source}: the trace {what}, and its prompt source {str(spec)[:80]!r} is not "
                               "one leap-serve can re-read; serve a trace recorded with prompt text")


def check_readout(live, model_dir: Path, kv_space_gib: float, dtype: str) -> None:
    """A LEAP read-out must fit the model (hidden size, layer count, model id): ``leap_sched.vllm.check``'s
    check, run before the engine instead of when the engine's hook first reads a hidden state."""
    if live is None or not getattr(live, "needs_hook", False):
        return
    from live.config import LiveConfigError

    try:
        live.check_model(model_dir, kv_cache_gib=kv_space_gib, dtype=dtype)
    except LiveConfigError as exc:
        raise CaptureError(f"live scheduler: {exc}") from None
