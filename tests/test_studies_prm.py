"""Tests of the PRM study: Qwen2.5-Math-PRM input format and score extraction (on a tiny random
token-classification model that mimics its interface), the local PRM's positions, its training on MC
labels (runs, deterministic by seed, loadable), per-segment rows and Figures 5 and 6."""

from __future__ import annotations

import json
import math

import pytest
import torch
from tiny_models import qwen_config
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2ForTokenClassification

from rredcot.lm.modeling import train_tokenizer
from rredcot.settings.config import validate
from rredcot.studies.figures_attr import prm_nll_figure, prm_rredcot_figure
from rredcot.studies.prm import (
    LOCAL_ANSWER_HINT,
    MAX_BATCH_TOKENS,
    QWEN_SEPARATOR,
    LocalPRMScorer,
    QwenPRMScorer,
    StepScores,
    StepTrace,
    load_scorer,
    local_positions,
    prm_rows,
    problem_text,
    qwen_prm_text,
    score_traces,
    step_trace,
)
from rredcot.studies.prm_train import PRMTrainConfig, build_examples, fit, roc_auc, split_by_problem

CHAT = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PROMPT_CFG = {"style": "template", "template": "Problem: {problem}\n<think>\n"}
LINES = ["First, 3 + 4 = 7.\n", "Next, 7 * 2 = 4.\n", "Wait, 7 * 2 = 14, so 4.\n", "So the result is 4.\n"]


def _train_cfg(seed: int = 0, **prm: object) -> PRMTrainConfig:
    """The PRM training settings of the config, with ``prm`` (studies.prm keys) and ``seed`` changed."""
    return PRMTrainConfig.from_config(validate({"studies": {"seed": seed, "prm": prm}})["studies"])


def _config(vocab: int, **kw: int) -> Qwen2Config:
    return qwen_config(vocab, max_positions=256, **kw)


@pytest.fixture(scope="module")
def tok():  # noqa: ANN201
    texts = [
        f"Problem: Start at {i}, add 4, times 2. Work mod 10.\n<think>\n" + "".join(LINES) for i in range(10)
    ]
    tokenizer = train_tokenizer(texts + ["Answer: 4\n</think>\n \\boxed{4}"], 160)
    tokenizer.add_tokens([QWEN_SEPARATOR, "<|im_start|>", "<|im_end|>"], special_tokens=True)
    tokenizer.chat_template = CHAT
    tokenizer.padding_side = "right"
    return tokenizer


@pytest.fixture(scope="module")
def classifier(tok) -> Qwen2ForTokenClassification:  # noqa: ANN001
    torch.manual_seed(0)
    return Qwen2ForTokenClassification(_config(len(tok), num_labels=2)).eval()


def _step_trace(tok, problem: str = "Start at 3, add 4, times 2. Work mod 10.") -> StepTrace:  # noqa: ANN001
    return StepTrace(
        problem=problem,
        answer="4",
        steps=LINES[:3],
        prompt_ids=tok(f"Problem: {problem}\n<think>\n")["input_ids"],
        step_ids=[tok(line)["input_ids"] for line in LINES[:3]],
    )


def test_qwen_prm_text_places_one_separator_after_every_step(tok) -> None:  # noqa: ANN001
    text = qwen_prm_text(
        tok, "What is 2 + 2?", [" Step one.\n", f"Step {QWEN_SEPARATOR}two.", "Step three.\n\n"]
    )
    assert text == (
        "<|im_start|>system\nPlease reason step by step, and put your final answer within \\boxed{}."
        "<|im_end|>\n"
        "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n"
        "<|im_start|>assistant\nStep one.<extra_0>Step two.<extra_0>Step three.<extra_0><|im_end|>\n"
    )
    scorer = QwenPRMScorer(torch.nn.Linear(1, 1), tok, MAX_BATCH_TOKENS)
    ids = scorer.encode(_step_trace(tok))
    seps = [p for p, t in enumerate(ids) if t == scorer.sep_id]
    assert len(seps) == 3
    # The text between separators is each step, stripped: the separator closes its step.
    bounds = [ids.index(tok.convert_tokens_to_ids("<|im_start|>"), 3) + 3, *[p + 1 for p in seps[:-1]]]
    pieces = [tok.decode(ids[a:b]) for a, b in zip(bounds, seps, strict=True)]
    assert pieces[1:] == [LINES[1].strip(), LINES[2].strip()]
    assert pieces[0].endswith(LINES[0].strip())
    hinted = tok.decode(scorer.encode(_step_trace(tok), given_answer=True))
    assert "The correct final answer is \\boxed{4}.<|im_end|>" in hinted


@pytest.mark.numerics
def test_qwen_prm_scores_are_positive_probabilities_at_separators(tok, classifier) -> None:  # noqa: ANN001
    scorer = QwenPRMScorer(classifier, tok, max_batch_tokens=64)  # small budget: one trace per batch
    traces = [_step_trace(tok), _step_trace(tok, "Start at 9, times 3. Work mod 10.")]
    batched = QwenPRMScorer(classifier, tok, MAX_BATCH_TOKENS).score(traces)
    assert [len(s.steps) for s in scorer.score(traces)] == [3, 3]
    for trace, got in zip(traces, batched, strict=True):
        ids = scorer.encode(trace)
        with torch.no_grad():
            logits = classifier(input_ids=torch.tensor([ids])).logits[0]
        expected = torch.softmax(logits, -1)[torch.tensor(ids) == scorer.sep_id, 1]
        assert got.prefix is None
        assert got.steps == pytest.approx(expected.tolist(), abs=1e-5)
        assert all(0 < p < 1 for p in got.steps)


def test_qwen_prm_loads_from_a_directory(tok, classifier, tmp_path) -> None:  # noqa: ANN001
    classifier.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    scorer = load_scorer("qwen-prm", str(tmp_path), "float32", MAX_BATCH_TOKENS)
    assert isinstance(scorer, QwenPRMScorer)
    trace = _step_trace(tok)
    assert scorer.score([trace])[0].steps == pytest.approx(
        QwenPRMScorer(classifier, tok, MAX_BATCH_TOKENS).score([trace])[0].steps
    )


@pytest.mark.numerics
def test_local_scorer_reads_prompt_end_and_step_ends(tok, classifier) -> None:  # noqa: ANN001
    assert local_positions(5, [3, 1, 4]) == [4, 7, 8, 12]
    trace = _step_trace(tok)
    scorer = LocalPRMScorer(classifier, tok, LOCAL_ANSWER_HINT, MAX_BATCH_TOKENS)
    plain, given = scorer.score([trace])[0], scorer.score([trace], given_answer=True)[0]
    ids = trace.prompt_ids + [t for s in trace.step_ids for t in s]
    with torch.no_grad():
        probs = torch.softmax(classifier(input_ids=torch.tensor([ids])).logits[0], -1)[:, 1]
    pos = local_positions(len(trace.prompt_ids), [len(s) for s in trace.step_ids])
    assert [plain.prefix, *plain.steps] == pytest.approx(probs[pos].tolist(), abs=1e-5)
    assert len(given.steps) == 3 and given.steps != plain.steps  # the answer in front changes every score


def _traces_and_mc(tok, n: int = 8) -> tuple[list[dict], list[dict]]:  # noqa: ANN001
    """Traces of 2-3 thinking segments; MC values rise on correct traces and fall on wrong ones."""
    traces, mc = [], []
    for i in range(n):
        lines = LINES[: 2 + i % 2]
        prompt = f"Problem: Start at {i}, add 4, times 2. Work mod 10.\n<think>\n"
        completion, cuts = [], []
        for line in lines:
            cuts.append(len(completion))
            completion += tok(line)["input_ids"]
        cuts.append(len(completion))
        completion += tok("</think>\n \\boxed{4}")["input_ids"]
        correct = i % 3 != 0
        values = [0.5 + (0.5 if correct else -0.5) * j / (len(cuts) - 1) for j in range(len(cuts))]
        traces.append(
            {
                "trace_id": f"t{i}",
                "problem_id": f"p{i}",
                "level": 2 + i % 2,
                "correct": correct,
                "prompt": prompt,
                "answer": "4",
                "prompt_ids": tok(prompt)["input_ids"],
                "completion_ids": completion,
                "tokens": [tok.decode([t]) for t in completion],
                "cuts": cuts,
                "thought_nll": [10.0 - j for j in range(len(cuts))],
                "answer_nll": [2.0 + (j if not correct else -0.3 * j) for j in range(len(cuts))],
                "segment_rewards": [0.2 * (1 if correct else -1)] * (len(cuts) - 1) + [0.0],
            }
        )
        mc += [
            {"trace_id": f"t{i}", "exit_index": j, "mc_value": v, "rollouts": [{}] * 4}
            for j, v in enumerate(values)
        ]
    return traces, mc


@pytest.fixture(scope="module")
def sft_dir(tok, tmp_path_factory):  # noqa: ANN001, ANN201
    path = tmp_path_factory.mktemp("sft")
    torch.manual_seed(1)
    Qwen2ForCausalLM(_config(len(tok), tie_word_embeddings=True)).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_examples_split_and_auc(tok) -> None:  # noqa: ANN001
    traces, mc = _traces_and_mc(tok)
    cfg = _train_cfg(label="hard")
    examples, skipped = build_examples(traces, mc[:-1], lambda s: tok(s)["input_ids"], cfg)
    assert skipped == 1 and len(examples) == 2 * 7  # the last trace lacks one MC value; two copies each
    assert examples[0].targets == [1.0, 0.0, 0.0]  # hard labels: 1[m >= 0.5]
    assert len(examples[0].positions) == len(examples[0].targets)
    train, val = split_by_problem(examples, 0.3, seed=0)
    assert {e.problem_id for e in train}.isdisjoint({e.problem_id for e in val}) and val
    assert roc_auc([0.1, 0.4, 0.35, 0.8], [False, False, True, True]) == 0.75
    assert math.isnan(roc_auc([0.1, 0.2], [True, True]))


def test_prm_training_runs_and_is_deterministic_by_seed(tok, sft_dir, tmp_path) -> None:  # noqa: ANN001
    traces, mc = _traces_and_mc(tok)
    cfg = _train_cfg(epochs=2, batch_size=4, val_fraction=0.25, seed=3)
    model_a, _, summary_a = fit(sft_dir, traces, mc, cfg, progress=False)
    model_b, _, summary_b = fit(sft_dir, traces, mc, cfg, progress=False)
    _, _, summary_c = fit(sft_dir, traces, mc, _train_cfg(epochs=2, batch_size=4, seed=4), progress=False)
    assert summary_a["epoch_losses"] == summary_b["epoch_losses"]
    assert summary_a["metrics"] == summary_b["metrics"]
    assert summary_a["epoch_losses"] != summary_c["epoch_losses"]
    for name, param in model_a.state_dict().items():
        assert torch.equal(param, model_b.state_dict()[name]), name
    metrics = summary_a["metrics"]
    assert 0.0 <= metrics["val_plain/accuracy"] <= 1.0 and "val_given_answer/auc" in metrics
    assert summary_a["n_train_examples"] + summary_a["n_val_examples"] == 2 * len(traces)
    # The saved directory is what `study-prm --kind local` loads.
    model_a.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    (tmp_path / "prm.json").write_text(json.dumps(summary_a))
    scorer = load_scorer("local", str(tmp_path), "float32", MAX_BATCH_TOKENS)
    lines = score_traces(scorer, traces, PROMPT_CFG, "local")
    assert len(lines) == sum(len(t["cuts"]) - 1 for t in traces)
    assert all(0 < r["prm_score"] < 1 and r["prm_delta"] is not None for r in lines)


def test_step_trace_and_rows(tok) -> None:  # noqa: ANN001
    traces, _ = _traces_and_mc(tok, 2)
    st = step_trace(traces[1], PROMPT_CFG)
    assert st.problem == "Start at 1, add 4, times 2. Work mod 10."
    assert st.steps == LINES[:3]
    assert problem_text({"prompt": "no template here"}, PROMPT_CFG) == "no template here"
    rows = prm_rows(
        traces[1], StepScores([0.6, 0.2, 0.9]), StepScores([0.7, 0.8, 0.9], prefix=0.5), "qwen-prm"
    )
    assert [r["prm_delta"] for r in rows] == pytest.approx([None, -0.4, 0.7])
    assert [r["prm_delta_given_answer"] for r in rows] == pytest.approx([0.2, 0.1, 0.1])
    assert [r["d_thought_nll"] for r in rows] == [-1.0, -1.0, -1.0]
    assert [r["rredcot"] for r in rows] == [0.2, 0.2, 0.2]  # the answer segment's reward is left out


def test_prm_figures_written(tmp_path) -> None:  # noqa: ANN001
    rows = []
    for i in range(60):
        p = (i % 17) / 17
        rows.append(
            {
                "trace_id": f"t{i // 4}",
                "problem_id": f"p{i // 8}",
                "correct": i % 3 != 0,
                "prm_score": p,
                "prm_delta": None if i % 4 == 0 else p - 0.5,
                "prm_score_given_answer": 1 - p,
                "prm_delta_given_answer": 0.5 - p,
                "rredcot": 2 * p - 1 + 0.1 * (i % 5),
                "d_thought_nll": -p,
                "d_answer_nll": (i % 7) / 7,
            }
        )
    paths = prm_nll_figure(rows, tmp_path, "tiny PRM") + prm_rredcot_figure(rows, tmp_path, "tiny PRM")
    names = {p.name for p in paths}
    for stem in ("fig5_prm_vs_nll", "fig6_prm_vs_rredcot"):
        assert {f"{stem}.png", f"{stem}.pdf", f"{stem}.csv"} <= names
    assert all(p.stat().st_size > 0 for p in paths)
    table = (tmp_path / "fig5_prm_vs_nll.csv").read_text().splitlines()
    assert len(table) == 1 + 2 * 2 * 2  # as is / given the answer × score / change × two NLLs
