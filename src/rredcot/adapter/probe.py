"""The learning-curve probe: held-out accuracy of the model being trained, split over its processes.

Every ``rl.eval_every`` steps the trainer's processes each generate for their share of the probe
problems (``rows[rank::world]``, padded to equal length so that every process makes the same number
of ``generate`` calls: under ZeRO-3 and FSDP each call is collective), then the records are
gathered and scored once. The parameters are made whole for the probe as for the credit passes
(:func:`rredcot.adapter.distributed.scoring_model`). Generation is bounded by ``rl.probe``: its batch size
and token budget set the KV cache (batch x (prompt + max_new_tokens) tokens per process), and
thinking models are probed by sampling only (``greedy: false``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rredcot.adapter.distributed import gather_objects, scoring_model
from rredcot.adapter.engine import run_engine
from rredcot.lm.evaluation import evaluate_with, summarize
from rredcot.lm.generation import Generator, HFGenerator, VLLMGenerator


def probe_settings(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The probe's generation settings: ``rl.probe``, with the eval section's values where null."""
    probe, ev = cfg["rl"]["probe"], cfg["eval"]
    return {
        "greedy": bool(probe["greedy"]),
        "n_samples": probe["n_samples"] or ev["n_samples"],
        "max_new_tokens": probe["max_new_tokens"] or ev["max_new_tokens"],
        "batch_size": probe["batch_size"] or ev["batch_size"],
        "temperature": ev["temperature"],
        "top_p": ev["top_p"],
        "keep_completions": False,  # the probe keeps scores only
    }


def probe_engine(trainer: Any) -> Any:
    """The run's colocated vLLM engine with the policy's current weights, or None (transformers
    probes). The probe follows an optimizer step, so the engine first takes the step's weights
    (TRL would push them before the next generation anyway). Server runs probe with transformers:
    every process probes its own share, and a server is shared."""
    llm = run_engine(trainer)
    if llm is not None:
        trainer.vllm_generation.sync_weights()  # a collective under ZeRO-3 and FSDP: every process
    return llm


def probe_accuracy(
    model: torch.nn.Module,
    tokenizer: Any,
    rows: Sequence[Mapping[str, Any]],
    prompt_cfg: Mapping[str, Any] | str,
    settings: Mapping[str, Any],
    accelerator: Any = None,
    seed: int = 0,
    engine: Any = None,
) -> dict[str, float]:
    """Greedy (NaN when off) and sampled (avg@k) accuracy on ``rows``.

    ``model`` is the trainer's (possibly wrapped) model; with an ``accelerator`` the work is split
    over its processes and every process must call this together. ``engine``: a vLLM engine in this
    process that holds the model's weights (:func:`probe_engine`), which then generates instead.
    Returns the same numbers on every process.
    """
    rank, world = (accelerator.process_index, accelerator.num_processes) if accelerator else (0, 1)
    mine = [(i, rows[i]) for i in range(rank, len(rows), world)]
    share = math.ceil(len(rows) / world)
    padding = [(-1, rows[0])] * (share - len(mine))  # generated, never counted
    k = settings["n_samples"]
    eval_cfg = {**settings, "n_samples": k, "greedy": settings["greedy"]}
    # A rank-specific stream: processes must not draw the same samples for their shares.
    seed = seed + 1000 * rank
    if engine is not None:
        generator = VLLMGenerator(None, tokenizer, llm=engine)
        records = _records(generator, tokenizer, mine + padding, prompt_cfg, eval_cfg, seed)
    elif accelerator is None:
        generator = HFGenerator(model, tokenizer, batch_size=eval_cfg["batch_size"], progress=False)
        records = _records(generator, tokenizer, mine + padding, prompt_cfg, eval_cfg, seed)
    else:
        with scoring_model(accelerator, model) as whole:
            generator = HFGenerator(whole, tokenizer, batch_size=eval_cfg["batch_size"], progress=False)
            records = _records(generator, tokenizer, mine + padding, prompt_cfg, eval_cfg, seed)
    mine_records = [(i, r) for (i, _), r in zip(mine + padding, records, strict=True) if i >= 0]
    gathered = sorted(gather_objects(accelerator, mine_records) if accelerator else mine_records)
    summary = summarize([r for _, r in gathered], k)["all"]
    return {"greedy": summary["greedy"] if settings["greedy"] else math.nan, "sampled": summary[f"avg@{k}"]}


def _records(
    generator: Generator,
    tokenizer: Any,
    indexed: list[tuple[int, Mapping[str, Any]]],
    prompt_cfg: Mapping[str, Any] | str,
    eval_cfg: Mapping[str, Any],
    seed: int,
) -> list[dict[str, Any]]:
    records, _ = evaluate_with(
        generator,
        tokenizer,
        [row for _, row in indexed],
        prompt_cfg,
        eval_cfg,
        seed,
        greedy=eval_cfg["greedy"],
    )
    return records
