"""Continuations of token-id prefixes, each sample with its own random stream.

The studies continue a trace from a token index (an exit point), so prompts are token ids, not text:
decoding a prefix and encoding it again could tokenize the cut differently. Every sample carries its
own seed, so its tokens do not depend on which other samples share a batch or how batches are
formed: a study can be rerun in parts, or with another batch size, and give the same rollouts (on
transformers up to floating-point round-off between padded batch shapes).

``HFPrefixSampler`` gets per-row streams from transformers' greedy search: a logits processor adds
Gumbel noise from each row's own generator, and the argmax of ``logits / T + Gumbel`` is a sample of
``softmax(logits / T)`` (top-p filtering first). ``VLLMPrefixSampler`` passes the seed of every request
to vLLM. Both return :class:`Rollout`; temperature 0 is greedy decoding.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from tqdm.auto import tqdm
from transformers import LogitsProcessor, LogitsProcessorList

from rredcot.generation import VLLMOptions, _import_vllm, _stop_ids, load_vllm


def sample_seed(*parts: object) -> int:
    """A 63-bit seed derived from any ids (stable across runs and machines, unlike ``hash``)."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@dataclass(frozen=True)
class Rollout:
    """One sampled continuation."""

    token_ids: list[int]  # generated tokens, the stop token included when one was produced
    text: str  # decoded, special tokens dropped
    truncated: bool  # stopped by max_new_tokens, not by a stop token


class PrefixSampler(Protocol):
    """One continuation per (prefix, seed) row, in row order."""

    def sample(
        self,
        prefixes: Sequence[Sequence[int]],
        seeds: Sequence[int],
        *,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
    ) -> list[Rollout]: ...


class _GumbelSampling(LogitsProcessor):
    """Turns greedy search into sampling with one random stream per row (Gumbel-max trick)."""

    def __init__(self, seeds: Sequence[int], temperature: float, top_p: float, device: torch.device):
        self.temperature, self.top_p = temperature, top_p
        self.generators = [torch.Generator(device=device).manual_seed(s) for s in seeds]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        scores = scores.float() / self.temperature
        if self.top_p < 1.0:
            # Keep the smallest set of tokens whose probability reaches top_p (the first always stays).
            probs, order = scores.softmax(-1).sort(-1, descending=True)
            drop_sorted = probs.cumsum(-1) - probs >= self.top_p
            drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
            scores = scores.masked_fill(drop, float("-inf"))
        # One draw per row and step from the row's own stream; finished rows keep drawing, harmlessly.
        v = scores.shape[-1]
        u = torch.stack([torch.rand(v, generator=g, device=scores.device) for g in self.generators])
        return scores - torch.log(-torch.log(u.clamp_min(torch.finfo(u.dtype).tiny)))


class HFPrefixSampler:
    """transformers ``generate`` in left-padded batches of up to ``batch_size`` rows."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, batch_size: int = 64, progress: bool = True):
        self.model, self.tokenizer = model, tokenizer
        self.batch_size, self.progress = batch_size, progress
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.stop_ids = _stop_ids(model, tokenizer)

    @torch.inference_mode()
    def sample(
        self,
        prefixes: Sequence[Sequence[int]],
        seeds: Sequence[int],
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int = 128,
    ) -> list[Rollout]:
        if len(prefixes) != len(seeds):
            raise ValueError(f"{len(prefixes)} prefixes but {len(seeds)} seeds")
        # Longest prefixes first: similar lengths share a batch, and memory trouble shows up early.
        order = sorted(range(len(prefixes)), key=lambda i: -len(prefixes[i]))
        out: list[Rollout | None] = [None] * len(prefixes)
        was_training = self.model.training
        self.model.eval()
        try:
            with tqdm(total=len(order), desc="sample", unit="row", disable=not self.progress) as bar:
                for start in range(0, len(order), self.batch_size):
                    chunk = order[start : start + self.batch_size]
                    rows = self._batch(
                        [prefixes[i] for i in chunk],
                        [seeds[i] for i in chunk],
                        temperature,
                        top_p,
                        max_new_tokens,
                    )
                    for i, rollout in zip(chunk, rows, strict=True):
                        out[i] = rollout
                    bar.update(len(chunk))
        finally:
            self.model.train(was_training)
        return out  # type: ignore[return-value]

    def _batch(
        self,
        prefixes: list[Sequence[int]],
        seeds: list[int],
        temperature: float,
        top_p: float,
        max_new_tokens: int,
    ) -> list[Rollout]:
        device = self.model.device
        width = max(len(p) for p in prefixes)
        ids = torch.full((len(prefixes), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, p in enumerate(prefixes):
            if p:
                ids[row, width - len(p) :] = torch.tensor(list(p))
                mask[row, width - len(p) :] = 1
        processors = LogitsProcessorList()
        if temperature > 0:
            processors.append(_GumbelSampling(seeds, temperature, top_p, device))
        generated = self.model.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            temperature=None,
            top_p=None,
            top_k=None,
            logits_processor=processors,
            pad_token_id=self.pad_id,
            eos_token_id=self.stop_ids,
        )[:, width:].tolist()
        rollouts = []
        for row in generated:
            end = next((pos for pos, tok in enumerate(row) if tok in self.stop_ids), None)
            kept = row if end is None else row[: end + 1]
            text = self.tokenizer.decode(kept, skip_special_tokens=True)
            rollouts.append(Rollout(kept, text, end is None))
        return rollouts


class VLLMPrefixSampler:
    """vLLM offline inference on a saved model directory (GPU only), one seeded request per row."""

    def __init__(
        self,
        model_path: str | Path,
        tokenizer: Any,
        options: VLLMOptions | None = None,
        progress: bool = True,
    ):
        self.vllm, self.tokenizer, self.progress = _import_vllm(), tokenizer, progress
        # The M samples of an exit point share their whole prefix: let vLLM cache it.
        self.llm = load_vllm(model_path, options, enable_prefix_caching=True)

    def sample(
        self,
        prefixes: Sequence[Sequence[int]],
        seeds: Sequence[int],
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int = 128,
    ) -> list[Rollout]:
        from vllm.inputs import TokensPrompt

        inputs = [TokensPrompt(prompt_token_ids=list(p)) for p in prefixes]
        params = [
            self.vllm.SamplingParams(
                n=1,
                temperature=temperature,
                top_p=top_p if temperature > 0 else 1.0,
                max_tokens=max_new_tokens,
                seed=s,
                skip_special_tokens=True,
            )
            for s in seeds
        ]
        outputs = self.llm.generate(inputs, params, use_tqdm=self.progress)
        return [
            Rollout(list(o.token_ids), o.text, o.finish_reason == "length")
            for o in (out.outputs[0] for out in outputs)
        ]


def make_sampler(
    backend: str,
    model_path: str | Path,
    tokenizer: Any,
    *,
    dtype: str = "float32",
    batch_size: int = 64,
    options: VLLMOptions | None = None,
) -> PrefixSampler:
    """``hf`` (the model loaded in ``dtype`` on a GPU, float32 on a CPU) or ``vllm`` (with ``options``)."""
    if backend == "vllm":
        return VLLMPrefixSampler(model_path, tokenizer, options)
    if backend != "hf":
        raise ValueError(f"backend must be 'hf' or 'vllm', got {backend!r}")
    from rredcot.modeling import load_model

    model = load_model(model_path, dtype)
    if torch.cuda.is_available():
        model = model.to("cuda")
    return HFPrefixSampler(model, tokenizer, batch_size=batch_size)


def device_name() -> str:
    """The device that runs a study, for captions and logs."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"CPU ({torch.get_num_threads()} threads)"
