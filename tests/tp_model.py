"""A copy of the bundled SmolLM2-135M whose heads split over tensor parallel 2 (tests/test_serve_tp.py).

SmolLM2-135M has 9 attention heads and 3 KV heads, which vLLM cannot split over two ranks. The copy
has 12 heads and 4 KV heads: the 3 extra query heads and the extra KV head are all zeros, and so
are the output projection's columns they feed, so every output is the original's (the zero heads
attend uniformly over zero values and add nothing). Query head h still reads KV head h // 3, and
rank r of TP 2 holds query heads 6r..6r+5 and KV heads 2r, 2r+1: the same grouping. Hidden size
and layer count are unchanged, so the bundled read-out fits it. Saved with ``save_pretrained``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

HEADS, KV_HEADS = 12, 4
#: The files besides the weights and config that a served model folder needs (tokenizer, project id).
KEEP = ("chat_template.jinja", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
        "generation_config.json", "leap_source.json")


def _pad_rows(w, rows: int):
    import torch

    return torch.cat([w, w.new_zeros(rows - w.shape[0], *w.shape[1:])], dim=0)


def padded_model(src: Path, dst: Path) -> Path:
    """Write the 12-head copy of the model at ``src`` into ``dst`` (a new folder); return ``dst``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(src)
    head_dim = config.hidden_size // config.num_attention_heads
    assert config.num_attention_heads * KV_HEADS == config.num_key_value_heads * HEADS, "grouping would change"
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    state = model.state_dict()
    for key in list(state):
        w = state[key]
        if key.endswith("self_attn.q_proj.weight"):
            state[key] = _pad_rows(w, HEADS * head_dim)
        elif key.endswith(("self_attn.k_proj.weight", "self_attn.v_proj.weight")):
            state[key] = _pad_rows(w, KV_HEADS * head_dim)
        elif key.endswith("self_attn.o_proj.weight"):
            state[key] = _pad_rows(w.t(), HEADS * head_dim).t().contiguous()
    config.num_attention_heads, config.num_key_value_heads, config.head_dim = HEADS, KV_HEADS, head_dim
    padded = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    padded.load_state_dict(state, strict=False)
    padded.tie_weights()
    padded.save_pretrained(dst)
    for name in KEEP:
        if (src / name).exists():
            shutil.copy(src / name, dst / name)
    return dst
