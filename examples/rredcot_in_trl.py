"""A plain TRL GRPO script turned into RREDCoT: the lines marked ``# RREDCoT`` are all that changes.

Run it as it is (a tiny Qwen2 model and tokenizer built on the spot, nothing downloaded, two
training steps on a CPU in well under a minute)::

    python examples/rredcot_in_trl.py

To get the plain GRPO script back, import ``GRPOTrainer`` from ``trl`` instead of the marked import,
construct it instead of ``RREDCoTTrainer`` and drop the ``credit=`` argument (docs/library.md,
"RREDCoT in a TRL GRPO script"). The dataset already has what RREDCoT reads: ``answer``, the
reference answer (the reward function reads it too); an optional ``reference`` column holds a
reference solution to score at each exit point.
"""

import tempfile

import torch
from datasets import Dataset
from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from trl import GRPOConfig

from rredcot import CreditConfig, RREDCoTTrainer  # RREDCoT (was: from trl import GRPOTrainer)

# A character-level tokenizer and a two-layer Qwen2 model with random weights, built here.
CHARS = "0123456789+-*=?. abcdefghijklmnopqrstuvwxyz{}\\<>/\n"
vocab = {c: i for i, c in enumerate(CHARS)} | {"<unk>": len(CHARS), "<eos>": len(CHARS) + 1}
backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))  # no merges: one token a character
backend.decoder = decoders.Fuse()
tokenizer = PreTrainedTokenizerFast(
    tokenizer_object=backend,
    eos_token="<eos>",
    pad_token="<eos>",
    model_input_names=["input_ids", "attention_mask"],
)
tokenizer.padding_side = "left"
torch.manual_seed(0)
config = Qwen2Config(
    vocab_size=len(vocab),
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    eos_token_id=tokenizer.eos_token_id,
    pad_token_id=tokenizer.pad_token_id,
)
model = Qwen2ForCausalLM(config)

# Prompts that open a thinking block; the completion thinks, closes it and writes \boxed{answer}.
problems = [("2+3", "5"), ("4*2", "8"), ("9-6", "3"), ("7+0", "7")]
dataset = Dataset.from_list(
    [{"prompt": f"what is {q}? answer in \\boxed{{}}.\n<think>\n", "answer": a} for q, a in problems]
)


def reward(completions, answer, **kwargs):
    """1 when the completion writes the answer, else 0."""
    return [float(a in c) for c, a in zip(completions, answer, strict=True)]


args = GRPOConfig(
    output_dir=tempfile.mkdtemp(),
    # Each trace's token mean, the loss RREDCoT's σ is defined under: a trace's loss is Σ_t σ_t ℓ_t.
    # TRL's default is "dapo" (every token of the batch alike), under which σ·|o| still moves weight
    # between a trace's tokens but a trace weighs by its length (docs/library.md, "The loss type").
    loss_type="grpo",
    per_device_train_batch_size=8,
    num_generations=4,
    max_completion_length=24,
    max_steps=2,
    learning_rate=1e-3,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
    use_cpu=True,
    seed=0,
)
trainer = RREDCoTTrainer(  # RREDCoT (was: GRPOTrainer)
    model=model,
    reward_funcs=reward,
    args=args,
    train_dataset=dataset,
    processing_class=tokenizer,
    credit=CreditConfig(method="rredcot"),  # RREDCoT: the credit method and its settings
)
trainer.train()

for entry in trainer.state.log_history:
    if "credit/traces" in entry:
        print(f"step {entry['step']}: credit assigned to {entry['credit/traces']:.0f} traces")
