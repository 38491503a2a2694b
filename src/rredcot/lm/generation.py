"""Prompt building and generation: one interface, two backends (transformers and vLLM).

A :class:`Generator` does two things. ``generate`` samples ``n`` completions of each text prompt
(evaluation, the training probe). ``sample`` continues token-id prefixes, one row per (prefix, seed),
each sample with its own random stream (the studies continue traces from exit points: decoding a
prefix and encoding it again could tokenize the cut differently, and per-row seeds make a rollout
independent of which other rows share its batch, so a study can be rerun in parts).

``HFGenerator`` runs transformers' ``generate`` on a model in memory (CPU or GPU). Every row, each
of a prompt's ``n`` samples included, gets its own random stream: greedy search with a logits
processor that adds Gumbel noise from the row's own generator (the argmax of ``logits / T +
Gumbel`` is a sample of ``softmax(logits / T)``, top-p filtering first). ``VLLMGenerator`` loads a
saved model into vLLM (on a GPU, or on a CPU with vLLM's CPU build: :mod:`rredcot.lm.vllm_engine`),
which is what makes sampling long reasoning traces affordable; each row is a request with the seed
of the row's stream. The two backends draw different noise from the same seed, so their samples
differ while their distributions agree; greedy decoding (a temperature of 0, everywhere) gives the
same tokens up to ties of the float arithmetic. vLLM is imported only when that backend is chosen.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import LogitsProcessor, LogitsProcessorList

from rredcot.lm.vllm_engine import prepare_engine, start_engine

BACKENDS = ("hf", "vllm")


# ------------------------------------------------------------------------------------------ prompts
# ------------------------------------------------------------------------------------------ backends
@dataclass(frozen=True)
class Completion:
    """One generated continuation of a prompt or prefix."""

    token_ids: list[int]  # generated tokens, the stop token included when one was produced
    text: str  # decoded text, special tokens dropped
    truncated: bool  # stopped by max_new_tokens, not by a stop token

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)


def sample_seed(*parts: object) -> int:
    """A 63-bit seed derived from any ids (stable across runs and machines, unlike ``hash``)."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


class GumbelSampling(LogitsProcessor):
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


class Generator(ABC):
    """A generation backend; results come back in the order of the inputs. ``generate`` is written
    in terms of ``sample``: every (prompt, sample) row is a prefix with a seed of its own. A backend
    sets ``tokenizer`` and implements ``sample``."""

    tokenizer: Any

    def generate(
        self,
        prompts: Sequence[str],
        *,
        n: int = 1,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        seed: int,
    ) -> list[list[Completion]]:
        """``n`` completions of each text prompt, each from its own random stream derived from
        ``seed``, the prompt's index and the sample's index."""
        # Token ids from our tokenizer, not text: vLLM would add special tokens (e.g. a second BOS)
        # to a prompt whose chat template already contains them.
        encoded = self.tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
        # One random stream per (prompt, sample), in both backends: a sample does not depend on which
        # other rows share its batch, and two models evaluated with the same seed draw the same noise
        # for the same row, so the difference of their accuracies is measured with common random
        # numbers (where the models agree, their samples agree; docs/testbed.md, "Paired
        # methods"). No global random state is read or changed, so a probe during training leaves the
        # trainer's sampling as it was.
        flat = [(i, j) for i in range(len(prompts)) for j in range(n)]
        out = self.sample(
            [encoded[i] for i, _ in flat],
            [sample_seed(seed, i, j) for i, j in flat],
            temperature=temperature,
            top_p=top_p,
            max_new_tokens=max_new_tokens,
        )
        return [out[i * n : (i + 1) * n] for i in range(len(prompts))]

    @abstractmethod
    def sample(
        self,
        prefixes: Sequence[Sequence[int]],
        seeds: Sequence[int],
        *,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
    ) -> list[Completion]:
        """One continuation per (token-id prefix, seed) row, each with its own random stream."""


class HFGenerator(Generator):
    """transformers ``generate`` in left-padded batches on whatever device the model is on."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, batch_size: int, progress: bool = False):
        self.model, self.tokenizer = model, tokenizer
        self.batch_size, self.progress = batch_size, progress
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.stop_ids = stop_ids(model, tokenizer)

    @torch.inference_mode()
    def sample(
        self,
        prefixes: Sequence[Sequence[int]],
        seeds: Sequence[int],
        *,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
    ) -> list[Completion]:
        if len(prefixes) != len(seeds):
            raise ValueError(f"{len(prefixes)} prefixes but {len(seeds)} seeds")
        # Longest prefixes first: similar lengths share a batch, and memory trouble shows up early.
        order = sorted(range(len(prefixes)), key=lambda i: -len(prefixes[i]))
        out: list[Completion | None] = [None] * len(prefixes)
        was_training = self.model.training
        self.model.eval()
        try:
            with tqdm(total=len(order), desc="sample", unit="row", disable=not self.progress) as bar:
                for start in range(0, len(order), self.batch_size):
                    chunk = order[start : start + self.batch_size]
                    rows = self._sample_batch(
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

    def _sample_batch(
        self,
        prefixes: list[Sequence[int]],
        seeds: list[int],
        temperature: float,
        top_p: float,
        max_new_tokens: int,
    ) -> list[Completion]:
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
            processors.append(GumbelSampling(seeds, temperature, top_p, device))
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
            rollouts.append(Completion(kept, text, end is None))
        return rollouts


def stop_ids(model: torch.nn.Module, tokenizer: Any) -> list[int]:
    """End-of-sequence ids: the tokenizer's plus the model's (chat models often list several)."""
    model_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids: set[int] = set()
    for value in (tokenizer.eos_token_id, model_eos):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list | tuple):
            ids.update(int(v) for v in value)
    return sorted(ids)


@dataclass(frozen=True)
class VLLMOptions:
    """Engine settings of the vLLM backend: the config's ``eval.vllm`` section, whose defaults and
    docs (``rredcot.settings.config.EvalVllm``) are theirs, and on a machine without CUDA the KV
    cache's size (``vllm_cpu.kv_cache_gib``)."""

    dtype: str  # weight/activation dtype ("auto": vLLM's choice, bfloat16 for a float32 checkpoint)
    gpu_memory_utilization: float  # share of GPU memory for weights and KV cache
    tensor_parallel_size: int  # GPUs one model is split over
    max_model_len: int | None  # prompt + completion tokens (None: the model's own limit)
    kv_cache_gib: int  # host memory of the KV cache on a CPU (rredcot.lm.vllm_engine)

    @classmethod
    def from_config(cls, section: Mapping[str, Any], cpu: Mapping[str, Any], model_dtype: str) -> VLLMOptions:
        """From the config's ``eval.vllm`` and ``vllm_cpu`` sections; a null dtype is ``model_dtype``
        (``model.dtype``, the transformers backend's)."""
        return cls(**{**section, "dtype": section["dtype"] or model_dtype}, kv_cache_gib=cpu["kv_cache_gib"])


def load_vllm(model_path: str | Path, options: VLLMOptions, where: str = "vLLM", **extra: Any) -> Any:
    """A ``vllm.LLM`` for a saved model with the configured options (``extra``: more LLM arguments),
    after the checks and the CPU set-up of :func:`rredcot.lm.vllm_engine.prepare_engine`."""
    prepare_engine(options.kv_cache_gib, model_path, where)
    opts = options
    return start_engine(
        model_path,
        dtype=opts.dtype,
        gpu_memory_utilization=opts.gpu_memory_utilization,
        tensor_parallel_size=opts.tensor_parallel_size,
        max_model_len=opts.max_model_len,
        **extra,
    )


class VLLMGenerator(Generator):
    """vLLM offline inference: an engine started on a saved model directory, or one that is already
    running (``llm=``, e.g. a training run's colocated engine, whose weights the caller keeps
    current). Every request carries its own seed, so a sample does not depend on which other
    requests share its batch."""

    def __init__(
        self,
        model_path: str | Path | None,
        tokenizer: Any,
        options: VLLMOptions | None = None,
        progress: bool = False,
        llm: Any = None,
    ):
        if llm is None:
            if model_path is None or options is None:
                raise ValueError("VLLMGenerator needs a model path and options, or a running engine (llm=)")
            # Samples of one exit point (or prompt) share their whole prefix: let vLLM cache it.
            llm = load_vllm(model_path, options, "vLLM generation", enable_prefix_caching=True)
        import vllm  # after load_vllm: it checks that vLLM is there and sets its environment first

        self.vllm, self.tokenizer, self.progress, self.llm = vllm, tokenizer, progress, llm

    def sample(
        self,
        prefixes: Sequence[Sequence[int]],
        seeds: Sequence[int],
        *,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
    ) -> list[Completion]:
        if len(prefixes) != len(seeds):
            raise ValueError(f"{len(prefixes)} prefixes but {len(seeds)} seeds")
        inputs = [{"prompt_token_ids": list(p)} for p in prefixes]
        greedy = temperature <= 0
        params = [
            self.vllm.SamplingParams(
                n=1,
                temperature=0.0 if greedy else temperature,
                top_p=1.0 if greedy else top_p,
                max_tokens=max_new_tokens,
                seed=None if greedy else s,
                skip_special_tokens=True,
            )
            for s in seeds
        ]
        outputs = self.llm.generate(inputs, params, use_tqdm=self.progress)
        return [
            Completion(list(o.token_ids), o.text, o.finish_reason == "length")
            for o in (out.outputs[0] for out in outputs)
        ]


def make_generator(
    backend: str,
    model_path: str | Path,
    tokenizer: Any,
    *,
    dtype: str,
    batch_size: int,
    options: VLLMOptions,
    progress: bool = True,
) -> Generator:
    """``hf`` (the saved model loaded in ``dtype``, on the GPU when there is one) or ``vllm`` (with
    ``options``)."""
    if backend == "vllm":
        return VLLMGenerator(model_path, tokenizer, options, progress)
    if backend != "hf":
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    from rredcot.lm.modeling import load_model

    model = load_model(model_path, dtype)
    if torch.cuda.is_available():
        model = model.to("cuda")
    return HFGenerator(model, tokenizer, batch_size=batch_size, progress=progress)


def device_name() -> str:
    """The device that runs a study, for captions and logs."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    n = torch.get_num_threads()
    return f"CPU ({n} thread{'' if n == 1 else 's'})"
