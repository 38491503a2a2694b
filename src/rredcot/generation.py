"""Prompt building and text generation for evaluation: one interface, two backends.

``HFGenerator`` runs transformers' ``generate`` on a model in memory (CPU or GPU); it also serves the
learning-curve probe during training. ``VLLMGenerator`` loads a saved model into vLLM, which is what
makes sampling long reasoning traces on real benchmarks affordable on GPUs. vLLM is imported only when
that backend is chosen, so the CPU install does not need it.

A temperature of 0 means greedy decoding for both backends.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from tqdm.auto import tqdm

from rredcot.data import format_prompt

BACKENDS = ("hf", "vllm")


# ------------------------------------------------------------------------------------------ prompts
def build_prompt(prompt_cfg: Mapping[str, Any] | str, problem: str, tokenizer: Any = None) -> str:
    """The generation prompt for one problem, following the config's ``prompt`` section.

    ``style: template`` fills ``template`` directly (the synthetic task's raw format). ``style: chat``
    makes the filled ``template`` the user message (after an optional ``system_prompt``) and renders it
    with the tokenizer's chat template, so real chat models see the format they were trained on. In
    both styles ``think_start`` is appended unless the prompt already ends with it: some chat
    templates open the thinking block themselves, others leave it to the model. A bare string is
    taken as a ``template``-style template.
    """
    if isinstance(prompt_cfg, str):
        return format_prompt(prompt_cfg, problem)
    user = format_prompt(prompt_cfg["template"], problem)
    if prompt_cfg.get("style", "template") == "chat":
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "prompt.style is 'chat' but the tokenizer has no chat template; "
                "use prompt.style: template or a tokenizer that defines one"
            )
        messages = []
        if prompt_cfg.get("system_prompt"):
            messages.append({"role": "system", "content": prompt_cfg["system_prompt"]})
        messages.append({"role": "user", "content": user})
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    else:
        text = user
    think_start = prompt_cfg.get("think_start") or ""
    if think_start.strip() and not text.rstrip().endswith(think_start.strip()):
        text += think_start
    return text


def build_prompts(
    prompt_cfg: Mapping[str, Any] | str, problems: Sequence[str], tokenizer: Any = None
) -> list[str]:
    """:func:`build_prompt` for every problem."""
    return [build_prompt(prompt_cfg, p, tokenizer) for p in problems]


# ------------------------------------------------------------------------------------------ backends
@dataclass(frozen=True)
class Completion:
    """One generated continuation of a prompt."""

    text: str  # decoded text, special tokens dropped
    n_tokens: int  # generated tokens, the end-of-sequence token included when one was produced
    truncated: bool  # stopped by max_new_tokens, not by an end-of-sequence token


class Generator(Protocol):
    """Samples ``n`` completions per prompt; results come back in prompt order."""

    def generate(
        self,
        prompts: Sequence[str],
        *,
        n: int,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        seed: int,
    ) -> list[list[Completion]]: ...


class HFGenerator:
    """transformers ``generate`` in left-padded batches on whatever device the model is on."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, batch_size: int = 64, progress: bool = False):
        self.model, self.tokenizer = model, tokenizer
        self.batch_size, self.progress = batch_size, progress
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.stop_ids = _stop_ids(model, tokenizer)

    @torch.inference_mode()
    def generate(
        self,
        prompts: Sequence[str],
        *,
        n: int = 1,
        temperature: float = 0.0,
        top_p: float = 1.0,
        max_new_tokens: int = 128,
        seed: int = 0,
    ) -> list[list[Completion]]:
        lengths = [len(ids) for ids in self.tokenizer(list(prompts), add_special_tokens=False)["input_ids"]]
        flat = [i for i in range(len(prompts)) for _ in range(n)]
        # Longest prompts first: similar lengths share a batch (less padding) and running out of
        # memory shows up in the first batch rather than the last.
        order = sorted(range(len(flat)), key=lambda j: -lengths[flat[j]])
        results: list[Completion | None] = [None] * len(flat)
        was_training, side = self.model.training, self.tokenizer.padding_side
        device = self.model.device
        cuda = list(range(torch.cuda.device_count())) if device.type == "cuda" else []
        self.model.eval()
        self.tokenizer.padding_side = "left"
        try:
            # A private RNG stream: a probe during training must not reset the trainer's sampling RNG.
            with torch.random.fork_rng(devices=cuda):
                torch.manual_seed(seed)
                starts = range(0, len(order), self.batch_size)
                for start in tqdm(starts, desc="generate", disable=not self.progress, unit="batch"):
                    chunk = order[start : start + self.batch_size]
                    texts = [prompts[flat[j]] for j in chunk]
                    for j, completion in zip(
                        chunk, self._batch(texts, temperature, top_p, max_new_tokens), strict=True
                    ):
                        results[j] = completion
        finally:
            self.model.train(was_training)
            self.tokenizer.padding_side = side
        return [results[i * n : (i + 1) * n] for i in range(len(prompts))]  # type: ignore[misc]

    def _batch(
        self, texts: list[str], temperature: float, top_p: float, max_new_tokens: int
    ) -> list[Completion]:
        enc = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        enc = enc.to(self.model.device)
        sample = temperature > 0
        out = self.model.generate(
            **enc,
            max_new_tokens=max_new_tokens,
            do_sample=sample,
            temperature=temperature if sample else None,
            top_p=top_p if sample else None,
            top_k=0 if sample else None,  # no top-k cut: the protocol is top-p only
            pad_token_id=self.pad_id,
            eos_token_id=self.stop_ids,
        )
        generated = out[:, enc["input_ids"].shape[1] :].tolist()
        kept, truncated = [], []
        for row in generated:
            end = next((pos for pos, tok in enumerate(row) if tok in self.stop_ids), None)
            kept.append(row if end is None else row[: end + 1])
            # A row without a stop token ran to max_new_tokens: generate only stops early once
            # every row of the batch has finished.
            truncated.append(end is None)
        decoded = self.tokenizer.batch_decode(kept, skip_special_tokens=True)
        return [Completion(t, len(ids), cut) for t, ids, cut in zip(decoded, kept, truncated, strict=True)]


def _stop_ids(model: torch.nn.Module, tokenizer: Any) -> list[int]:
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
    """Engine settings of the vLLM backend (the config's ``eval.vllm`` section)."""

    dtype: str = "auto"  # weight/activation dtype ("auto": the checkpoint's torch_dtype)
    gpu_memory_utilization: float = 0.9  # share of GPU memory for weights and KV cache
    tensor_parallel_size: int = 1  # GPUs one model is split over
    max_model_len: int | None = None  # prompt + completion tokens (None: the model's own limit)

    @classmethod
    def from_config(cls, section: Mapping[str, Any] | None) -> VLLMOptions:
        return cls(**dict(section or {}))


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as err:
        raise ImportError(
            "eval.backend 'vllm' needs vLLM, which is not installed: install the GPU extra "
            "(pip install 'rredcot[gpu]') on a machine with a CUDA GPU, or set eval.backend: hf"
        ) from err
    return vllm


def load_vllm(model_path: str | Path, options: VLLMOptions | None = None, **extra: Any) -> Any:
    """A ``vllm.LLM`` for a saved model with the configured options (``extra``: more LLM arguments)."""
    opts = options or VLLMOptions()
    return _import_vllm().LLM(
        model=str(model_path),
        dtype=opts.dtype,
        gpu_memory_utilization=opts.gpu_memory_utilization,
        tensor_parallel_size=opts.tensor_parallel_size,
        max_model_len=opts.max_model_len,
        **extra,
    )


class VLLMGenerator:
    """vLLM offline inference on a saved model directory (GPU only)."""

    def __init__(
        self,
        model_path: str | Path,
        tokenizer: Any,
        options: VLLMOptions | None = None,
        progress: bool = False,
    ):
        self.vllm, self.tokenizer, self.progress = _import_vllm(), tokenizer, progress
        self.llm = load_vllm(model_path, options)

    def generate(
        self,
        prompts: Sequence[str],
        *,
        n: int = 1,
        temperature: float = 0.0,
        top_p: float = 1.0,
        max_new_tokens: int = 128,
        seed: int = 0,
    ) -> list[list[Completion]]:
        from vllm.inputs import TokensPrompt

        # Token ids from our tokenizer, not text: vLLM would add special tokens (e.g. a second BOS)
        # to a prompt whose chat template already contains them.
        ids = self.tokenizer(list(prompts), add_special_tokens=False)["input_ids"]
        inputs = [TokensPrompt(prompt_token_ids=list(p)) for p in ids]
        # One seed per prompt, so a problem's samples do not depend on which others share the run.
        # vLLM seeds the n samples of a request seed, seed + 1, ..., hence the stride n between
        # prompts; the large factor keeps the seeds of different runs apart.
        params = [
            self.vllm.SamplingParams(
                n=n,
                temperature=temperature,
                top_p=top_p if temperature > 0 else 1.0,
                max_tokens=max_new_tokens,
                seed=seed * 1_000_003 + i * n,
            )
            for i in range(len(prompts))
        ]
        outputs = self.llm.generate(inputs, params, use_tqdm=self.progress)
        return [
            [Completion(o.text, len(o.token_ids), o.finish_reason == "length") for o in out.outputs]
            for out in outputs
        ]


def make_generator(
    eval_cfg: Mapping[str, Any],
    model_path: str | Path,
    tokenizer: Any,
    progress: bool = True,
    dtype: str = "float32",
) -> Generator:
    """The backend named by ``eval.backend`` for a saved model (HF weights in ``dtype`` on a GPU)."""
    backend = eval_cfg.get("backend", "hf")
    if backend == "vllm":
        return VLLMGenerator(model_path, tokenizer, VLLMOptions.from_config(eval_cfg.get("vllm")), progress)
    if backend != "hf":
        raise ValueError(f"eval.backend must be one of {BACKENDS}, got {backend!r}")
    from rredcot.modeling import load_model

    model = load_model(model_path, dtype)
    if torch.cuda.is_available():
        model = model.to("cuda")
    return HFGenerator(model, tokenizer, batch_size=eval_cfg["batch_size"], progress=progress)
