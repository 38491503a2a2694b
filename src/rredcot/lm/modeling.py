"""Tokenizers and models: a locally trained tokenizer and small Qwen2 model, or a pretrained checkpoint.

The embedded default cannot download anything, so it trains a byte-level BPE tokenizer on its own
corpus and builds a small transformer of a real architecture (Qwen2: RoPE, GQA, SwiGLU, RMSNorm). The
same training code then runs unchanged on pretrained checkpoints selected by the config.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

PAD_TOKEN = "<|pad|>"
EOS_TOKEN = "<|endoftext|>"


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer (lossless round trip of any text) on ``texts``."""
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD_TOKEN, EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN)


def sft_attention(model_spec: Mapping[str, Any], chosen: str | None) -> str | None:
    """The attention kernel SFT trains with: ``chosen`` (``sft.attn_implementation``), else eager
    for a scratch model (the kernel in which the default's SFT ran faster on a CPU) and transformers'
    own choice for a pretrained one (long sequences: eager would hold every attention matrix)."""
    return chosen or ("eager" if model_spec["kind"] == "scratch" else None)


def build_scratch_model(
    tokenizer: PreTrainedTokenizerFast, spec: Mapping[str, Any], seed: int, attn_implementation: str = "sdpa"
) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2 causal LM sized by the config's ``model`` section. The attention
    kernel is not saved with the model: a later load gets transformers' choice."""
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec["hidden_size"],
        num_hidden_layers=spec["num_layers"],
        num_attention_heads=spec["num_heads"],
        num_key_value_heads=spec["num_kv_heads"],
        intermediate_size=spec["intermediate_size"],
        max_position_embeddings=spec["max_position_embeddings"],
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        attn_implementation=attn_implementation,
    )
    return Qwen2ForCausalLM(config)


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """Load a tokenizer saved by this package or a hub checkpoint.

    ``PreTrainedTokenizerFast`` is used directly because ``AutoTokenizer`` may substitute a different
    tokenizer class for a locally trained one. Left padding suits batched generation.
    """
    tok = PreTrainedTokenizerFast.from_pretrained(str(path))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_model(path: str | Path, dtype: str, attn_implementation: str | None = None) -> torch.nn.Module:
    """Load a causal LM with its weights in ``dtype`` (``model.dtype`` for inference; training loads
    float32 master weights and computes under autocast). ``attn_implementation``: transformers' own
    choice when None."""
    extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype), **extra)


def set_threads(n: int) -> None:
    """Pin torch's intra-op threads so parallel workflow jobs do not oversubscribe the cores."""
    torch.set_num_threads(max(1, n))


def qwen2_shape(hidden: int, layers: int, heads: int) -> dict[str, Any]:
    """A Qwen2 shape for :func:`random_model` from three sizes: half as many KV heads as heads, an
    MLP three times as wide as the hidden size (the model of ``rredcot bench`` and ``bench-memory``)."""
    return dict(
        model_type="qwen2",
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        intermediate_size=hidden * 3,
    )


def random_model(
    shape: Mapping[str, Any],
    vocab: int,
    max_positions: int,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Any:
    """A randomly initialised causal LM of ``shape`` (its ``model_type`` and the sizes of its config,
    e.g. :func:`qwen2_shape`), seeded with 0, built on ``device`` in ``dtype``, with sdpa attention,
    in eval mode: cost and memory do not depend on the weights."""
    spec = dict(shape)
    config = AutoConfig.for_model(
        spec.pop("model_type"), vocab_size=vocab, max_position_embeddings=max_positions, **spec
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()
