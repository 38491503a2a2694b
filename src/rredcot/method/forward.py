"""Forward passes that read vocabulary logits only where a log-probability is read.

Every model call of the credit passes goes through :func:`decoder_states`: the decoder alone
(``model.get_decoder()``), which returns hidden states and, when asked, the KV cache. Logits are then
computed from selected hidden states only, by a :class:`LogitHead` made once per pass, in chunks, so no
pass ever holds [batch, length, vocab] logits and a 151,936-token vocabulary costs the same memory per
chunk as a 300-token one.

Precision. The head's matrix product runs in the pass's compute dtype (the parameters' dtype, or
autocast's), so a bf16 pass on a GPU uses the tensor cores and never makes a float32 copy of the head;
its output, the logits, is float32 (``torch.mm(..., out_dtype=float32)``: bf16 products summed in
float32), and every log-softmax and entropy is taken in float32. A bf16 output would round logits of
size 20 to steps of 0.125 nats, which would leak into every log-probability. Where that kernel does
not exist (on a CPU) the same numbers come from a float32 product of the bf16-rounded operands (the
products of two bf16 numbers are exact in float32), so a CPU run shows what a GPU computes.

Chunks. A chunk holds at most ``ScoringBudget.max_logit_elements`` logits; when it is None the chunk
follows the device's free memory (``LOGIT_MEMORY_SHARE`` of it) on a GPU and is 2^25 elements on a CPU.

Host transfers. Results stay on the device; callers move them to the host once, with :func:`to_host`,
when a pass is done (the tests count these calls: a transfer inside a loop would stall a GPU once per
iteration).

One call site for the decoder also gives distributed training one place to hook in: under FSDP the
decoder's layers gather their shards in each forward, so every process must make the same number of
decoder calls (``rredcot.adapter.distributed.Lockstep`` wraps ``get_decoder`` to pad them).

Pure torch; the model is any HF causal LM that exposes ``get_decoder()``, ``get_output_embeddings()``
and ``config``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

# Logit elements of one chunk on a CPU, and the share of a GPU's free memory a chunk may take when
# ``max_logit_elements`` is None. A chunk holds its float32 logits and two temporaries of that size
# (probabilities and their entropy terms, or the log-sum-exp's working copy).
CPU_LOGIT_ELEMENTS = 1 << 25
LOGIT_MEMORY_SHARE = 0.25
LOGIT_BYTES_PER_ELEMENT = 12


def model_device(model: torch.nn.Module) -> torch.device:
    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    return next(model.parameters()).device


def vocab_size(model: torch.nn.Module) -> int:
    """Rows of the LM head, from the config (under ZeRO-3 a sharded weight's shape reads 0)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return int(config.vocab_size)


def pad_right(seqs: list[list[int]]) -> Tensor:
    """Token ids of sequences, right-padded with 0 to the longest (long, on the host).

    Right-padded rows need no attention mask under causal attention: every real token comes before
    its row's padding, so no real query ever reads a padded key. The passes therefore call the
    decoder without a mask, which leaves SDPA free to pick its fused causal kernels and spares the
    host the check transformers makes of a padding mask (a synchronisation on a GPU)."""
    ids = torch.zeros(len(seqs), max(len(s) for s in seqs), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.tensor(s, dtype=torch.long)
    return ids


def decoder_states(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    position_ids: Tensor | None = None,
    past_key_values: Any = None,
    use_cache: bool = False,
) -> tuple[Tensor, Any]:
    """Last hidden states [B, T, d] and the cache (None unless ``use_cache``) of one decoder call.
    A call with a 4D mask runs SDPA models' attention through :func:`grouped_sdpa`."""
    with _attention_for(model.config, attention_mask):
        out = model.get_decoder()(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=use_cache,
        )
    return out.last_hidden_state, (out.past_key_values if use_cache else None)


GROUPED_SDPA = "rredcot_grouped_sdpa"
"""The name :func:`grouped_sdpa` is registered under in transformers' ``AttentionInterface``."""


def grouped_sdpa(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """SDPA for grouped-query attention under an explicit mask, without copying keys and values.

    transformers' SDPA attention repeats each key/value head for every query head of its group
    (``repeat_kv``) whenever a mask is given, since PyTorch's fused kernels take no mask together
    with ``enable_gqa``: a copy of the layer's whole cache, six times the size of the cache itself
    for R1-Distill-1.5B, in every layer of every call. In a decoding step (a few queries per row
    over thousands of keys) that copy is most of the step's memory traffic. No library offers the
    alternative, so it is written here: the query heads of each group are stacked along the query
    axis, so that each key/value head is read in place by all of its queries, and the mask follows
    them (a view for a per-head mask, a copy of ``groups x queries x keys`` per row otherwise).
    Every query meets the same keys, values and mask entries as before: the same attention. Where
    that mask copy would be larger than the key/value copy (many queries: the suffix pass), or
    without a mask, transformers' own SDPA attention runs.

    Shapes as transformers passes them: ``query`` [B, H, Q, D], ``key``/``value`` [B, Hkv, S, D],
    ``attention_mask`` [B or 1, 1 or H, Q, S]; returns [B, Q, H, D]."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    b, h, q, d = query.shape
    kv_heads = key.shape[1]
    mask = attention_mask
    plain = groups == 1 or mask is None or mask.dim() != 4 or kwargs.get("position_bias") is not None
    if not plain and mask.shape[1] == 1:
        plain = mask.shape[0] * groups * q > 2 * b * h * d  # the mask's copy against the cache's
    if plain:
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    rows, width = mask.shape[0], mask.shape[-1]
    if mask.shape[1] == 1:  # the same mask for every head: repeated once per query head of a group
        mask = mask[:, :, None].expand(rows, 1, groups, q, width).reshape(rows, 1, groups * q, width)
    else:  # heads g*groups .. g*groups+groups-1 read key/value head g (repeat_kv's order)
        mask = mask.reshape(rows, kv_heads, groups * q, width)
    stacked = query.reshape(b, kv_heads, groups * q, d)
    out = F.scaled_dot_product_attention(
        stacked, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling
    )
    return out.reshape(b, h, q, d).transpose(1, 2).contiguous(), None


_GROUPED = [True]


@contextmanager
def grouped_attention(enabled: bool) -> Iterator[None]:
    """Within the block, decoder calls use :func:`grouped_sdpa` (``True``, the default outside any
    block) or transformers' own SDPA attention (``False``): to compare the two."""
    before = _GROUPED[0]
    _GROUPED[0] = enabled
    try:
        yield
    finally:
        _GROUPED[0] = before


@contextmanager
def _attention_for(config: Any, attention_mask: Tensor | None) -> Iterator[None]:
    """A decoder call with a 4D mask (prepared masks, which transformers passes through as they
    are) runs an SDPA model's attention through :func:`grouped_sdpa`; any other call, or another
    attention implementation, runs as configured."""
    sdpa = getattr(config, "_attn_implementation", None) == "sdpa"
    if not (_GROUPED[0] and sdpa and attention_mask is not None and attention_mask.dim() == 4):
        yield
        return
    from transformers import AttentionInterface

    AttentionInterface.register(GROUPED_SDPA, grouped_sdpa)  # a dict entry: the same on every call
    # The config's own entry only ({"": ...}): sub-configs (a vision tower's) keep theirs.
    config._attn_implementation = {"": GROUPED_SDPA}
    try:
        yield
    finally:
        config._attn_implementation = {"": "sdpa"}


def causal_states(model: torch.nn.Module, input_ids: Tensor) -> Tensor:
    """Last hidden states [B, T, d] of right-padded rows (``pad_right``): no mask.

    The call carries a cache it then drops: without one, transformers inspects the position ids for
    packed sequences, a wait on a GPU; the cache holds the pass's keys and values until it returns,
    no more than a trace pass under the same budget keeps."""
    from transformers import DynamicCache

    hidden, _ = decoder_states(
        model, input_ids, past_key_values=DynamicCache(config=model.config), use_cache=True
    )
    return hidden


def compute_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype activations have in a forward pass here: autocast's, else the parameters'."""
    device = model_device(model)
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return next(model.parameters()).dtype


@contextmanager
def low_precision_linears(model: torch.nn.Module) -> Iterator[int]:
    """Hold the decoder's linear weights in autocast's dtype for the block; yields how many it cast.

    Under autocast with float32 master weights every linear layer casts its weight to bf16 in each
    call, and the credit passes make many calls: the greedy answer baseline one per layer and decoded
    token. autocast's own cache of those casts does not help here: it is off under
    ``torch.inference_mode`` (every pass runs in it) and for frozen weights, and cleared when the
    outermost autocast exits. So the block casts each float32 weight and bias of the decoder's
    ``nn.Linear`` layers once, and restores the float32 tensors on exit. The results are bit for
    bit those of autocast, which would cast the same tensors to the same dtype in every call; the
    cost is one low-precision copy of those weights while the block runs. It does nothing unless
    autocast is on with a 16-bit dtype on the model's device; weights that are DTensors (FSDP2
    shards) and a weight tied to the output embeddings are left as they are.
    """
    device = model_device(model)
    dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None
    saved: list[tuple[torch.nn.Parameter, Tensor]] = []
    if dtype in (torch.bfloat16, torch.float16):
        head = model.get_output_embeddings()
        tied = getattr(head, "weight", None)
        for module in model.get_decoder().modules():
            if not isinstance(module, torch.nn.Linear):
                continue
            for param in (module.weight, module.bias):
                if param is None or param is tied or param.dtype != torch.float32:
                    continue
                if type(param.data).__name__ == "DTensor":
                    continue
                saved.append((param, param.data))
    try:
        with torch.no_grad():
            for param, data in saved:
                param.data = data.to(dtype)
        yield len(saved)
    finally:
        with torch.no_grad():
            for param, data in saved:
                param.data = data


def free_memory(device: torch.device) -> int | None:
    """Bytes a pass can still allocate on an accelerator: what the driver has free plus what torch's
    allocator holds unused; None on a CPU."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))


def to_host(*tensors: Tensor) -> list[Tensor]:
    """The given tensors on the host, after one synchronisation of the device.

    Every result of the credit passes reaches the host through here, once per pass, so the tests can
    count the transfers a pass makes (a transfer inside a loop would stall a GPU once per iteration)."""
    if all(t.device.type == "cpu" for t in tensors):
        return list(tensors)
    cuda = {t.device for t in tensors if t.device.type == "cuda"}
    # Asynchronous copies into pinned memory, then one wait (other devices copy synchronously).
    out = [t.to("cpu", non_blocking=t.device.type == "cuda") for t in tensors]
    for device in cuda:
        torch.cuda.synchronize(device)
    return out


_MM_OUT_DTYPE: dict[str, bool] = {}


def _has_mm_out_dtype(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ``torch.mm(a, b, out_dtype=float32)`` runs for ``dtype`` operands on this device."""
    key = f"{device.type}:{dtype}"
    if key not in _MM_OUT_DTYPE:
        try:
            a = torch.ones(2, 2, dtype=dtype, device=device)
            _MM_OUT_DTYPE[key] = torch.mm(a, a, out_dtype=torch.float32).dtype == torch.float32
        except (RuntimeError, TypeError, NotImplementedError):
            _MM_OUT_DTYPE[key] = False
    return _MM_OUT_DTYPE[key]


class LogitHead:
    """The model's LM head, set up once for a pass: float32 logits of hidden states, in chunks.

    ``max_logit_elements`` bounds one chunk (None: it follows free memory on a GPU; see the module
    docstring). The head's weight is cast to the compute dtype once here, not per chunk.
    """

    def __init__(self, model: torch.nn.Module, max_logit_elements: int | None = None) -> None:
        head = model.get_output_embeddings()
        self.device = model_device(model)
        self.dtype = compute_dtype(model)
        weight = head.weight
        bias = getattr(head, "bias", None)
        self.vocab = vocab_size(model)
        cap = getattr(model.config, "final_logit_softcapping", None)
        self.cap = float(cap) if cap else None
        low = self.dtype in (torch.bfloat16, torch.float16)
        # (how the product runs) float32: as it is; low precision: fp32 output from low-precision
        # operands, natively where the kernel exists, else through the rounded operands in float32.
        self.native = low and _has_mm_out_dtype(self.device, self.dtype)
        if not low:
            self.weight = weight.float()
        elif self.native:
            self.weight = weight.to(self.dtype)
        else:
            self.weight = weight.to(self.dtype).float()
        self.bias = None if bias is None else bias.to(self.dtype).float() if low else bias.float()
        self.rows = self._chunk_rows(max_logit_elements)

    def _chunk_rows(self, max_logit_elements: int | None) -> int:
        if max_logit_elements is None:
            free = free_memory(self.device)
            if free is None:
                max_logit_elements = CPU_LOGIT_ELEMENTS
            else:
                max_logit_elements = max(
                    CPU_LOGIT_ELEMENTS, int(LOGIT_MEMORY_SHARE * free / LOGIT_BYTES_PER_ELEMENT)
                )
        return max(1, max_logit_elements // self.vocab)

    def logits(self, hidden: Tensor) -> Tensor:
        """Float32 logits [n, V] of hidden states [n, d] (one chunk: callers split with ``chunks``)."""
        with torch.autocast(self.device.type, enabled=False):
            if self.native:
                out = torch.mm(hidden.to(self.dtype), self.weight.t(), out_dtype=torch.float32)
                if self.bias is not None:
                    out = out + self.bias
            elif self.weight.dtype == torch.float32 and self.dtype != torch.float32:
                out = F.linear(hidden.to(self.dtype).float(), self.weight, self.bias)
            else:
                out = F.linear(hidden.float(), self.weight, self.bias)
        if self.cap is not None:
            out = torch.tanh(out / self.cap) * self.cap
        return out

    def chunks(self, n: int) -> range:
        """Start indices of the chunks of ``n`` rows."""
        return range(0, n, self.rows)

    def token_log_probs(self, hidden: Tensor, targets: Tensor) -> Tensor:
        """log p(targets[i] | hidden[i]) for hidden [n, d] and targets [n] (float32, on the device)."""
        out = []
        for a in self.chunks(hidden.shape[0]):
            logits = self.logits(hidden[a : a + self.rows])
            picked = logits.gather(-1, targets[a : a + self.rows, None]).squeeze(-1)
            out.append(picked - torch.logsumexp(logits, dim=-1))
        return torch.cat(out) if out else hidden.new_zeros(0, dtype=torch.float32)

    def argmax_and_log_probs(self, hidden: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """The most likely token and log p(targets[i] | hidden[i]) (float32) of hidden states
        [n, d], on the device."""
        best, picked = [], []
        for a in self.chunks(hidden.shape[0]):
            logits = self.logits(hidden[a : a + self.rows])
            best.append(logits.argmax(dim=-1))
            target = logits.gather(-1, targets[a : a + self.rows, None]).squeeze(-1)
            picked.append(target - torch.logsumexp(logits, dim=-1))
        return torch.cat(best), torch.cat(picked)

    def entropies_and_argmax(self, hidden: Tensor) -> tuple[Tensor, Tensor]:
        """Predictive entropy in bits (float32) and the most likely token of hidden states [n, d],
        on the device."""
        bits, best = [], []
        for a in self.chunks(hidden.shape[0]):
            logits = self.logits(hidden[a : a + self.rows])
            # H = -Σ p log p, with 0 log 0 = 0 (special.entr), for logits of -inf too.
            p = torch.softmax(logits, dim=-1)
            bits.append((torch.special.entr(p).sum(dim=-1) / math.log(2.0)).clamp_min(0.0))
            best.append(logits.argmax(dim=-1))
        if not bits:
            return (
                torch.zeros(0, dtype=torch.float32, device=hidden.device),
                torch.zeros(0, dtype=torch.long, device=hidden.device),
            )
        return torch.cat(bits), torch.cat(best)


def has_plain_kv_cache(model: torch.nn.Module) -> bool:
    """True when every layer of the model's dynamic cache holds full keys and values.

    The single-pass scorer slices a trace's cache at each exit point and the greedy baseline masks
    cached tokens out; both need per-position keys and values in every layer. Sliding-window layers
    drop old positions, and linear-attention or state-space layers (Qwen3-Next, NemotronH, LFM2)
    keep one recurrent state that cannot be cut at an earlier position.
    """
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    try:
        cache = DynamicCache(config=model.config)
    except Exception:  # a config the cache cannot read: do not guess
        return False
    return bool(cache.layers) and all(type(layer) is DynamicLayer for layer in cache.layers)
