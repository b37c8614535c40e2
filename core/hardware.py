"""Hardware and model constants of the serving GPU: what the engine's roofline step time and the
predictors' GPU cost are both computed from, so the two always agree.

Sources
- Model shapes: Hugging Face config.json of Qwen/Qwen3-8B (36 layers, hidden 4096, MLP 12288,
  32 query / 8 KV heads of 128, vocab 151,936, untied embeddings) and meta-llama/Meta-Llama-3-8B
  (32 layers, MLP 14336, vocab 128,256). Weights are bf16 (2 bytes).
- GPUs: vendor datasheets. A100-80GB SXM 2.039 TB/s, 312 TFLOP/s bf16 dense; H100 SXM 3.35 TB/s,
  989 TFLOP/s; H200 4.8 TB/s, 989 TFLOP/s. Memory: 80 GiB (A100-80GB, H100 SXM), 141 GB (H200).
- KV memory (``kv_blocks_in_memory``): vLLM's default ``gpu_memory_utilization`` 0.9 of the GPU's
  memory, less the weights (embedding, decoder stack and untied head, bf16), in blocks of
  ``block_size`` tokens; activations and CUDA graphs are not modelled (an upper bound).
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
    def resident_weight_bytes(self) -> int:
        """Bytes the weights occupy (untied input embedding and output head, both ``head_params``)."""
        return (self.body_params + 2 * self.head_params) * BF16_BYTES

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
    memory_bytes: int


QWEN3_8B = ModelShape("Qwen3-8B", layers=36, hidden=4096, intermediate=12288, q_heads=32, kv_heads=8,
                      head_dim=128, vocab=151_936)
LLAMA3_8B = ModelShape("Llama-3-8B", layers=32, hidden=4096, intermediate=14336, q_heads=32, kv_heads=8,
                       head_dim=128, vocab=128_256)
A100_80GB = GPU("A100-80GB-SXM", 2.039e12, 312e12, 80 * 2**30)
H100 = GPU("H100-SXM", 3.35e12, 989e12, 80 * 2**30)
H200 = GPU("H200", 4.8e12, 989e12, 141 * 10**9)

HBM_EFFICIENCY = 0.70
FLOP_EFFICIENCY = 0.64
EAGER_S_PER_LAYER = 0.1e-3
GPU_MEMORY_UTILIZATION = 0.9   # vLLM's default share of GPU memory for weights + KV cache


@dataclass(frozen=True)
class Hardware:
    """The serving system a run's engine profile models: what predictor costs are charged on."""

    model: ModelShape
    gpu: GPU


#: The default engine's system (``qwen3-8b-h100``); profiles without hardware of their own
#: (``unit``, ``fitted``) charge predictor costs on it.
DEFAULT_HARDWARE = Hardware(QWEN3_8B, H100)


def kv_blocks_in_memory(hardware: Hardware, block_size: int) -> int:
    """KV blocks of ``block_size`` tokens that fit beside the weights in vLLM's share of GPU memory."""
    free = int(GPU_MEMORY_UTILIZATION * hardware.gpu.memory_bytes) - hardware.model.resident_weight_bytes
    return max(free // (hardware.model.kv_bytes_per_token * block_size), 0)
