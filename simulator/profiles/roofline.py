"""Analytic roofline step time for a (model, GPU) pair, calibrated on Vidur's measured profile.

One step reads every weight once plus the KV cache of the requests it decodes (memory time), and
does 2 x params FLOP per token plus causal attention (compute time). Real kernels do not switch
sharply from one bound to the other, so the two are combined as a soft maximum
sqrt(mem^2 + compute^2). A fixed per-step overhead is added for the eager-mode engine.

Sources and constants
The model shapes, GPUs, efficiencies and dispatch figure live in :mod:`core.hardware` (the
predictors' GPU cost uses the same ones); the sources below are theirs.
- Model shapes: Hugging Face config.json of Qwen/Qwen3-8B (36 layers, hidden 4096, MLP 12288,
  32 query / 8 KV heads of 128, vocab 151,936, untied embeddings) and meta-llama/Meta-Llama-3-8B
  (32 layers, MLP 14336, vocab 128,256). Weights are bf16 (2 bytes).
- GPUs: vendor datasheets. A100-80GB SXM 2.039 TB/s, 312 TFLOP/s bf16 dense; H100 SXM 3.35 TB/s,
  989 TFLOP/s; H200 4.8 TB/s, 989 TFLOP/s.
- Efficiencies (HBM 0.70, tensor cores 0.64) and the soft-max exponent 2 are fitted to Vidur's
  A100 profile of Llama-3-8B (sum of the medians of all non-attention operators over 32 layers:
  9.7, 11.2, 19.5, 75, 273 ms at 1, 64, 256, 1,024, 4,096 tokens; see
  ../shared/reference/methods.md section 7). The fit reproduces all five points within 5%; the
  test ``test_roofline_matches_vidur_anchor`` holds it to 10%.
- Eager-mode overhead (the paper ran eager vLLM 0.8.5, no CUDA graphs): each decoder layer issues
  about a dozen kernels (norms, QKV, RoPE, attention, O, residual, gate/up, SiLU, down), each
  costing ~8 us of Python/PyTorch dispatch when not captured in a graph: ~0.1 ms per layer. The
  scheduler, input preparation and sampler add ~1.5 ms per step in vLLM's V1 Python loop. These
  two figures are estimates (no GPU was available to measure them); they give Qwen3-8B on an H100
  about 5.1 ms of overhead on a ~6.3 ms memory floor, i.e. ~11 ms per small decode step.
"""

from __future__ import annotations

import math

from core.hardware import BF16_BYTES, EAGER_S_PER_LAYER, FLOP_EFFICIENCY, GPU, HBM_EFFICIENCY, Hardware, ModelShape
from simulator.profiles.base import EngineProfile

SOFTMAX_EXPONENT = 2.0
ENGINE_S_PER_STEP = 1.5e-3


class RooflineProfile(EngineProfile):
    name = "roofline"

    def __init__(self, model: ModelShape, gpu: GPU, *, eager: bool = True, name: str | None = None,
                 hbm_efficiency: float = HBM_EFFICIENCY, flop_efficiency: float = FLOP_EFFICIENCY):
        self.model, self.gpu, self.eager = model, gpu, eager
        if name:
            self.name = name
        self._bw = gpu.hbm_bytes_per_s * hbm_efficiency
        self._flops = gpu.bf16_flop_per_s * flop_efficiency
        self._weight_bytes = (model.body_params + model.head_params) * BF16_BYTES
        self._body_flop_per_token = 2.0 * model.body_params
        self._head_flop = 2.0 * model.head_params
        # causal prefill attention: QK^T and PV over half the L x L square, per layer
        self._prefill_attn_flop_per_sq = 2.0 * model.attention_width * model.layers
        self._decode_attn_flop_per_ctx = 4.0 * model.attention_width * model.layers
        self._kv_bytes = model.kv_bytes_per_token
        self.overhead_s = ENGINE_S_PER_STEP + (EAGER_S_PER_LAYER * model.layers if eager else 0.0)

    @property
    def hardware(self) -> Hardware:
        return Hardware(self.model, self.gpu)

    def linear_time(self, tokens: int) -> float:
        """Non-attention time of a step of ``tokens`` tokens (what Vidur's anchor measures)."""
        mem = self.model.body_params * BF16_BYTES / self._bw
        comp = self._body_flop_per_token * tokens / self._flops
        return math.hypot(mem, comp)

    def compiled_coefficients(self):
        """Byte counts (integers) and rates in the order ``step_time`` combines them."""
        if not (isinstance(self._weight_bytes, int) and isinstance(self._kv_bytes, int)):
            return None
        return "roofline", (self._weight_bytes, self._kv_bytes), (
            self._bw, self._body_flop_per_token, self._head_flop, self._prefill_attn_flop_per_sq,
            self._decode_attn_flop_per_ctx, self._flops, self.overhead_s)

    def step_time(self, prefill_tokens, prefill_sq, decode_batch, decode_context) -> float:
        tokens = prefill_tokens + decode_batch
        mem = (self._weight_bytes + self._kv_bytes * decode_context) / self._bw
        comp = (self._body_flop_per_token * tokens + self._head_flop * decode_batch
                + self._prefill_attn_flop_per_sq * prefill_sq
                + self._decode_attn_flop_per_ctx * decode_context) / self._flops
        return self.overhead_s + math.hypot(mem, comp)

    def describe(self) -> dict:
        return {"name": self.name, "model": self.model.name, "gpu": self.gpu.name, "eager": self.eager,
                "hbm_efficiency": HBM_EFFICIENCY, "flop_efficiency": FLOP_EFFICIENCY,
                "overhead_s": self.overhead_s}
