"""The KV link of a prefill/decode fleet (docs/semantics.md "Prefill/decode disaggregation"): how
long a request's prompt KV takes from its prefill instance to its decode instance.

Bytes = prompt tokens x the model's KV bytes per token (layers x KV heads x head dim x 2 (K and V)
x 2 bytes bf16: :attr:`core.hardware.ModelShape.kv_bytes_per_token`, Qwen3-8B 147,456 B). Time =
fixed latency + bytes x 8 / (Gbit/s x 1e9). Each transfer has the link to itself (no sharing between
concurrent transfers is modelled).

Defaults (assumptions, stated): 400 Gbit/s, one NDR InfiniBand port per GPU, as in NVIDIA's DGX H100
(each H100 wired to its own 400 Gb/s ConnectX-7; Splitwise sizes its H100 cluster's KV transfers on
the same InfiniBand); 0.01 ms fixed latency per transfer, an RDMA round trip's order (microseconds);
the connectors' per-request handshakes (vLLM's NixlConnector metadata exchange) are not modelled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from core.hardware import Hardware

DEFAULT_KV_LINK_GBPS = 400.0
DEFAULT_KV_LINK_LATENCY_MS = 0.01


@dataclass(frozen=True)
class KVLink:
    gbps: float = DEFAULT_KV_LINK_GBPS
    latency_ms: float = DEFAULT_KV_LINK_LATENCY_MS

    def __post_init__(self) -> None:
        if isinstance(self.gbps, bool) or not isinstance(self.gbps, (int, float)) or not (
                math.isfinite(self.gbps) and self.gbps > 0):
            raise ValueError(f"--kv-link-gbps must be a number > 0, got {self.gbps!r}")
        if isinstance(self.latency_ms, bool) or not isinstance(self.latency_ms, (int, float)) or not (
                math.isfinite(self.latency_ms) and self.latency_ms >= 0):
            raise ValueError(f"--kv-link-latency-ms must be a number >= 0, got {self.latency_ms!r}")

    def seconds(self, prompt_tokens: int, hardware: Hardware) -> float:
        """Transfer time of a prompt's KV on this link."""
        bits = 8.0 * prompt_tokens * hardware.model.kv_bytes_per_token
        return self.latency_ms / 1e3 + bits / (self.gbps * 1e9)
