"""Train the embedded default's own process reward model on Monte Carlo labelled steps.

No PRM exists for the synthetic task, so the pipeline trains one: a token-classification model with
two labels (``AutoModelForTokenClassification``, e.g. Qwen2ForTokenClassification), its backbone
initialised from the SFT model and its head at random. It reads the policy's own tokens
``prompt ⊕ completion[:e]``; the step positions are the prompt's last token (exit point 0) and the
last token of every thinking segment (exit point k+1), as ``rredcot.studies.prm.local_positions``.

- **Labels [our choice]: soft.** The target at exit point j is the MC value m_j (mean correctness of M
  rollouts from there): the loss is the cross-entropy −[m_j log p + (1 − m_j) log(1 − p)], so p
  estimates the probability of success and no information is thrown away. ``studies.prm.label:
  hard`` uses 1[m_j ≥ 0.5] instead.
- **Given the answer.** With ``studies.prm.answer_hint: both`` (default) every training trace appears
  twice, as is and with ``"Answer: y\\n"`` in front of the prompt, so that the PRM can also be asked
  given the correct answer (see ``rredcot.studies.prm``). The labels are the same MC values in both
  copies.
- **Validation.** Traces are split by problem (no problem in both parts; seeded). Reported per copy:
  accuracy of 1[p ≥ 0.5] against 1[m ≥ 0.5], ROC AUC of p against 1[m ≥ 0.5], Brier score of p
  against m and the Brier score of the constant training mean (what a PRM must beat).
- **Deterministic** for a seed on a fixed thread count: the seed sets the head's initialisation, the
  split, the batch order and dropout.

CLI: ``rredcot study-prm-train --config C --model SFT_DIR --traces traces.jsonl --mc mc.jsonl
--out PRM_DIR``; the directory holds the model, the tokenizer and ``prm.json`` (settings, metrics).
Every setting comes from the config (``studies.prm`` and ``studies.seed``; rredcot.settings.reads,
stage ``study_prm_train``).
"""

from __future__ import annotations

import argparse
import logging
import math
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
from scipy import stats
from tqdm import tqdm

from rredcot.infra.logs import setup_logging
from rredcot.studies.attribution import mc_values
from rredcot.studies.prm import LOCAL_ANSWER_HINT, MAX_BATCH_TOKENS, local_positions, positive_probabilities

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PRMTrainConfig:
    """How the local PRM is trained: the config's ``studies.prm`` training settings (their one home,
    with their docs, is ``rredcot.settings.config.Prm``) and ``studies.seed``."""

    epochs: int
    batch_size: int
    learning_rate: float
    weight_decay: float
    val_fraction: float
    seed: int
    label: str  # soft: target m; hard: 1[m >= 0.5]
    answer_hint: str  # both: also train on copies with the answer in front; plain: only as is
    hint: str = LOCAL_ANSWER_HINT  # the text of the answer in front: the format, not a setting

    def __post_init__(self) -> None:
        if self.label not in ("soft", "hard"):
            raise ValueError(f"label must be soft or hard, got {self.label!r}")
        if self.answer_hint not in ("both", "plain"):
            raise ValueError(f"answer_hint must be both or plain, got {self.answer_hint!r}")

    @classmethod
    def from_config(cls, studies: Mapping[str, Any]) -> PRMTrainConfig:
        """From the config's ``studies`` section."""
        prm = studies["prm"]
        names = [f.name for f in fields(cls) if f.name not in ("seed", "hint")]
        return cls(**{name: prm[name] for name in names}, seed=studies["seed"])


@dataclass(frozen=True)
class Example:
    """One training sequence: ids, where the step scores are read, and their MC targets."""

    trace_id: str
    problem_id: str
    given_answer: bool
    ids: list[int]
    positions: list[int]
    targets: list[float]


def build_examples(
    traces: Sequence[Mapping[str, Any]],
    mc_rows: Sequence[Mapping[str, Any]],
    encode: Any,
    cfg: PRMTrainConfig,
) -> tuple[list[Example], int]:
    """Examples of every trace with MC values at all its exit points; also the number skipped."""
    mc = mc_values(mc_rows)
    examples, skipped = [], 0
    for t in traces:
        cuts = [int(c) for c in t["cuts"]]
        values = [mc.get(str(t["trace_id"]), {}).get(j, (None, 0))[0] for j in range(len(cuts))]
        if len(cuts) < 2 or any(v is None or not math.isfinite(v) for v in values):
            skipped += 1
            continue
        targets = [float(v >= 0.5) if cfg.label == "hard" else float(v) for v in values]  # type: ignore[operator]
        thinking = list(t["completion_ids"])[: cuts[-1]]
        variants = [False, True] if cfg.answer_hint == "both" else [False]
        for given in variants:
            hint = encode(cfg.hint.format(answer=t["answer"])) if given else []
            prompt = [*hint, *t["prompt_ids"]]
            steps = [b - a for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
            examples.append(
                Example(
                    str(t["trace_id"]),
                    str(t.get("problem_id", t["trace_id"])),
                    given,
                    prompt + thinking,
                    local_positions(len(prompt), steps),
                    targets,
                )
            )
    return examples, skipped


def split_by_problem(
    examples: Sequence[Example], val_fraction: float, seed: int
) -> tuple[list[Example], list[Example]]:
    """Train and validation examples; every problem goes wholly to one side (seeded shuffle)."""
    problems = sorted({e.problem_id for e in examples})
    random.Random(seed).shuffle(problems)
    n_val = round(len(problems) * val_fraction) if len(problems) > 1 else 0
    val = set(problems[:n_val])
    return [e for e in examples if e.problem_id not in val], [e for e in examples if e.problem_id in val]


def _batch(examples: Sequence[Example], pad_id: int) -> tuple[torch.Tensor, ...]:
    width = max(len(e.ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(examples), width, dtype=torch.long)
    rows, cols, targets = [], [], []
    for b, e in enumerate(examples):
        ids[b, : len(e.ids)] = torch.tensor(e.ids)
        mask[b, : len(e.ids)] = 1
        rows += [b] * len(e.positions)
        cols += e.positions
        targets += e.targets
    return ids, mask, torch.tensor(rows), torch.tensor(cols), torch.tensor(targets)


def train_prm(
    model: torch.nn.Module,
    examples: Sequence[Example],
    cfg: PRMTrainConfig,
    pad_id: int,
    progress: bool = True,
) -> list[float]:
    """Fit the two-label head and backbone on the examples; returns the mean loss of each epoch."""
    torch.manual_seed(cfg.seed)
    order = random.Random(cfg.seed)
    device = next(model.parameters()).device
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    n_batches = math.ceil(len(examples) / cfg.batch_size)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(1, cfg.epochs * n_batches))
    model.train()
    losses = []
    for epoch in range(cfg.epochs):
        idx = list(range(len(examples)))
        order.shuffle(idx)
        total = 0.0
        bar = tqdm(range(n_batches), desc=f"PRM epoch {epoch + 1}/{cfg.epochs}", disable=not progress)
        for i in bar:
            part = [examples[j] for j in idx[i * cfg.batch_size : (i + 1) * cfg.batch_size]]
            ids, mask, rows, cols, target = (t.to(device) for t in _batch(part, pad_id))
            logits = model(input_ids=ids, attention_mask=mask).logits[rows, cols].float()
            log_p = torch.log_softmax(logits, dim=-1)
            loss = -(target * log_p[:, 1] + (1 - target) * log_p[:, 0]).mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total += loss.item()
            bar.set_postfix(loss=f"{loss.item():.4f}")
        losses.append(total / max(1, n_batches))
    model.eval()
    return losses


def roc_auc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """Area under the ROC curve (Mann-Whitney U with tied ranks); NaN when one class is missing."""
    pos = sum(labels)
    neg = len(labels) - pos
    if pos == 0 or neg == 0:
        return math.nan
    ranks = stats.rankdata(scores)
    return float(
        (sum(r for r, y in zip(ranks, labels, strict=True) if y) - pos * (pos + 1) / 2) / (pos * neg)
    )


def validation_metrics(
    model: torch.nn.Module, examples: Sequence[Example], train_mean: float, pad_id: int
) -> dict[str, float]:
    """Accuracy, AUC and Brier score of the step probabilities, per copy (as is / given the answer)."""
    out: dict[str, float] = {}
    for given, name in ((False, "plain"), (True, "given_answer")):
        part = [e for e in examples if e.given_answer is given]
        if not part:
            continue
        ids, positions = [e.ids for e in part], [e.positions for e in part]
        probs = positive_probabilities(model, ids, positions, pad_id, MAX_BATCH_TOKENS)
        p = [x for ps in probs for x in ps]
        m = [x for e in part for x in e.targets]
        hard = [x >= 0.5 for x in m]
        out |= {
            f"val_{name}/n_steps": float(len(p)),
            f"val_{name}/accuracy": sum((a >= 0.5) == b for a, b in zip(p, hard, strict=True)) / len(p),
            f"val_{name}/auc": roc_auc(p, hard),
            f"val_{name}/brier": sum((a - b) ** 2 for a, b in zip(p, m, strict=True)) / len(p),
            f"val_{name}/brier_constant": sum((train_mean - b) ** 2 for b in m) / len(m),
        }
    return out


def fit(
    sft_dir: str | Path,
    traces: Sequence[Mapping[str, Any]],
    mc_rows: Sequence[Mapping[str, Any]],
    cfg: PRMTrainConfig,
    progress: bool = True,
) -> tuple[torch.nn.Module, Any, dict[str, Any]]:
    """Model, tokenizer and summary (settings, sizes, losses, validation metrics) of one training run."""
    from transformers import AutoModelForTokenClassification

    from rredcot.lm.modeling import load_tokenizer

    tok = load_tokenizer(sft_dir)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0

    def encode(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    examples, skipped = build_examples(traces, mc_rows, encode, cfg)
    if not examples:
        raise ValueError("no trace has Monte Carlo values at all its exit points")
    train, val = split_by_problem(examples, cfg.val_fraction, cfg.seed)
    torch.manual_seed(cfg.seed)  # the new head's initialisation
    model = AutoModelForTokenClassification.from_pretrained(str(sft_dir), num_labels=2, dtype=torch.float32)
    if torch.cuda.is_available():
        model = model.cuda()
    t0 = time.time()
    losses = train_prm(model, train, cfg, pad, progress)
    targets = [x for e in train for x in e.targets]
    summary: dict[str, Any] = {
        "settings": asdict(cfg),
        "answer_hint": cfg.hint,
        "sft_model": str(sft_dir),
        "n_train_examples": len(train),
        "n_val_examples": len(val),
        "n_traces_skipped": skipped,
        "train_seconds": time.time() - t0,
        "epoch_losses": losses,
        "metrics": validation_metrics(model, val, sum(targets) / len(targets), pad) if val else {},
    }
    return model, tok, summary


def main(argv: Sequence[str] | None = None) -> None:
    from rredcot.infra.io import atomic_dir, read_jsonl, write_json
    from rredcot.infra.tracking import stage_run
    from rredcot.lm.modeling import set_threads
    from rredcot.settings.reads import stage_config

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", nargs="+", required=True, help="config YAML file(s), later ones override")
    ap.add_argument("--model", required=True, help="SFT model directory (the backbone's starting weights)")
    ap.add_argument("--traces", required=True, help="traces with exit points (JSONL)")
    ap.add_argument("--mc", required=True, help="Monte Carlo values per (trace, exit point) (JSONL)")
    ap.add_argument("--out", required=True, help="output PRM directory")
    args = ap.parse_args(argv)

    cfg = stage_config(args.config, "study_prm_train")
    set_threads(cfg["threads"]["train"])
    train_cfg = PRMTrainConfig.from_config(cfg["studies"])
    params = {"prm": asdict(train_cfg), "model": args.model, "traces": args.traces, "mc": args.mc}
    with stage_run(cfg, "study-prm-train", rule="study_prm_train", params=params, seed=train_cfg.seed) as run:
        model, tok, summary = fit(args.model, read_jsonl(args.traces), read_jsonl(args.mc), train_cfg)
        with atomic_dir(args.out) as tmp:
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            write_json(Path(tmp) / "prm.json", summary)
        for epoch, loss in enumerate(summary["epoch_losses"]):
            run.log_metrics({"train_loss": loss}, step=epoch + 1)
        run.log_metrics({**summary["metrics"], "train_seconds": summary["train_seconds"]})
        n_train, n_val = summary["n_train_examples"], summary["n_val_examples"]
        _log.info(f"{n_train} train / {n_val} validation examples")
        _log.info(f"losses {summary['epoch_losses']}; {summary['metrics']} -> {args.out}")


if __name__ == "__main__":
    setup_logging()
    main()
