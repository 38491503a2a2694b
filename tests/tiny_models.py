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
