"""Hardware and model constants of the serving GPU: what the engine's roofline step time and the
predictors' GPU cost are both computed from, so the two always agree.

Sources
- Model shapes: Hugging Face config.json of Qwen/Qwen3-8B (36 layers, hidden 4096, MLP 12288,
  32 query / 8 KV heads of 128, vocab 151,936, untied embeddings) and meta-llama/Meta-Llama-3-8B
  (32 layers, MLP 14336, vocab 128,256). Weights are bf16 (2 bytes).
- GPUs: vendor datasheets. A100-80GB SXM 2.039 TB/s, 312 TFLOP/s bf16 dense; H100 SXM 3.35 TB/s,
  989 TFLOP/s; H200 4.8 TB/s, 989 TFLOP/s.
- Efficiencies (HBM 0.70, tensor cores 0.64) are fitted to Vidur's A100 profile of Llama-3-8B
  (see :mod:`simulator.profiles.roofline`, which documents the fit and its anchor points).
- Eager-mode dispatch: each decoder layer issues about a dozen kernels, each costing ~8 us of
  Python/PyTorch dispatch when not captured in a graph: ~0.1 ms per layer (an estimate; no GPU was
  available to measure it).
"""

from __future__ import annotations

from dataclasses import dataclass

BF16_BYTES = 2


@dataclass(frozen=True)
class ModelShape:
    name: str
    layers: int
    hidden: int
    intermediate: int
    q_heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @property
    def layer_params(self) -> int:
        q = self.hidden * self.q_heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        o = self.q_heads * self.head_dim * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        return q + kv + o + mlp

    @property
    def body_params(self) -> int:
        """Parameters of the decoder stack (every token passes through them)."""
        return self.layers * self.layer_params

    @property
    def head_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * BF16_BYTES

    @property
    def attention_width(self) -> int:
        return self.q_heads * self.head_dim


@dataclass(frozen=True)
class GPU:
    name: str
    hbm_bytes_per_s: float
    bf16_flop_per_s: float


QWEN3_8B = ModelShape("Qwen3-8B", layers=36, hidden=4096, intermediate=12288, q_heads=32, kv_heads=8,
                      head_dim=128, vocab=151_936)
LLAMA3_8B = ModelShape("Llama-3-8B", layers=32, hidden=4096, intermediate=14336, q_heads=32, kv_heads=8,
                       head_dim=128, vocab=128_256)
A100_80GB = GPU("A100-80GB-SXM", 2.039e12, 312e12)
H100 = GPU("H100-SXM", 3.35e12, 989e12)
H200 = GPU("H200", 4.8e12, 989e12)

HBM_EFFICIENCY = 0.70
FLOP_EFFICIENCY = 0.64
EAGER_S_PER_LAYER = 0.1e-3


@dataclass(frozen=True)
class Hardware:
    """The serving system a run's engine profile models: what predictor costs are charged on."""

    model: ModelShape
    gpu: GPU


#: The default engine's system (``qwen3-8b-h100``); profiles without hardware of their own
#: (``unit``, ``fitted``) charge predictor costs on it.
DEFAULT_HARDWARE = Hardware(QWEN3_8B, H100)
