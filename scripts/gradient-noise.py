"""How much of a GRPO batch gradient is signal, and how much credit assignment changes it.

On the synthetic task: sample GRPO batches from a model (``rl.prompts_per_step`` problems of the RL
split x ``rl.num_generations`` completions at ``rl.temperature``), reward each completion by its
boxed answer against the true one, take group-normalised advantages, and compute for every named
training method (a name under the config's ``arms``) the policy gradient of the same batch with
that method's σ (the trainer's own credit code: ``CreditAssigner`` with the method's
``CreditConfig``; uniform σ for GRPO). Then, over the batches:

- ``cos(arm, first arm)``: how far the method's credit turns the gradient of the same batch;
- ``signal share``: the fraction of a batch gradient's squared norm that is its expectation,
  estimated from B batches as (|mean g|² / mean |g|² - 1/B) / (1 - 1/B) (0: pure noise);
- ``cos across batches``: the mean cosine between the gradients of two different batches.

RREDCoT's exit-point values are scored as in training; Monte Carlo credit (its rollouts belong to
the trainer) is not supported.

    python scripts/gradient-noise.py --config config/config.yaml --model results/models/sft \\
        --data results/data/rl.clean.jsonl --arms grpo oracle --batches 10
"""

from __future__ import annotations

import argparse
import json
import random

import torch

from rredcot.data import synthetic as syn
from rredcot.data.grading import extract_boxed
from rredcot.lm.generation import HFGenerator
from rredcot.lm.modeling import load_model, load_tokenizer, set_threads
from rredcot.method.assign import CreditAssigner
from rredcot.method.registry import TraceInput
from rredcot.settings.config import credit_config, load_config


def batch_gradients(model, tok, gen, rows, cfg, arms, assigners, seed) -> dict[str, torch.Tensor] | None:
    rl, template = cfg["rl"], cfg["prompt"]["template"]
    prompts = [template.format(problem=r["problem"]) for r in rows]
    model.eval()
    groups = gen.generate(
        prompts,
        n=rl["num_generations"],
        temperature=rl["temperature"],
        top_p=1.0,  # as training samples: the whole distribution
        max_new_tokens=rl["max_completion_length"],
        seed=seed,
    )
    items: list[TraceInput] = []
    for row, prompt, group in zip(rows, prompts, groups, strict=True):
        reward = torch.tensor([float(extract_boxed(c.text) == row["true_answer"]) for c in group])
        if reward.std() == 0:
            continue  # no advantage: no gradient, whatever the credit
        advantage = (reward - reward.mean()) / (reward.std() + 1e-4)
        prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        for completion, a in zip(group, advantage.tolist(), strict=True):
            ids = completion.token_ids
            culprit = syn.culprit_offset(row, assigners[arms[0]].completion_text(ids))
            pairs = [(row["solution"] or "", row["answer"])]
            items.append(TraceInput(prompt_ids, ids, a, pairs, culprit=culprit))
    if not items:
        return None  # every group all right or all wrong: GRPO has no gradient here
    multipliers = {}
    for arm in arms:
        if assigners[arm].cfg.kind.uniform:
            multipliers[arm] = [torch.ones(len(it.completion_ids)) for it in items]
        else:
            with torch.no_grad():
                multipliers[arm] = [c.multiplier.float() for c in assigners[arm].assign(model, items)]
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    losses = dict.fromkeys(arms, 0.0)
    for j, it in enumerate(items):
        logits = model(torch.tensor([it.prompt_ids + it.completion_ids])).logits[0]
        logits = logits[len(it.prompt_ids) - 1 : -1] / rl["temperature"]  # as TRL scores the samples
        logp = logits.log_softmax(-1).gather(1, torch.tensor(it.completion_ids)[:, None])[:, 0]
        for arm in arms:  # TRL's "grpo" loss: the sequence mean of advantage x σ·|o| x log p
            losses[arm] = losses[arm] - it.advantage * (multipliers[arm][j] * logp).mean() / len(items)
    out = {}
    for k, arm in enumerate(arms):
        grads = torch.autograd.grad(losses[arm], params, retain_graph=k < len(arms) - 1)
        out[arm] = torch.cat([g.flatten() for g in grads])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", nargs="+", default=["config/config.yaml"])
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True, help="RL split (JSONL) of the synthetic task")
    ap.add_argument("--arms", nargs="+", default=["grpo", "oracle"])
    ap.add_argument("--batches", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    if args.batches < 2:
        ap.error("--batches: at least 2 (the noise is measured across batches)")
    set_threads(args.threads)
    torch.manual_seed(args.seed)
    cfg = load_config(args.config)
    credits = {arm: credit_config(cfg, arm) for arm in args.arms}
    for arm, credit in credits.items():
        if "rollouts" in credit.kind.needs:
            ap.error(f"arm {arm!r} needs Monte Carlo rollouts, which only the trainer samples")
    tok, model = load_tokenizer(args.model), load_model(args.model, "float32")  # as training holds it
    rows = [json.loads(line) for line in open(args.data)]
    random.Random(args.seed).shuffle(rows)
    assigners = {arm: CreditAssigner(tok, credit) for arm, credit in credits.items()}
    gen = HFGenerator(model, tok, batch_size=64)
    per = cfg["rl"]["prompts_per_step"]
    grads, start = [], 0
    while len(grads) < args.batches:
        batch = rows[start : start + per]
        if len(batch) < per:
            ap.error(f"the data ran out after {len(grads)} usable batches")
        g = batch_gradients(model, tok, gen, batch, cfg, args.arms, assigners, start)
        start += per
        if g is None:
            print("a batch without advantages: skipped", flush=True)
            continue
        grads.append(g)
        print(f"batch {len(grads)}/{args.batches}", flush=True)

    def cos(a: torch.Tensor, b: torch.Tensor) -> float:
        return float(torch.nn.functional.cosine_similarity(a, b, dim=0))

    n = len(grads)
    first = args.arms[0]
    head = f"cos(arm, {first})"
    print(f"{'arm':12s} {head:>18s} {'signal share':>13s} {'cos across batches':>19s} {'norm':>8s}")
    for arm in args.arms:
        gs = [g[arm] for g in grads]
        same = sum(cos(g, g0[first]) for g, g0 in zip(gs, grads, strict=True)) / n
        ratio = float(torch.stack(gs).mean(0).norm() ** 2) / (sum(float(g.norm() ** 2) for g in gs) / n)
        share = (ratio - 1 / n) / (1 - 1 / n)
        across = [cos(gs[i], gs[j]) for i in range(n) for j in range(i + 1, n)]
        norm = sum(float(g.norm()) for g in gs) / n
        print(f"{arm:12s} {same:18.3f} {share:13.3f} {sum(across) / len(across):19.3f} {norm:8.4f}")


if __name__ == "__main__":
    main()
