"""Synthetic credit batches: the models, tokenizer and traces that ``rredcot bench`` and ``rredcot
gpu-check`` time the credit on, and how two credits of one batch compare.

- :data:`SHAPES` and :data:`TINY`: the published sizes of the paper's models and a tiny model of the
  same family, for :func:`rredcot.lm.modeling.random_model`; :data:`BATCHES` and
  :data:`TINY_BATCHES`: the per-GPU batches of the paper recipes, full size and tiny;
- :func:`word_tokenizer` and :func:`synthetic_traces`: word-level traces of a tokenizer of any
  vocabulary size (thinking lines, the exit string, a final solution and its boxed answer);
- :func:`batch_credit`, :func:`recipe_credit` and :func:`recipe_batch`: a config's RREDCoT credit
  with the batch's number of exit points, and a recipe's whole batch;
- :func:`suffix_tokens` (the token bound's terms) and :func:`credit_agreement` (how far one credit's
  σ lies from another's).
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from rredcot.method.settings import CreditConfig

# Published sizes (config.json of each checkpoint); vocabulary 151,936 for all three.
SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": dict(
        model_type="qwen2",
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        tie_word_embeddings=True,
    ),
    "qwen2.5-1.5b": dict(
        model_type="qwen2",
        hidden_size=1536,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        intermediate_size=8960,
        tie_word_embeddings=False,
    ),
    "qwen3-4b": dict(
        model_type="qwen3",
        hidden_size=2560,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=9728,
        tie_word_embeddings=True,
    ),
}
TINY = dict(
    model_type="qwen3",
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
    tie_word_embeddings=True,
)
VOCAB = 151936
TINY_VOCAB = 512

# The per-GPU batches of the paper recipes (full size, and the tiny form the tests run).
BATCHES: dict[str, dict[str, Any]] = {
    "table2": dict(
        shape="qwen2.5-1.5b",
        config="table2",
        traces=24,
        lengths=(3300, 3900),
        exits=20,
        solution=400,
        own=124,
        naive=4,
        precision=True,
    ),
    "table1": dict(
        shape="qwen3-4b",
        config="table1",
        traces=8,
        lengths=(6000, 25000),
        exits=48,
        solution=400,
        own=124,
        naive=0,
        precision=False,
    ),
}
TINY_BATCHES: dict[str, dict[str, Any]] = {
    "table2": dict(traces=4, lengths=(150, 200), exits=5, solution=20, own=8, naive=2),
    "table1": dict(traces=2, lengths=(150, 300), exits=6, solution=20, own=8, naive=0),
}
EXIT_STRING, ANSWER_PREFIX, ANSWER_SUFFIX = "\n</think>\n\n", " \\boxed{", "}"
SPECIAL_TOKENS = ["<pad>", "<eos>", "\n", "</think>", "\\boxed{", "}"]


def word_tokenizer(vocab: int):
    """A word-level tokenizer of ``vocab`` tokens: the texts around an exit point and a boxed answer
    are tokens of their own, every other word is ``w<id>``."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    words.update({f"w{i}": i for i in range(len(SPECIAL_TOKENS), vocab)})
    raw = Tokenizer(models.WordLevel(words, unk_token="<pad>"))
    raw.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\n|</think>|\\boxed\{|\}"), behavior="isolated"),
            pre_tokenizers.Split(" ", behavior="removed"),
        ]
    )
    return PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", eos_token="<eos>")


def synthetic_traces(
    tok: Any,
    n: int,
    lengths: tuple[int, int],
    exits: int,
    solution: int,
    own: int,
    prompt_words: int,
    seed: int,
) -> list[Any]:
    """``n`` traces of ``lengths[0]..lengths[1]`` completion tokens after a prompt of ``prompt_words``
    words: thinking lines (a newline about every quarter of a segment, so that segmentation has
    pieces to merge), the exit string, a final solution of ``own`` words and its boxed answer; half
    with a positive advantage, half negative. Each has one reference pair: a ``solution``-word
    solution and the answer."""
    from rredcot.method.registry import TraceInput

    rng = random.Random(seed)
    vocab = len(tok)
    word = lambda: f"w{rng.randrange(len(SPECIAL_TOKENS), vocab)}"  # noqa: E731
    exit_ids = tok(EXIT_STRING, add_special_tokens=False)["input_ids"]
    reference = " ".join(word() for _ in range(solution))
    items = []
    for i in range(n):
        length = lengths[0] + (lengths[1] - lengths[0]) * i // max(n - 1, 1)
        final = [word() for _ in range(own)]
        tail = tok(" ".join(final) + f"{ANSWER_PREFIX}w9{ANSWER_SUFFIX}", add_special_tokens=False)
        thinking = length - len(exit_ids) - len(tail["input_ids"]) - 1
        every = max(2, thinking // (4 * exits))
        words = ["\n" if k % every == every - 1 else word() for k in range(thinking)]
        completion = tok(" ".join(words), add_special_tokens=False)["input_ids"]
        completion += exit_ids + tail["input_ids"] + [tok.eos_token_id]
        prompt = tok(" ".join(word() for _ in range(prompt_words)), add_special_tokens=False)["input_ids"]
        items.append(TraceInput(prompt, completion, 1.0 if i % 2 else -1.0, [(reference, "w9")]))
    return items


def batch_credit(cfg: Mapping[str, Any], exits: int, min_segment_tokens: int | None = None) -> CreditConfig:
    """The config's RREDCoT credit (:func:`rredcot.settings.config.rredcot_credit`), as training
    computes it, with ``exits`` exit points per trace: the segmentation's target is the batch's
    (``n_segments`` = exits - 1, ``tokens_per_segment`` off), and ``min_segment_tokens`` when given;
    every other setting is the config's."""
    from rredcot.settings.config import rredcot_credit

    credit = rredcot_credit(cfg)
    minimum = credit.segmentation.min_segment_tokens if min_segment_tokens is None else min_segment_tokens
    credit.segmentation = replace(
        credit.segmentation, n_segments=exits - 1, tokens_per_segment=0, min_segment_tokens=minimum
    )
    credit.view_every = 0
    return credit


def recipe_credit(path: str, exits: int, tiny: bool) -> tuple[dict[str, Any], CreditConfig, torch.dtype]:
    """The recipe, its RREDCoT credit with ``exits`` exit points per trace, and its compute dtype."""
    from rredcot.settings.config import load_config

    cfg = load_config([path])
    credit = batch_credit(cfg, exits, 2 if tiny else None)  # tiny traces: shorter segments
    dtype = torch.bfloat16 if cfg["model"]["dtype"] == "bfloat16" else torch.float32
    return cfg, credit, dtype


def recipe_batch(name: str, config: str, tiny: bool) -> tuple:
    """A recipe's per-GPU batch: its spec, config, credit, compute dtype, tokenizer, traces and the
    longest sequence."""
    spec = dict(BATCHES[name])
    if tiny:
        spec.update(TINY_BATCHES[name])
    cfg, credit, dtype = recipe_credit(config, spec["exits"], tiny)
    tok = word_tokenizer(TINY_VOCAB if tiny else VOCAB)
    items = synthetic_traces(
        tok, spec["traces"], spec["lengths"], spec["exits"], spec["solution"], spec["own"], 200, 0
    )
    longest = max(len(t.prompt_ids) + len(t.completion_ids) for t in items)
    return spec, cfg, credit, dtype, tok, items, longest


def suffix_tokens(assigner, items, credits) -> tuple[int, int]:
    """Trace tokens and exit-suffix tokens of the batch: the token bound is their sum over the first."""
    strings = assigner.strings()
    fixed = 1 + len(strings.exit_ids) + len(strings.answer_prefix_ids) + len(strings.answer_suffix_ids)
    trace = suffix = 0
    for t, c in zip(items, credits, strict=True):
        pairs = [(assigner.encode(u), assigner.encode(y)) for u, y in t.pairs]
        trace += len(t.prompt_ids) + len(t.completion_ids)
        suffix += len(c.cuts) * sum(fixed + len(u) + len(y) for u, y in pairs)
    return trace, suffix


def most_credited(credit: Any) -> tuple[int, int]:
    """The token span of the segment that gets the largest share of σ (for a wrong trace: the most
    blamed one), segments as the credit cut them (thinking segments, then the answer segment)."""
    starts = [*credit.segment_starts, credit.multiplier.numel()]
    mass = [float(credit.multiplier[a:b].sum()) for a, b in zip(starts, starts[1:], strict=False)]
    k = max(range(len(mass)), key=mass.__getitem__)
    return starts[k], starts[k + 1]


def credit_agreement(reference: list[Any], other: list[Any], items: list[Any]) -> dict[str, float]:
    """How far ``other``'s σ of the same traces lies from ``reference``'s: the largest and the median
    per-trace max |Δ σ·|o||, and the shares of traces whose segments, and whose most-credited segment
    (of a wrong trace: its most blamed), are the same."""
    pairs = list(zip(reference, other, strict=True))
    diffs = [float((a.multiplier - b.multiplier).abs().max()) for a, b in pairs]
    same = [most_credited(a) == most_credited(b) for a, b in pairs]
    wrong = [s for s, t in zip(same, items, strict=True) if t.advantage < 0]
    return {
        "max_abs_diff_multiplier": max(diffs),
        "median_max_abs_diff_multiplier": statistics.median(diffs),
        "same_most_credited_segment": sum(same) / len(same),
        "same_most_blamed_segment_wrong_traces": sum(wrong) / max(len(wrong), 1),
        "same_segments": sum(a.segment_starts == b.segment_starts for a, b in pairs) / len(pairs),
    }
