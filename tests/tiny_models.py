"""Tiny random causal LMs for scoring tests: real architectures, seconds to build and run."""

from __future__ import annotations

from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM


def _dims(vocab: int, hidden: int, layers: int, heads: int, kv_heads: int, max_positions: int) -> dict:
    return {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "intermediate_size": 2 * hidden,
        "max_position_embeddings": max_positions,
    }


def qwen_config(vocab: int, max_positions: int = 512, attn: str | None = None, **extra: Any) -> Qwen2Config:
    """2 layers, grouped-query attention (4 heads, 2 key/value heads); ``attn`` None: the default."""
    if attn is not None:
        extra["attn_implementation"] = attn
    return Qwen2Config(**_dims(vocab, 32, 2, 4, 2, max_positions), **extra)


def llama_config(vocab: int, max_positions: int = 512) -> LlamaConfig:
    """3 layers, 6 heads, 3 key/value heads, sdpa attention."""
    return LlamaConfig(**_dims(vocab, 48, 3, 6, 3, max_positions), attn_implementation="sdpa")


def tiny_qwen(vocab: int, seed: int, attn: str | None = None, max_positions: int = 512) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(qwen_config(vocab, max_positions, attn)).eval()


def tiny_llama(vocab: int, seed: int, max_positions: int = 512) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(llama_config(vocab, max_positions)).eval()


def tiny_qwen3_next(vocab: int, seed: int) -> torch.nn.Module:
    """Qwen3-Next layout: linear-attention (gated delta rule) layers between full-attention layers,
    a mixture of experts; its cache holds a recurrent state, not keys per position, in half the layers."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    config = AutoConfig.for_model(
        "qwen3_next",
        **_dims(vocab, 32, 4, 4, 2, 512),
        head_dim=8,
        linear_num_value_heads=2,
        linear_num_key_heads=2,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        num_experts=2,
        num_experts_per_tok=1,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=16,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
    )
    return AutoModelForCausalLM.from_config(config).eval()


def tiny_nemotron_h(vocab: int, seed: int) -> torch.nn.Module:
    """NemotronH layout: Mamba-2 (state-space) layers between attention layers ("M*M*")."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    config = AutoConfig.for_model(
        "nemotron_h",
        **_dims(vocab, 32, 4, 4, 2, 512),
        head_dim=8,
        mamba_num_heads=4,
        mamba_head_dim=8,
        ssm_state_size=8,
        n_groups=1,
        hybrid_override_pattern="M*M*",
    )
    return AutoModelForCausalLM.from_config(config).eval()


class CharTokens:
    """A tokenizer over single characters: enough for the credit assigner's text lookups."""

    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789 \n{}"
    eos_token_id = len(alphabet)
    pad_token_id = len(alphabet)

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [self.alphabet.index(c) for c in text]}

    def batch_decode(self, seqs, **_):
        return ["".join(self.alphabet[t] if t < len(self.alphabet) else "" for t in s) for s in seqs]


# The ``model`` settings of a tiny scratch model for the studies' tests (config keys, not HF names).
TINY_SETTINGS = {
    "hidden_size": 32,
    "num_layers": 2,
    "num_heads": 2,
    "num_kv_heads": 1,
    "intermediate_size": 64,
    "max_position_embeddings": 256,
}
