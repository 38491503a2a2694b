"""Process reward model (PRM) scores for every thinking segment, from one of two sources behind one interface.

A PRM turns a problem and a list of steps into one score per step, the probability that the step is
good. Here a step is one thinking segment ``completion[c_k:c_{k+1}]`` of a trace (its exit points
``cuts``), so the scores line up with RREDCoT's segment rewards (docs/method.md, "The
analyses (Figures 3-7)", Figures 5 and 6).

- ``qwen-prm``: a Hugging Face PRM in Qwen2.5-Math-PRM-7B's format, loaded with
  ``AutoModel.from_pretrained(..., trust_remote_code=True)``. The input is the chat
  system "Please reason step by step, and put your final answer within \\boxed{}.", user = problem,
  assistant = the steps joined by ``<extra_0>`` plus a final ``<extra_0>``; the score of step k is the
  softmax probability of the positive label (index 1 of the two logits) at its separator. No score
  exists before the first step (``prefix`` is None).
- ``local``: the embedded default's own token-classification PRM (``rredcot.studies.prm_train``). It
  reads the policy's own tokens ``prompt ⊕ completion[:e]`` without separators; the score of step k is
  read at the segment's last token, and a ``prefix`` score at the prompt's last token (exit point 0).

**Given the correct answer [our choice].** A PRM is a causal model, so appending the gold answer as a
final step would leave every earlier step's score unchanged. Instead the answer is stated *before* the
steps: for ``qwen-prm`` the user turn becomes ``problem + "\\n\\nThe correct final answer is
\\boxed{y}."``, for ``local`` the text ``"Answer: y\\n"`` is put in front of the prompt (the local PRM
is trained on such copies too). Every step score is then conditioned on the answer.

Each output line is one (trace, thinking segment): ``prm_score`` p_k, ``prm_delta`` p_k − p_{k−1}
(p_{−1} is the prefix score; None for k = 0 when there is none), the same two ``…_given_answer``, and
from the traces file RREDCoT's r̂_k and the changes of the thought and answer NLLs across the segment.

CLI: ``rredcot study-prm --config C [--prm PRM_DIR] --traces traces.jsonl --out prm.jsonl
[--figures DIR] [--limit N]``. The config says which PRM (``studies.prm.kind``): ``local`` reads the
directory ``--prm`` (``rredcot study-prm-train``), ``qwen-prm`` loads ``studies.prm.name_or_path``.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from tqdm import tqdm

from rredcot.infra.logs import setup_logging
from rredcot.studies.attribution import differences, segment_fields

_log = logging.getLogger(__name__)

QWEN_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
QWEN_SEPARATOR = "<extra_0>"
QWEN_ANSWER_HINT = "\n\nThe correct final answer is \\boxed{{{answer}}}."
LOCAL_ANSWER_HINT = "Answer: {answer}\n"
KINDS = ("local", "qwen-prm")
# Tokens of one PRM forward pass (rows x longest row): room for a 7B PRM's activations on one GPU.
MAX_BATCH_TOKENS = 16384


@dataclass(frozen=True)
class StepTrace:
    """One trace as a PRM sees it: the problem, its thinking segments as text and as the policy's ids."""

    problem: str
    answer: str
    steps: list[str]
    prompt_ids: list[int]
    step_ids: list[list[int]]


@dataclass(frozen=True)
class StepScores:
    """Probability of a good step after each step; ``prefix`` before the first one (None if undefined)."""

    steps: list[float]
    prefix: float | None = None


class StepScorer(Protocol):
    def score(self, traces: Sequence[StepTrace], given_answer: bool = False) -> list[StepScores]: ...


def _logits(output: Any) -> torch.Tensor:
    """Token-level logits of a HF output (``.logits``) or of remote code returning a tuple."""
    return output.logits if hasattr(output, "logits") else output[0]


def _budget_chunks(lengths: Sequence[int], max_batch_tokens: int) -> list[list[int]]:
    """Indices grouped longest first so that rows × longest row stays within the budget."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)
    chunks: list[list[int]] = []
    for i in order:
        if chunks and (len(chunks[-1]) + 1) * lengths[chunks[-1][0]] <= max_batch_tokens:
            chunks[-1].append(i)
        else:
            chunks.append([i])
    return chunks


def positive_probabilities(
    model: torch.nn.Module,
    sequences: Sequence[Sequence[int]],
    positions: Sequence[Sequence[int]],
    pad_id: int,
    max_batch_tokens: int,
    progress: bool = False,
) -> list[list[float]]:
    """softmax(logits)[1] at the given positions of each sequence (right-padded batches, no gradients)."""
    device = next(model.parameters()).device
    out: list[list[float]] = [[] for _ in sequences]
    chunks = _budget_chunks([len(s) for s in sequences], max_batch_tokens)
    with torch.inference_mode():
        for chunk in tqdm(chunks, desc="PRM", unit="batch", disable=not progress):
            width = max(len(sequences[i]) for i in chunk)
            ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
            mask = torch.zeros(len(chunk), width, dtype=torch.long)
            for b, i in enumerate(chunk):
                ids[b, : len(sequences[i])] = torch.tensor(sequences[i], dtype=torch.long)
                mask[b, : len(sequences[i])] = 1
            logits = _logits(model(input_ids=ids.to(device), attention_mask=mask.to(device)))
            if logits.shape[-1] != 2:  # e.g. a bare backbone's hidden states: not a two-label PRM head
                raise ValueError(f"expected two logits per token, got {logits.shape[-1]}")
            probs = torch.softmax(logits.float(), dim=-1)[..., 1].cpu()
            for b, i in enumerate(chunk):
                out[i] = probs[b, list(positions[i])].tolist()
    return out


# --------------------------------------------------------------------------------- Qwen2.5-Math-PRM
def qwen_prm_text(
    tokenizer: Any, problem: str, steps: Sequence[str], system: str = QWEN_SYSTEM, sep: str = QWEN_SEPARATOR
) -> str:
    """The chat text Qwen2.5-Math-PRM scores: steps joined by the separator, one more at the end.

    Steps are stripped of surrounding whitespace (the model's own examples carry none) and of any
    separator text they might contain, so that separators mark step ends only.
    """
    clean = [s.replace(sep, "").strip() for s in steps]
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": problem},
        {"role": "assistant", "content": sep.join(clean) + sep},
    ]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)


class QwenPRMScorer:
    """Step scores of a PRM in Qwen2.5-Math-PRM's format (any model returning [B, T, 2] logits)."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, max_batch_tokens: int) -> None:
        self.model, self.tok, self.max_batch_tokens = model, tokenizer, max_batch_tokens
        self.sep_id = tokenizer.convert_tokens_to_ids(QWEN_SEPARATOR)
        if self.sep_id is None or self.sep_id == tokenizer.unk_token_id:
            raise ValueError(f"the tokenizer has no {QWEN_SEPARATOR} token")

    def encode(self, trace: StepTrace, given_answer: bool = False) -> list[int]:
        problem = trace.problem + (QWEN_ANSWER_HINT.format(answer=trace.answer) if given_answer else "")
        return self.tok(qwen_prm_text(self.tok, problem, trace.steps), add_special_tokens=False)["input_ids"]

    def score(self, traces: Sequence[StepTrace], given_answer: bool = False) -> list[StepScores]:
        seqs = [self.encode(t, given_answer) for t in traces]
        positions = [[p for p, t in enumerate(s) if t == self.sep_id] for s in seqs]
        for t, pos in zip(traces, positions, strict=True):
            if len(pos) != len(t.steps):  # a step text that tokenizes into a separator would shift scores
                raise ValueError(f"{len(pos)} separators for {len(t.steps)} steps")
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
        probs = positive_probabilities(self.model, seqs, positions, pad, self.max_batch_tokens, progress=True)
        return [StepScores(p) for p in probs]


# ------------------------------------------------------------------------------------- local PRM
def local_positions(n_prompt: int, step_lengths: Sequence[int]) -> list[int]:
    """Where the local PRM is read: the prompt's last token, then the last token of every step."""
    positions, end = [n_prompt - 1], n_prompt
    for n in step_lengths:
        end += n
        positions.append(end - 1)
    return positions


def local_sequence(trace: StepTrace, hint_ids: Sequence[int] = ()) -> tuple[list[int], list[int]]:
    """``hint ⊕ prompt ⊕ steps`` as ids and the positions of the prefix and step scores."""
    prompt = [*hint_ids, *trace.prompt_ids]
    ids = prompt + [t for step in trace.step_ids for t in step]
    return ids, local_positions(len(prompt), [len(s) for s in trace.step_ids])


class LocalPRMScorer:
    """Step scores of a token-classification PRM trained by ``rredcot study-prm-train``."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        hint: str,
        max_batch_tokens: int,
    ) -> None:
        self.model, self.tok, self.hint, self.max_batch_tokens = model, tokenizer, hint, max_batch_tokens

    def hint_ids(self, answer: str) -> list[int]:
        return self.tok(self.hint.format(answer=answer), add_special_tokens=False)["input_ids"]

    def score(self, traces: Sequence[StepTrace], given_answer: bool = False) -> list[StepScores]:
        pairs = [local_sequence(t, self.hint_ids(t.answer) if given_answer else ()) for t in traces]
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
        probs = positive_probabilities(
            self.model,
            [s for s, _ in pairs],
            [p for _, p in pairs],
            pad,
            self.max_batch_tokens,
            progress=True,
        )
        return [StepScores(p[1:], p[0]) for p in probs]


def load_scorer(kind: str, path: str, dtype: str, max_batch_tokens: int) -> StepScorer:
    """A scorer for a local PRM directory or a hub PRM in Qwen2.5-Math-PRM's format."""
    from transformers import AutoConfig, AutoModel, AutoModelForTokenClassification, AutoTokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    chosen = getattr(torch, dtype) if device == "cuda" else torch.float32
    if kind == "qwen-prm":
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
        # Qwen2.5-Math-PRM maps AutoModel to its own PRM class (remote code); a checkpoint without such
        # a mapping would give a bare backbone there, so it is loaded as a token classifier instead.
        config = AutoConfig.from_pretrained(path, trust_remote_code=True)
        remote = "AutoModel" in (getattr(config, "auto_map", None) or {})
        cls = AutoModel if remote else AutoModelForTokenClassification
        model = cls.from_pretrained(path, dtype=chosen, trust_remote_code=True).to(device).eval()
        return QwenPRMScorer(model, tok, max_batch_tokens)
    if kind == "local":
        from rredcot.lm.modeling import load_tokenizer

        meta_path = Path(path) / "prm.json"
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        model = AutoModelForTokenClassification.from_pretrained(path, dtype=chosen).to(device).eval()
        return LocalPRMScorer(
            model, load_tokenizer(path), meta.get("answer_hint", LOCAL_ANSWER_HINT), max_batch_tokens
        )
    raise ValueError(f"unknown PRM kind {kind!r}; expected one of {KINDS}")


# ------------------------------------------------------------------------------------ trace rows
def problem_text(row: Mapping[str, Any], prompt_cfg: Mapping[str, Any]) -> str:
    """The problem statement: the row's ``problem``, else the prompt with the config's template removed."""
    if row.get("problem"):
        return str(row["problem"])
    prompt = str(row["prompt"])
    template = str(prompt_cfg["template"])
    if prompt_cfg["style"] == "template" and "{problem}" in template:
        head, tail = template.split("{problem}", 1)
        if prompt.startswith(head) and prompt.endswith(tail):
            return prompt[len(head) : len(prompt) - len(tail)]
    return prompt


def step_trace(row: Mapping[str, Any], prompt_cfg: Mapping[str, Any]) -> StepTrace:
    """A trace row of ``rredcot.studies.traces`` as PRM input: one step per thinking segment."""
    cuts = [int(c) for c in row["cuts"]]
    completion, tokens = list(row["completion_ids"]), list(row["tokens"])
    bounds = list(zip(cuts[:-1], cuts[1:], strict=True))
    return StepTrace(
        problem=problem_text(row, prompt_cfg),
        answer=str(row["answer"]),
        steps=["".join(tokens[a:b]) for a, b in bounds],
        prompt_ids=list(row["prompt_ids"]),
        step_ids=[completion[a:b] for a, b in bounds],
    )


def _deltas(scores: StepScores) -> list[float | None]:
    return differences([scores.prefix, *scores.steps])


def prm_rows(row: Mapping[str, Any], plain: StepScores, given: StepScores, kind: str) -> list[dict[str, Any]]:
    """Output lines of one trace: PRM scores and the RREDCoT quantities of each thinking segment."""
    cuts = [int(c) for c in row["cuts"]]
    e = cuts[-1] if cuts else 0
    rewards = list(row.get("segment_rewards") or [])
    d_thought = differences(list(row.get("thought_nll") or [None] * len(cuts)))
    d_answer = differences(list(row.get("answer_nll") or [None] * len(cuts)))
    d_plain, d_given = _deltas(plain), _deltas(given)
    out = []
    for k in range(len(plain.steps)):
        out.append(
            {
                **segment_fields(row, k, len(plain.steps), cuts, e),
                "prm_kind": kind,
                "prm_score": plain.steps[k],
                "prm_delta": d_plain[k],
                "prm_score_given_answer": given.steps[k],
                "prm_delta_given_answer": d_given[k],
                "rredcot": rewards[k] if k < len(rewards) else None,
                "d_thought_nll": d_thought[k] if k < len(d_thought) else None,
                "d_answer_nll": d_answer[k] if k < len(d_answer) else None,
            }
        )
    return out


def score_traces(
    scorer: StepScorer, rows: Sequence[Mapping[str, Any]], prompt_cfg: Mapping[str, Any], kind: str
) -> list[dict[str, Any]]:
    """Per-segment PRM rows of every trace with at least one thinking segment, as is and given the answer."""
    rows = [r for r in rows if len(r["cuts"]) > 1]
    traces = [step_trace(r, prompt_cfg) for r in rows]
    plain = scorer.score(traces)
    given = scorer.score(traces, given_answer=True)
    return [line for r, p, g in zip(rows, plain, given, strict=True) for line in prm_rows(r, p, g, kind)]


def main(argv: Sequence[str] | None = None) -> None:
    from rredcot.infra.io import read_jsonl, write_jsonl
    from rredcot.infra.tracking import stage_run
    from rredcot.lm.modeling import set_threads
    from rredcot.settings.reads import stage_config

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", nargs="+", required=True, help="config YAML file(s), later ones override")
    ap.add_argument("--prm", help="the trained PRM directory (studies.prm.kind local)")
    ap.add_argument("--traces", required=True, help="traces with exit points and segment rewards (JSONL)")
    ap.add_argument("--out", required=True, help="per-segment PRM scores (JSONL)")
    ap.add_argument("--figures", help="also draw Figures 5 and 6 into this directory")
    ap.add_argument("--prm-name", help="name of the PRM in the figure titles (default: from its kind)")
    ap.add_argument("--limit", type=int, help="only the first N traces")
    args = ap.parse_args(argv)

    cfg = stage_config(args.config, "study_prm")
    set_threads(cfg["threads"]["eval"])
    kind = cfg["studies"]["prm"]["kind"]
    if kind == "local" and not args.prm:
        ap.error("studies.prm.kind local scores with a trained PRM: name its directory with --prm")
    path = args.prm if kind == "local" else cfg["studies"]["prm"]["name_or_path"]
    rows = read_jsonl(args.traces)[: args.limit]
    params = {"prm": path, "kind": kind, "traces": args.traces, "n_traces": len(rows)}
    with stage_run(cfg, f"study-prm-{kind}", rule="study_prm", params=params) as run:
        t0 = time.time()
        scorer = load_scorer(kind, path, cfg["model"]["dtype"], MAX_BATCH_TOKENS)
        lines = score_traces(scorer, rows, cfg["prompt"], kind)
        write_jsonl(args.out, lines)
        seconds = time.time() - t0
        run.log_metrics({"segments": len(lines), "seconds": seconds})
        run.log_artifact(args.out)
        _log.info(f"{len(rows)} traces, {len(lines)} segments -> {args.out} ({seconds:.1f}s)")
        if args.figures:
            from rredcot.studies.figures_attr import prm_nll_figure, prm_rredcot_figure

            name = args.prm_name or ("Qwen2.5-Math-PRM" if kind == "qwen-prm" else "MC-trained PRM")
            paths = prm_nll_figure(lines, Path(args.figures), name)
            paths += prm_rredcot_figure(lines, Path(args.figures), name)
            for path in paths:
                run.log_artifact(path)
            _log.info(f"Figures 5 and 6 -> {args.figures}")


if __name__ == "__main__":
    setup_logging()
    main()
