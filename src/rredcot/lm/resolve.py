"""A label check that asks a model: re-solve each problem and flag rows whose label most samples
disagree with (the cleaner's optional ``resolve_model``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rredcot.data.cleaning import Resolver, final_answer, majority_resolver
from rredcot.lm.modeling import load_model, load_tokenizer


def model_resolver(
    model_dir: str | Path,
    k: int,
    max_new_tokens: int,
    temperature: float = 0.7,
    prompt_template: str | None = None,
) -> Resolver:
    """Re-solve each problem with ``k`` samples (``clean.resolve_samples``) of up to ``max_new_tokens``
    tokens (``clean.resolve_max_new_tokens``) from a (strong) causal LM; flag when most disagree.

    The prompt is ``prompt_template`` with ``{problem}`` filled in, else the tokenizer's chat template
    with a "final answer in \\boxed{}" instruction. Heavy imports happen here, not at module import.
    """
    import torch

    tokenizer, model = load_tokenizer(model_dir), load_model(model_dir, "float32").eval()

    def prompt(problem: str) -> str:
        if prompt_template is not None:
            return prompt_template.replace("{problem}", problem)
        request = f"{problem}\nPlease reason step by step, and put your final answer within \\boxed{{}}."
        if tokenizer.chat_template:
            messages = [{"role": "user", "content": request}]
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return f"Problem: {request}\nSolution:"

    def sampled_answers(row: dict[str, Any]) -> list[str | None]:
        inputs = tokenizer(prompt(str(row.get("problem", ""))), return_tensors="pt")
        with torch.no_grad():
            output = model.generate(
                **inputs,
                do_sample=True,
                temperature=temperature,
                num_return_sequences=k,
                max_new_tokens=max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
            )
        texts = tokenizer.batch_decode(output[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
        return [final_answer(text) for text in texts]

    sampled_answers.__name__ = f"{Path(model_dir).name}_x{k}"
    return majority_resolver(sampled_answers)


# --- text checks -------------------------------------------------------------------------------
