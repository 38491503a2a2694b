"""Forward passes that read vocabulary logits only where a log-probability is read.

Every model call of the credit passes goes through :func:`decoder_states`: the decoder alone
(``model.get_decoder()``), which returns hidden states and, when asked, the KV cache. Logits are then
computed from selected hidden states only, in chunks of at most ``max_logit_elements`` (positions x
vocabulary), in float32 with autocast off: a bf16 head rounds logits of size 20 to steps of 0.125,
which would leak into every log-probability and entropy. No pass ever holds [batch, length, vocab]
logits, so a 151,936-token vocabulary costs the same memory per chunk as a 300-token one.

One call site for the decoder also gives distributed training one place to hook in: under FSDP the
decoder's layers gather their shards in each forward, so every process must make the same number of
decoder calls (``rredcot.adapter.distributed.Lockstep`` wraps ``get_decoder`` to pad them).

Pure torch; the model is any HF causal LM that exposes ``get_decoder()``, ``get_output_embeddings()``
and ``config``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from rredcot.method.credit import token_entropies


def model_device(model: torch.nn.Module) -> torch.device:
    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    return next(model.parameters()).device


def vocab_size(model: torch.nn.Module) -> int:
    """Rows of the LM head, from the config (under ZeRO-3 a sharded weight's shape reads 0)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return int(config.vocab_size)


def decoder_states(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    position_ids: Tensor | None = None,
    past_key_values: Any = None,
    use_cache: bool = False,
) -> tuple[Tensor, Any]:
    """Last hidden states [B, T, d] and the cache (None unless ``use_cache``) of one decoder call."""
    out = model.get_decoder()(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        past_key_values=past_key_values,
        use_cache=use_cache,
    )
    return out.last_hidden_state, (out.past_key_values if use_cache else None)


def head_logits(model: torch.nn.Module, hidden: Tensor) -> Tensor:
    """Float32 vocabulary logits of hidden states [n, d], as the model's own head computes them."""
    head = model.get_output_embeddings()
    with torch.autocast(hidden.device.type, enabled=False):
        bias = None if getattr(head, "bias", None) is None else head.bias.float()
        logits = F.linear(hidden.float(), head.weight.float(), bias)
    cap = getattr(model.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def logit_rows(model: torch.nn.Module, max_logit_elements: int) -> int:
    """Positions whose logits fit in ``max_logit_elements`` at once (at least one)."""
    return max(1, max_logit_elements // vocab_size(model))


def token_log_probs(
    model: torch.nn.Module, hidden: Tensor, targets: Tensor, max_logit_elements: int
) -> Tensor:
    """log p(targets[i] | hidden[i]) for hidden [n, d] and targets [n] (float32, on hidden's device)."""
    step = logit_rows(model, max_logit_elements)
    out = []
    for a in range(0, hidden.shape[0], step):
        log_p = torch.log_softmax(head_logits(model, hidden[a : a + step]), dim=-1)
        out.append(log_p.gather(-1, targets[a : a + step, None]).squeeze(-1))
    return torch.cat(out) if out else hidden.new_zeros(0, dtype=torch.float32)


def entropies_and_argmax(
    model: torch.nn.Module, hidden: Tensor, max_logit_elements: int
) -> tuple[Tensor, Tensor]:
    """Predictive entropy in bits and the most likely token for hidden states [n, d] (CPU tensors)."""
    step = logit_rows(model, max_logit_elements)
    bits, best = [], []
    for a in range(0, hidden.shape[0], step):
        logits = head_logits(model, hidden[a : a + step])
        bits.append(token_entropies(logits).cpu())
        best.append(logits.argmax(dim=-1).cpu())
    if not bits:
        return torch.zeros(0, dtype=torch.float32), torch.zeros(0, dtype=torch.long)
    return torch.cat(bits), torch.cat(best)


def next_token_log_probs(model: torch.nn.Module, hidden: Tensor, max_logit_elements: int) -> Tensor:
    """Float32 log-softmax over the vocabulary for hidden states [n, d] (one row per sequence)."""
    step = logit_rows(model, max_logit_elements)
    parts = [
        torch.log_softmax(head_logits(model, hidden[a : a + step]), dim=-1)
        for a in range(0, hidden.shape[0], step)
    ]
    return torch.cat(parts)


def has_plain_kv_cache(model: torch.nn.Module) -> bool:
    """True when every layer of the model's dynamic cache holds full keys and values.

    The single-pass scorer slices a trace's cache at each exit point and the greedy baseline masks
    cached tokens out; both need per-position keys and values in every layer. Sliding-window layers
    drop old positions, and linear-attention or state-space layers (Qwen3-Next, NemotronH, LFM2)
    keep one recurrent state that cannot be cut at an earlier position.
    """
    try:
        cache = DynamicCache(config=model.config)
    except Exception:  # a config the cache cannot read: do not guess
        return False
    return bool(cache.layers) and all(type(layer) is DynamicLayer for layer in cache.layers)


def compute_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype activations have in a forward pass here: autocast's, else the parameters'."""
    device = model_device(model)
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return next(model.parameters()).dtype
