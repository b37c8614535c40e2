"""LEAP's tap on decoder layer k that survives vLLM's compiled model (no ``--enforce-eager``).

A Python forward hook never runs inside a compiled forward (torch.compile on CPU, CUDA graphs on
GPU). The tap is instead part of the traced graph: layer k's class is swapped, on that one module,
for a subclass whose ``forward`` calls the original and then the custom op ``leap_live::tap_rows``,
which writes the residual stream (``out[0] + out[1]``, the capture hook's row arithmetic) of every
row of the step into a buffer allocated once. torch.compile keeps a registered custom op as an
opaque call with its mutation of ``out``, so the write happens in compiled and eager mode alike,
and the buffer's address never changes (what a CUDA graph needs).

The tap must be in place before vLLM traces the model (its first forward, the memory profile), so
the worker extension installs it right after the model loads (:func:`install_tap`), on the layer
the configured read-out was trained on (:func:`configured_layer`). After each forward the worker
reads the rows of the requests whose last prompt token was in the step (:func:`TapBuffer.rows`).
"""

from __future__ import annotations

from typing import Any

import torch

#: The attribute of the tapped layer that holds its :class:`TapBuffer`.
TAP_ATTR = "_leap_tap"


@torch.library.custom_op("leap_live::tap_rows", mutates_args=("out",))
def tap_rows(out: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None) -> None:
    """``out[:n] = hidden + residual`` over the step's ``n`` rows (rows past the buffer are dropped)."""
    n = min(hidden.shape[0], out.shape[0])
    out[:n].copy_(hidden[:n])
    if residual is not None:
        out[:n].add_(residual[:n])


@tap_rows.register_fake
def _tap_rows_fake(out: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None) -> None:
    return None


class TapBuffer:
    """The static buffer layer k's output rows are written to, one row per scheduled token."""

    def __init__(self, rows: int, hidden: int, dtype: torch.dtype, device: torch.device) -> None:
        self.data = torch.zeros(rows, hidden, dtype=dtype, device=device)

    def rows(self, index) -> torch.Tensor:
        """The written rows ``index`` (flattened token positions of the step just run), as float32."""
        idx = torch.as_tensor(index, dtype=torch.int64)
        if idx.numel() and int(idx.max()) >= self.data.shape[0]:
            raise ValueError(f"tap row {int(idx.max())} beyond the buffer's {self.data.shape[0]} rows")
        return self.data.index_select(0, idx.to(self.data.device, non_blocking=True)).float()


def _tapped_class(cls: Any) -> type:
    """A subclass of the decoder layer's class whose forward also writes the tap buffer."""

    def forward(self, *args, **kwargs):
        out = cls.forward(self, *args, **kwargs)
        hidden, residual = out if isinstance(out, tuple) else (out, None)
        torch.ops.leap_live.tap_rows(getattr(self, TAP_ATTR).data, hidden, residual)
        return out

    return type(f"LeapTapped{cls.__name__}", (cls,), {"forward": forward, "__module__": __name__})


def install_tap(model: torch.nn.Module, layer: int, rows: int) -> TapBuffer:
    """Tap decoder ``layer`` of ``model`` (``model.layers``) into a ``rows`` x hidden buffer; idempotent."""
    layers: Any = model.get_submodule("model.layers")
    if not 0 <= int(layer) < len(layers):
        raise ValueError(f"layer {layer} out of range: the model has {len(layers)} decoder layers")
    mod = layers[int(layer)]
    if isinstance(getattr(mod, TAP_ATTR, None), TapBuffer):
        return getattr(mod, TAP_ATTR)
    p = next(mod.parameters())
    hidden = int(getattr(model.config, "hidden_size", 0) or p.shape[-1])
    buf = TapBuffer(rows, hidden, p.dtype, p.device)
    setattr(mod, TAP_ATTR, buf)
    mod.__class__ = _tapped_class(type(mod))
    return buf


def tapped_layer(model: torch.nn.Module) -> tuple[int, TapBuffer] | None:
    """(layer index, buffer) of the tapped layer of ``model``, or None."""
    layers: Any = model.get_submodule("model.layers")
    for i, mod in enumerate(layers):
        buf = getattr(mod, TAP_ATTR, None)
        if isinstance(buf, TapBuffer):
            return i, buf
    return None


def configured_layer(additional_config) -> int | None:
    """The read-out's layer named in vLLM's ``additional_config`` (the plugin's or the in-process
    entry), or None when the settings use no read-out."""
    from live.config import CONFIG_KEY, PLUGIN_CONFIG_KEY
    from live.readout import load_readout

    if not isinstance(additional_config, dict):
        return None
    for key in (PLUGIN_CONFIG_KEY, CONFIG_KEY):
        entry = additional_config.get(key)
        if isinstance(entry, dict) and entry.get("readout"):
            return int(load_readout(entry["readout"]).info["layer"])
    return None
