"""GPU cost of the baseline predictors on the serving GPU, from FLOPs and bytes.

Same constants as the default engine (:mod:`core.hardware`, which the roofline profile uses): an H100 SXM (3.35 TB/s
HBM, 989 TFLOP/s bf16 dense) at the fitted efficiencies (HBM 0.70 -> 2.345 TB/s, tensor cores
0.64 -> 633 TFLOP/s), bf16 weights, and the engine's eager-mode dispatch figure of 0.1 ms per
transformer layer (about a dozen kernels of ~8.3 us each).

A text encoder scoring a batch of prompts in one call costs (see :func:`encoder_cost`):
- per call: dispatch (layers x 0.1 ms, plus 8.3 us per kernel of the head) + one read of the
  non-embedding weights (the embedding table is gathered row by row, not streamed);
- per prompt token: 2 x non-embedding parameters FLOP (attention's quadratic term is left out:
  under 12% of the linear FLOPs for prompts up to 512 tokens on a 768-wide encoder).
Weight streaming and compute are added, not overlapped (an upper bound, within a factor sqrt(2) of
the engine's soft maximum). Tokenisation runs on the CPU, off the GPU's critical path, and is not
charged. Prompts are charged in full (no 512-token truncation, which the linear cost form cannot
express; it over-charges only prompts above 512 tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

from core.hardware import (
    BF16_BYTES,
    EAGER_S_PER_LAYER,
    FLOP_EFFICIENCY,
    GPU,
    H100,
    HBM_EFFICIENCY,
    QWEN3_8B,
    ModelShape,
)
from predictors.base import PredictorCost

KERNEL_S = EAGER_S_PER_LAYER / 12.0   # ~8.3 us: one eager kernel dispatch


def bandwidth(gpu: GPU = H100) -> float:
    return gpu.hbm_bytes_per_s * HBM_EFFICIENCY


def flops(gpu: GPU = H100) -> float:
    return gpu.bf16_flop_per_s * FLOP_EFFICIENCY


@dataclass(frozen=True)
class Encoder:
    """A transformer text encoder of the paper (sizes from the models' Hugging Face configs)."""

    name: str
    layers: int
    params: int             # total parameters
    embedding_params: int   # token (+ position) embedding tables: gathered, not streamed
    head_params: int = 0    # the method's head on top (MLPs, score/classifier layers)
    head_kernels: int = 0   # eager kernels of that head

    @property
    def body_params(self) -> int:
        return self.params - self.embedding_params


# vocab x hidden (+ positions x hidden) for the embedding tables
DEBERTA_V3_BASE = Encoder("DeBERTa-v3-base", layers=12, params=184_000_000, embedding_params=128_100 * 768,
                          # TIE: two heads 2304-256-256-128-1 (mu, sigma) on [CLS]+mean+max pooling
                          head_params=2 * (2304 * 256 + 256 + 256 * 256 + 256 + 256 * 128 + 128 + 129 + 4 * 256),
                          head_kernels=2 * 10 + 3)
BERT_BASE = Encoder("bert-base-uncased", layers=12, params=110_000_000, embedding_params=(30_522 + 512 + 2) * 768,
                    head_params=768 * 128 + 128 + 128 * 128 + 128 + 128 * 5 + 5, head_kernels=5 + 1)
OPT_125M = Encoder("opt-125m", layers=12, params=125_000_000, embedding_params=(50_272 + 2_050) * 768,
                   head_params=768, head_kernels=1)
DISTILBERT_BASE = Encoder("distilbert-base-uncased", layers=6, params=66_000_000,
                          embedding_params=(30_522 + 512) * 768,
                          head_params=768 * 768 + 768 + 768 * 10 + 10, head_kernels=4)


def encoder_cost(enc: Encoder, gpu: GPU = H100) -> PredictorCost:
    """Cost of scoring prompts with ``enc`` (one batched call per engine step's arrivals)."""
    per_call = (enc.layers * EAGER_S_PER_LAYER + enc.head_kernels * KERNEL_S
                + (enc.body_params + enc.head_params) * BF16_BYTES / bandwidth(gpu))
    per_token = 2.0 * enc.body_params / flops(gpu)
    per_request = 2.0 * enc.head_params / flops(gpu)
    return PredictorCost(gpu_s_per_call=per_call, gpu_s_per_request=per_request, gpu_s_per_prompt_token=per_token)


def mlp_call_s(params: int, kernels: int, requests: int = 1, gpu: GPU = H100) -> float:
    """One eager call of a small MLP on ``requests`` inputs: dispatch + weight read + FLOPs."""
    return kernels * KERNEL_S + params * BF16_BYTES / bandwidth(gpu) + 2.0 * params * requests / flops(gpu)


TRAIL_PROBE_PARAMS = 4096 * 512 + 512 + 512 * 10 + 10      # 2,102,794 (the paper's 4096-512-10 MLP)
TRAIL_PROBE_KERNELS = 4                                     # linear, relu, linear, softmax


def trail_refresh_s(gpu: GPU = H100) -> float:
    """One refresh of one request by TRAIL's probe, charged as its own call (an upper bound: the
    paper batches the probe over the running batch inside the forward pass)."""
    return mlp_call_s(TRAIL_PROBE_PARAMS, TRAIL_PROBE_KERNELS, 1, gpu) + 2 * KERNEL_S  # + Bayes update


def egtp_cost(model: ModelShape = QWEN3_8B, gpu: GPU = H100) -> PredictorCost:
    """EGTP: next-token entropy at every prompt position needs the full-vocabulary logits there.

    Per prompt token: the LM-head matmul (2 x vocab x hidden FLOP) and the fp32 logits written once
    and read twice (log-softmax, then the entropy sum): 3 x 4 x vocab bytes. The LM-head weights are
    not charged again: prefill already streams them for the last token's logits, and the same matmul
    extended to all positions reuses that read. Per call: the entropy/softmax/pooling kernels and the
    d-d/2-20 head (LayerNorm, ReLU) on the pooled state, its weights read once.
    """
    d = model.hidden
    head_params = d * (d // 2) + d // 2 + 2 * (d // 2) + (d // 2) * 20 + 20
    per_token = (2.0 * model.vocab * model.hidden / flops(gpu)
                 + 3 * 4 * model.vocab / bandwidth(gpu))
    per_call = 6 * KERNEL_S + mlp_call_s(head_params, 5, 0, gpu)
    per_request = 2.0 * head_params / flops(gpu)
    return PredictorCost(gpu_s_per_call=per_call, gpu_s_per_request=per_request, gpu_s_per_prompt_token=per_token)


def describe_cost(cost: PredictorCost) -> dict:
    return {k: float(v) for k, v in cost.__dict__.items()}
