"""Hook -> scheduler hand-off across processes, for tensor parallel > 1 (docs/serving.md, "Tensor parallel").

With vLLM's ``mp`` executor the model runs in worker processes, one per rank, and the scheduler in
the engine-core process. Rank 0's hook writes one frame per prefill batch into a per-engine folder
(the scheduler makes it and removes it at shutdown): ``NNNNNNNNNNNN.npz`` numbered from 0, written
under a temporary name and renamed, so a frame is whole or absent. The scheduler reads the frames
in number order at its next step start. That step starts after rank 0 returned the step's output
(vLLM's ``output_rank`` is rank 0 for tensor parallel alone), and rank 0's forward -- and so its
hook and the rename -- ran before that: the scheduler sees the same frames at the same step, run
after run, as the one-process :class:`live.worker_ext.PredictionChannel` sees its batches. One
writer, one reader, no lock needed.

A frame holds the engine ids, the read-out values, the raw vectors (leap-rls) and the hook's wall
time and forward count since the previous frame (the hook time of decode-only steps arrives with
the next prediction frame).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from pathlib import Path

import numpy as np

from live.worker_ext import PredictionChannel

PREFIX = "leap_tp_"


class _FrameWriter:
    """What the hook appends to (``channel.pending.append``): each batch becomes one frame."""

    def __init__(self, channel: FileChannelWriter) -> None:
        self.channel = channel

    def append(self, batch) -> None:
        self.channel.write(*batch)


class FileChannelWriter(PredictionChannel):
    """The worker side (rank 0's hook): sent to every rank through ``collective_rpc`` (pickled: the folder)."""

    def __init__(self, folder: str) -> None:
        super().__init__()
        self.folder = folder
        self.next_frame = 0
        self.pending = _FrameWriter(self)     # type: ignore[assignment]

    def __getstate__(self) -> dict:
        return {"folder": self.folder}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["folder"])       # type: ignore[misc]

    def forget_finished(self, live) -> None:
        """Keep ``seen`` to the runner's live requests once it holds many more (a finished request's id
        never comes back; a preempted one stays in the runner's requests)."""
        if len(self.seen) > 2 * len(live) + 64:
            self.seen.intersection_update(live.keys())

    def write(self, ids: list[str], pred, vec) -> None:
        arrays = {"ids": np.asarray(ids, dtype=str), "pred": pred.double().cpu().numpy(),
                  "hook": np.asarray([self.take_hook_s(), self.hook_calls], dtype=np.float64)}
        self.hook_calls = 0
        if vec is not None:
            arrays["vec"] = vec.cpu().numpy()
        name = os.path.join(self.folder, f"{self.next_frame:012d}.npz")
        tmp = name + ".part"
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, name)
        self.next_frame += 1


class FileChannelReader(PredictionChannel):
    """The scheduler side: owns the folder; ``drain`` reads the whole frames in number order."""

    def __init__(self) -> None:
        super().__init__()
        self.folder = tempfile.mkdtemp(prefix=PREFIX)
        self.next_frame = 0
        # removed by close(), else when the engine-core process exits (a stopped server may skip shutdown)
        self._remove = weakref.finalize(self, shutil.rmtree, self.folder, True)

    def writer(self) -> FileChannelWriter:
        return FileChannelWriter(self.folder)

    def drain(self) -> list[tuple[list[str], np.ndarray, np.ndarray | None]]:
        out: list[tuple[list[str], np.ndarray, np.ndarray | None]] = []
        while True:
            path = Path(self.folder) / f"{self.next_frame:012d}.npz"
            if not path.exists():
                return out
            with np.load(path) as z:
                hook_s, calls = z["hook"].tolist()
                out.append((z["ids"].tolist(), z["pred"], z["vec"] if "vec" in z else None))
            self.hook_s += hook_s
            self.hook_calls += int(calls)
            path.unlink()
            self.next_frame += 1

    def peek(self) -> list[tuple[list[str], np.ndarray]]:
        """The frames not drained yet, (ids, predictions) each, left in place for ``drain``: the estimate
        of a request freed in its prefill step, before the scheduler's next step takes it in."""
        out: list[tuple[list[str], np.ndarray]] = []
        frame = self.next_frame
        while (path := Path(self.folder) / f"{frame:012d}.npz").exists():   # written whole (os.replace)
            with np.load(path) as z:
                out.append((z["ids"].tolist(), z["pred"]))
            frame += 1
        return out

    def close(self) -> None:
        self._remove()
