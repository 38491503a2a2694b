"""RREDCoTTrainer on a tiny real model: uniform credit is stock GRPO bit for bit; rredcot moves credit."""

from __future__ import annotations

import copy
import dataclasses
import re

import pytest
import torch
from datasets import Dataset
from numerics import assert_same_credit, float32_tol, log_prob_sum_tol, model_terms
from trl import GRPOTrainer

from rredcot.adapter.experiment import grpo_args
from rredcot.adapter.trainer import CreditConfig, RREDCoTTrainer
from rredcot.data.records import correctness_reward, rl_records
from rredcot.data.synthetic import TaskConfig, generate_splits
from rredcot.lm.modeling import build_scratch_model, train_tokenizer
from rredcot.method.assign import CreditAssigner
from rredcot.method.registry import TraceInput
from rredcot.method.segmentation import find_text, thinking_end
from rredcot.settings.config import Tracking, credit_config, load_config, validate

CONFIG = "config/config.yaml"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    cfg = load_config(
        CONFIG,
        {
            "rl": {"prompts_per_step": 2, "num_generations": 4, "max_completion_length": 40, "max_steps": 1},
            "credit": {"segmentation": {"n_segments": 4}},
        },
    )
    splits = generate_splits(TaskConfig(n_sft=300, n_rl=40, n_test=10, seed=3, teacher_error_rate=0.2))
    template = cfg["prompt"]["template"]
    corpus = [template.replace("{problem}", r["problem"]) + r["completion"] for r in splits["sft"]]
    tok = train_tokenizer(corpus, 300)
    tok.padding_side = "left"
    model = build_scratch_model(
        tok,
        {
            **cfg["model"],
            "hidden_size": 32,
            "num_layers": 2,
            "num_heads": 2,
            "num_kv_heads": 1,
            "intermediate_size": 64,
        },
        seed=0,
    )
    dataset = Dataset.from_list(rl_records(splits["rl"], template))
    return cfg, tok, model, dataset, tmp_path_factory.mktemp("trainer")


def length_reward(completions, **_):
    """A dense reward, so that a random tiny model still gets non-zero advantages."""
    return [1.0 / (1 + len(c)) for c in completions]


def _trainer(setup, name: str, credit: CreditConfig, arm: str = "grpo", dataset=None, cfg=None, **extra):
    """An RREDCoTTrainer on a copy of the setup's model, with the length reward."""
    setup_cfg, tok, model, setup_dataset, out = setup
    return RREDCoTTrainer(
        model=copy.deepcopy(model),
        reward_funcs=[length_reward],
        args=grpo_args(cfg or setup_cfg, arm, 0, out / name),
        train_dataset=setup_dataset if dataset is None else dataset,
        processing_class=tok,
        credit=credit,
        **extra,
    )


# TRL 1.16's loss types (GRPOConfig.loss_type); test_every_trl_loss_type_is_covered guards the list.
LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]


def test_every_trl_loss_type_is_covered():
    from trl import GRPOConfig

    help_text = GRPOConfig.__dataclass_fields__["loss_type"].metadata["help"]
    documented = help_text.split("Supported values are ", 1)[1].split(".")[0]
    assert set(re.findall(r"'(\w+)'", documented)) == set(LOSS_TYPES)


def _train_params(cls, cfg, tok, model, dataset, out, args, **extra):
    """Parameters after a few optimizer steps of ``cls``, everything else equal."""
    trainer = cls(
        model=copy.deepcopy(model),
        reward_funcs=[length_reward, correctness_reward],
        args=args,
        train_dataset=dataset,
        processing_class=tok,
        **extra,
    )
    trainer.train()
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}, trainer


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_uniform_credit_is_stock_grpo_bit_for_bit(setup, loss_type, level):
    """Three optimizer steps, the second and third reusing a generation batch (importance ratios
    away from 1): the parameters of RREDCoTTrainer(uniform) and GRPOTrainer are identical."""
    cfg, tok, model, dataset, out = setup
    base = grpo_args(cfg, "grpo", 0, out / f"{loss_type}-{level}")
    args = dataclasses.replace(
        base,
        loss_type=loss_type,
        importance_sampling_level=level,
        max_steps=3,
        num_iterations=2,
        save_strategy="no",
        disable_tqdm=True,
        generation_batch_size=None,  # derived again by GRPOConfig
        steps_per_generation=None,
    )
    stock, _ = _train_params(GRPOTrainer, cfg, tok, model, dataset, out, args)
    ours, trainer = _train_params(
        RREDCoTTrainer, cfg, tok, model, dataset, out, args, credit=CreditConfig(method="uniform")
    )
    start = dict(model.named_parameters())
    assert any(not torch.equal(stock[n], start[n]) for n in stock), "training must move the weights"
    assert stock.keys() == ours.keys()
    for name in stock:
        assert torch.equal(stock[name], ours[name]), name
    assert "credit/traces" not in trainer._metrics["train"]


def test_paired_sampling_draws_each_generation_batch_from_a_stream_of_its_own(setup):
    """With a sampling seed, what a step samples depends on (seed, step, batch of the step) only, not
    on the random state before it: two runs (arms) of one seed draw the same noise at every step."""
    cfg, tok, model, dataset, out = setup
    inputs = [dataset[i] for i in range(8)]

    def draw(sampling_seed, history: int, step: int = 3, calls: int = 1) -> list[torch.Tensor]:
        trainer = _trainer(setup, "paired", CreditConfig(method="uniform"), sampling_seed=sampling_seed)
        trainer.model.train()
        trainer.state.global_step = step
        torch.manual_seed(history)  # whatever was drawn before this step
        return [trainer._generate_and_score_completions(inputs)["completion_ids"] for _ in range(calls)]

    (first,) = draw(7, history=1)
    assert torch.equal(first, draw(7, history=2)[0])
    again = draw(7, history=1, calls=2)
    assert torch.equal(again[0], first) and not torch.equal(again[1], first)  # the step's next batch
    assert not torch.equal(draw(7, history=1, step=4)[0], first)
    assert not torch.equal(draw(8, history=1)[0], first)
    assert not torch.equal(draw(None, history=1)[0], draw(None, history=2)[0])  # TRL's own stream


def test_rredcot_redistributes_within_each_trace(setup):
    cfg, tok, model, dataset, out = setup
    trainer = _trainer(setup, "c", credit_config(cfg, "rredcot"), arm="rredcot")
    inputs = [dataset[i] for i in range(8)]
    torch.manual_seed(99)
    trainer.model.train()  # as in TRL's training loop: evaluation batches get no credit
    batch = trainer._generate_and_score_completions(inputs)
    adv = batch["advantages"]
    mask = batch["completion_mask"].bool()
    assert adv.shape == mask.shape
    moved = 0
    for i in range(adv.shape[0]):
        row, m = adv[i][mask[i]], mask[i].sum()
        if m == 0:
            continue
        a = row.mean()  # σ sums to 1, so the mean per-token advantage equals the sequence advantage
        if a.abs() < 1e-8:
            assert torch.all(row == 0)
            continue
        factor = row / a
        assert torch.isfinite(factor).all() and (factor >= -1e-6).all()
        assert torch.allclose(factor.sum(), m.to(factor.dtype), rtol=1e-4)
        moved += int(not torch.allclose(factor, torch.ones_like(factor)))
    assert moved > 0, "rredcot credit should be non-uniform on at least one trace"
    assert trainer._metrics["train"]["credit/traces"][-1] > 0


def test_credit_config_rejects_unknown_method():
    with pytest.raises(ValueError, match="unknown credit method"):
        CreditConfig(method="magic")


def _arm(credit: str) -> dict:
    """A validated arm of the credit method ``credit`` (every other setting at its default)."""
    return validate({"arms": {"any": {"credit": credit}}})["arms"]["any"]


def _credit_batch(setup, arm: str, seed: int = 99, **options):
    cfg, tok, model, dataset, out = setup
    method = arm.replace("_", "+")
    cfg = {**cfg, "arms": {**cfg["arms"], arm: {**cfg["arms"].get(arm, _arm(method)), "credit": method}}}
    credit = credit_config(cfg, arm)
    for key, value in options.items():
        setattr(credit, key, value)
    uniform = {**cfg, "arms": {**cfg["arms"], arm: _arm("uniform")}}
    trainer = _trainer(setup, arm, credit, arm=arm, cfg=uniform)
    torch.manual_seed(seed)
    trainer.model.train()  # as in TRL's training loop: evaluation batches get no credit
    return trainer, trainer._generate_and_score_completions([dataset[i] for i in range(8)])


def _factors(batch) -> list[torch.Tensor]:
    """σ·|o| per trace with a non-zero advantage (per-token advantage / sequence advantage)."""
    adv, mask = batch["advantages"], batch["completion_mask"].bool()
    rows = []
    for i in range(adv.shape[0]):
        row = adv[i][mask[i]]
        if row.numel() and row.mean().abs() > 1e-8:
            rows.append(row / row.mean())
    return rows


@pytest.mark.parametrize("method", ["entropy", "rredcot_entropy"])
def test_every_credit_method_gives_a_distribution(setup, method):
    trainer, batch = _credit_batch(setup, method)
    factors = _factors(batch)
    assert factors
    for f in factors:
        assert torch.isfinite(f).all() and (f >= -1e-6).all()
        torch.testing.assert_close(
            f.sum(), torch.tensor(float(f.numel()), dtype=f.dtype), rtol=1e-4, atol=1e-4
        )
    assert any(not torch.allclose(f, torch.ones_like(f)) for f in factors)
    assert trainer._metrics["train"]["credit/traces"][-1] == len(factors)


@pytest.mark.numerics
def test_single_pass_and_naive_scorers_give_the_same_credit(setup, monkeypatch):
    calls = []  # (assigner, traces, credits) of each scorer
    assign = CreditAssigner.assign

    def recorded(self, policy, items, *rest):
        credits = assign(self, policy, items, *rest)
        calls.append((self, items, credits))
        return credits

    monkeypatch.setattr(CreditAssigner, "assign", recorded)
    trainer, single = _credit_batch(setup, "rredcot", scorer="single_pass")
    _, naive = _credit_batch(setup, "rredcot", scorer="naive")
    assert torch.equal(single["completion_ids"], naive["completion_ids"])
    (assigner, items, reference), (_, _, other) = calls
    cfg = assigner.cfg
    # n: sequences of prompt ⊕ completion ⊕ the longest exit suffix; a sum scores a solution or answer.
    pairs = [len(assigner.encode(s)) + len(assigner.encode(a)) for t in items for s, a in t.pairs]
    suffix = sum(len(assigner.encode(x)) for x in (cfg.exit_string, cfg.answer_prefix, cfg.answer_suffix))
    seq_len = max(len(t.prompt_ids) + len(t.completion_ids) for t in items) + suffix + max(pairs)
    scores = log_prob_sum_tol(model_terms(trainer.model, seq_len), max(pairs))
    bound = 0.0
    for item, ref, got in zip(items, reference, other, strict=True):
        sigma_bound = assert_same_credit(got, ref, item.advantage, cfg.mix, scores)
        bound = max(bound, abs(item.advantage) * float(sigma_bound.max()))
    # The advantages are each trace's advantage times its σ·|o| (float32).
    torch.testing.assert_close(single["advantages"], naive["advantages"], atol=bound, rtol=float32_tol(1))


def test_group_pairs_reference_value_model_and_views(setup):
    trainer, batch = _credit_batch(
        setup, "rredcot", group_pairs=True, value_model="reference", view_every=1, view_samples=3
    )
    assert trainer._value_model is not None and not any(
        p.requires_grad for p in trainer._value_model.parameters()
    )
    factors = _factors(batch)
    assert factors and all(torch.isfinite(f).all() for f in factors)
    views = trainer.credit_views
    assert 1 <= len(views) <= 3
    for v in views:
        n = len(v["tokens"])
        assert len(v["sigma"]) == n and abs(sum(v["sigma"]) - 1.0) < 1e-5
        # K thinking segments have K+1 exits; an answer segment after the model's own exit adds none.
        assert v["cuts"][0] == 0 and len(v["cuts"]) - len(v["segment_starts"]) in (0, 1)
        assert len(v["log_values"]) == len(v["cuts"]) == len(v["thought_nll"]) == len(v["answer_nll"])
        assert len(v["entropies"]) == n and v["method"] == "rredcot"


def test_final_solution_extraction(setup):
    trainer, _ = _credit_batch(setup, "rredcot")
    assert trainer.assigner.final_solution("a\n</think>\n1+2=3. \\boxed{3}") == ("1+2=3.", "3")
    assert trainer.assigner.final_solution("no exit \\boxed{3}") is None
    assert trainer.assigner.final_solution("x</think>\nno box") is None


WRONG_TRACE = "First, 9 * 2 = 8.\nFinally, 8 + 6 = 5.\n</think>\n9 * 2 = 8, 8 + 6 = 5. \\boxed{5}"


def _assign(setup, completion: str, advantage: float = -1.0, **options):
    cfg, tok, model, _, _ = setup
    credit = credit_config(cfg, "rredcot")
    for key, value in options.items():
        setattr(credit, key, value)
    assigner = CreditAssigner(tok, credit)
    prompt = assigner.encode("Problem: Start at 9, times 2, add 6. Work mod 10.\n<think>\n")
    ids = assigner.encode(completion) + [tok.eos_token_id]
    item = TraceInput(prompt, ids, advantage, [("9 * 2 = 8, 8 + 6 = 4.", "4")])
    model.eval()
    (out,) = assigner.assign(model, [item])
    return assigner, ids, out


@pytest.mark.parametrize("scorer", ["single_pass", "naive"])
def test_exit_points_stop_at_the_models_own_exit(setup, scorer):
    assigner, ids, out = _assign(setup, WRONG_TRACE, scorer=scorer)
    texts = assigner.token_texts(ids)
    end = thinking_end(texts, "</think>\n")
    assert end is not None and "".join(texts[end:]).startswith("</think>")
    # Every exit lies in the thinking part, the last one exactly where the model exits ...
    assert out.cuts[-1] == end and all(c <= end for c in out.cuts)
    assert len(out.cuts) >= 2 and out.log_values.numel() == len(out.cuts)
    # ... and the answer is one more segment, rewarded by how well the model's own final solution
    # leads to the reference answer compared with the reference solution at the same exit.
    assert out.segment_starts[-1] == end and len(out.segment_starts) == len(out.cuts)
    assert out.answer_reward is not None
    assert torch.isclose(out.multiplier.sum(), torch.tensor(float(len(ids))), rtol=1e-5)
    # Its share follows from its reward like any other segment's: blame (advantage < 0) only when
    # the reward is negative, and then it gets more than the uniform share.
    mix = assigner.cfg.mix
    answer = out.multiplier[end:]
    assert torch.allclose(answer, answer[:1].expand_as(answer))
    if out.answer_reward >= 0:
        assert torch.allclose(answer, torch.full_like(answer, 1 - mix))
    else:
        assert float(answer[0]) > 1 - mix


def test_answer_reward_is_own_minus_reference_answer_log_prob(setup):
    """r̂ of the answer segment, recomputed from naive teacher forcing of the two sequences."""
    from rredcot.method.scoring.naive import score_exit_points

    cfg, tok, model, _, _ = setup
    assigner, ids, out = _assign(setup, WRONG_TRACE, scorer="single_pass", answer_baseline="reference")
    texts = assigner.token_texts(ids)
    end = thinking_end(texts, "</think>\n")
    box = assigner.encode(" \\boxed{")
    own_cut = find_text(texts, "\\boxed{", start=end, last=True)
    prompt = assigner.encode("Problem: Start at 9, times 2, add 6. Work mod 10.\n<think>\n")
    answer, close = assigner.encode("4"), assigner.encode("}")
    own = score_exit_points(model, prompt, ids, [own_cut], [], answer, [], box, close)
    ref = score_exit_points(
        model,
        prompt,
        ids,
        [end],
        assigner.encode("9 * 2 = 8, 8 + 6 = 4."),
        answer,
        assigner.encode("</think>\n"),
        box,
        close,
    )
    expected = float(own.log_p_answer[0] - ref.log_p_answer[0])
    assert out.answer_reward == pytest.approx(expected, abs=1e-4)


def _greedy(model, ids: list[int], n: int) -> list[int]:
    """n greedy tokens after ids, one full forward pass per token."""
    out = []
    with torch.no_grad():
        for _ in range(n):
            out.append(int(model(torch.tensor([ids + out])).logits[0, -1].argmax()))
    return out


def _answer_log_prob(model, ids: list[int], answer: list[int]) -> float:
    """log p(answer | ids), teacher-forced."""
    with torch.no_grad():
        log_p = torch.log_softmax(model(torch.tensor([ids + answer])).logits[0], dim=-1)
    return sum(float(log_p[len(ids) + j - 1, t]) for j, t in enumerate(answer))


def test_greedy_answer_baseline_is_the_solution_the_model_would_write(setup):
    """r̂ = log p(y | own solution) - log p(y | greedy solution), both after the model's own exit;
    a final solution that is the model's greedy one gets exactly 0."""
    cfg, tok, model, _, _ = setup
    assigner, ids, out = _assign(setup, WRONG_TRACE, answer_baseline="greedy")
    texts = assigner.token_texts(ids)
    head_end = find_text(texts, ">", start=thinking_end(texts, "</think>\n")) + 1  # after "</think>"
    prompt = assigner.encode("Problem: Start at 9, times 2, add 6. Work mod 10.\n<think>\n")
    box, answer = assigner.encode(" \\boxed{"), assigner.encode("4")
    own_cut = find_text(texts, "\\boxed{", start=head_end, last=True)
    own = _answer_log_prob(model, prompt + ids[:own_cut] + box, answer)
    # The untrained model never writes "\boxed{" or EOS: its greedy solution runs to the limit,
    # twice the own solution plus 8 tokens, and the answer is forced after it.
    greedy = _greedy(model, prompt + ids[:head_end], 2 * (own_cut - head_end) + 8)
    assert tok.eos_token_id not in greedy and "\\boxed{" not in "".join(assigner.token_texts(greedy))
    baseline = _answer_log_prob(model, prompt + ids[:head_end] + greedy + box, answer)
    assert out.answer_reward == pytest.approx(own - baseline, abs=1e-4)

    # Make the model's own greedy choice the end of its solution: with the answer prefix set to the
    # text of its i-th greedy token, the greedy solution is its first i tokens (none, for this
    # untrained model, which repeats one token), and a trace that writes exactly those is faithful.
    first = _greedy(model, prompt + ids[:head_end], 12)
    # No EOS after the answer: the text of this tokenizer's EOS holds ">", the untrained model's token.
    close, eos = assigner.encode("}"), []
    tail = "".join(assigner.token_texts(answer + close))
    i, needle = next(
        (i, t)
        for i, t in enumerate(assigner.token_texts(first))
        if t and t.strip() == t and t not in tail and t not in "".join(assigner.token_texts(first[:i]))
    )
    prefix = assigner.encode(needle)
    faithful = ids[:head_end] + first[: i + 1] + answer + close + eos
    credit = credit_config(cfg, "rredcot")
    credit.answer_prefix, credit.answer_baseline = needle, "greedy"
    (out,) = CreditAssigner(tok, credit).assign(model, [TraceInput(prompt, faithful, -1.0, [("x", "4")])])
    assert out.baseline_solution == first[:i] and out.answer_reward == 0.0
    # A solution off the greedy path (one more token) is judged against it.
    slip = assigner.encode("7")
    slipped = ids[:head_end] + first[:i] + slip + [first[i]] + answer + close + eos
    (out,) = CreditAssigner(tok, credit).assign(model, [TraceInput(prompt, slipped, -1.0, [("x", "4")])])
    own = _answer_log_prob(model, prompt + ids[:head_end] + first[:i] + slip + prefix, answer)
    baseline = _answer_log_prob(model, prompt + ids[:head_end] + first[:i] + prefix, answer)
    assert out.baseline_solution == first[:i] and out.answer_reward == pytest.approx(own - baseline, abs=1e-4)
    assert out.answer_reward != 0.0


def test_a_trace_that_exits_at_once_gets_uniform_credit(setup):
    _, ids, out = _assign(setup, "</think>\n8 + 6 = 4. \\boxed{4}", advantage=1.0)
    assert out.cuts == [0] and out.segment_starts == [0] and out.answer_reward is not None
    assert torch.equal(out.multiplier, torch.ones(len(ids)))  # one segment: nothing to redistribute


def test_a_trace_without_an_exit_is_scored_to_its_end(setup):
    assigner, ids, out = _assign(setup, "First, 9 * 2 = 8.\nFinally, 8 + 6 = 5.\n")
    assert thinking_end(assigner.token_texts(ids), "</think>\n") is None
    assert out.cuts[-1] == len(ids) - 1  # the trace without its EOS
    assert out.answer_reward is None  # no answer segment
    assert len(out.cuts) == len(out.segment_starts) + 1


def test_reference_value_model_is_the_frozen_start(setup):
    """value_model 'reference' scores with the start weights, not the live policy: TRL rebinds the
    policy's forward to a closure over itself, which a copy of the policy object would keep."""
    cfg, tok, model, dataset, out = setup
    credit = credit_config(cfg, "rredcot")
    credit.value_model = "reference"
    trainer = _trainer(setup, "frozen", credit, arm="rredcot")
    value = trainer._value_model
    assert value is not None and not any(p.requires_grad for p in value.parameters())
    with torch.no_grad():  # the policy learns
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    ids = torch.tensor([tok("Problem: Start at 3, add 4.\n<think>\n")["input_ids"]])
    start = copy.deepcopy(model).eval()
    with torch.no_grad():
        expected = start(input_ids=ids).logits
        assert not torch.allclose(trainer.model(input_ids=ids).logits, expected, atol=1e-3)
        torch.testing.assert_close(value(input_ids=ids).logits, expected)
    # ... and the credit passes read the start's values.
    assigner = CreditAssigner(tok, credit)
    item = TraceInput(
        ids[0].tolist(), assigner.encode(WRONG_TRACE) + [tok.eos_token_id], -1.0, [("9 * 2 = 8.", "4")]
    )
    (ours,) = assigner.assign(trainer.model.eval(), [item], value)
    (reference,) = assigner.assign(trainer.model.eval(), [item], start)
    torch.testing.assert_close(ours.log_values, reference.log_values)


def test_entropy_credit_needs_no_answer_column(setup):
    """Methods read only the columns they use: entropy weighting on a prompt-only dataset."""
    cfg, tok, model, dataset, out = setup
    prompts = Dataset.from_list([{"prompt": row["prompt"]} for row in dataset])
    trainer = _trainer(setup, "no-answer", CreditConfig(method="entropy"), dataset=prompts)
    torch.manual_seed(5)
    trainer.model.train()
    batch = trainer._generate_and_score_completions([prompts[i] for i in range(8)])
    assert batch["advantages"].shape == batch["completion_ids"].shape
    assert trainer._metrics["train"]["credit/traces"][-1] > 0


# -- bad settings fail at construction, before TRL builds anything -------------------------------------
def test_a_dataset_without_answer_fails_at_construction(setup):
    """A method that scores reference pairs needs the ``answer`` column: the trainer refuses the
    dataset when it is built, naming the column, not after a first generation."""
    _, _, _, dataset, _ = setup
    prompts = Dataset.from_list([{"prompt": row["prompt"]} for row in dataset])
    with pytest.raises(
        ValueError, match=r"credit method 'rredcot' needs the train_dataset column\(s\) 'answer'"
    ):
        _trainer(setup, "no-answer-rredcot", CreditConfig(method="rredcot"), dataset=prompts)
    given = CreditConfig(method="rredcot", proposal="given")
    with pytest.raises(ValueError, match="'reference_log_q'"):  # proposal 'given' reads its log q
        _trainer(setup, "no-log-q", given)


def test_an_empty_exit_string_fails_at_construction(setup):
    """Every method but uniform finds the end of the thinking by ``exit_string``: an empty one is
    refused by CreditConfig, and by the trainer when it was emptied after construction."""
    with pytest.raises(ValueError, match="exit_string must hold text besides whitespace for credit method"):
        CreditConfig(method="rredcot", exit_string="")
    assert CreditConfig(method="uniform", exit_string="").exit_string == ""  # uniform reads none
    credit = CreditConfig(method="entropy")
    credit.exit_string = " \n"
    with pytest.raises(
        ValueError, match="exit_string must hold text besides whitespace for credit method 'entropy'"
    ):
        _trainer(setup, "empty-exit", credit)


def test_settings_sections_may_be_dicts(setup):
    """``segmentation=`` (and every other section) given as a dict, the way TRL users pass settings,
    becomes its class; a dict with a key the class lacks, or a value of another kind, is refused
    naming the class. The dict config trains as the typed one."""
    credit = CreditConfig(method="rredcot", segmentation={"n_segments": 4}, budget={"max_batch_tokens": 4096})
    assert credit.segmentation == dataclasses.replace(CreditConfig().segmentation, n_segments=4)
    assert credit.budget.max_batch_tokens == 4096
    with pytest.raises(ValueError, match="segmentation: SegmentationConfig has no setting.s. n_segs"):
        CreditConfig(segmentation={"n_segs": 4})
    with pytest.raises(
        ValueError, match="segmentation must be a SegmentationConfig or a dict of its settings"
    ):
        CreditConfig(segmentation=4)
    with pytest.raises(ValueError, match="n_segments must be an integer >= 1"):  # the class's own checks
        CreditConfig(segmentation={"n_segments": 0})
    # credit= itself may be a dict too; its step assigns credit with four segments at most.
    trainer = _trainer(setup, "dict-credit", {"method": "rredcot", "segmentation": {"n_segments": 4}})
    assert trainer.credit.segmentation.n_segments == 4
    torch.manual_seed(3)
    trainer.model.train()
    batch = trainer._generate_and_score_completions([setup[3][i] for i in range(8)])
    assert batch["advantages"].shape == batch["completion_ids"].shape
    assert 1 <= trainer._metrics["train"]["credit/segments"][-1] <= 4 + 1  # thinking segments + the answer


def test_evaluation_batches_get_no_credit(setup):
    trainer, _ = _credit_batch(setup, "rredcot")
    traces_logged = len(trainer._metrics["train"]["credit/traces"])
    trainer.model.eval()  # TRL's evaluation loop
    torch.manual_seed(7)
    batch = trainer._generate_and_score_completions([setup[3][i] for i in range(8)])
    assert batch["advantages"].dim() == 1  # TRL's own advantages
    assert len(trainer._metrics["train"]["credit/traces"]) == traces_logged
    assert not any(k.startswith("credit/") for k in trainer._metrics["eval"])


def test_credit_metrics_reach_mlflow_every_step(setup, tmp_path):
    """The stage's callback logs each step's credit metrics to its MLflow run, here where credit runs
    on every step (the length reward gives every group an advantage); the smoke workflow checks the
    same metrics where no trace needs credit (test_workflow.py)."""
    from mlflow import MlflowClient

    from rredcot.infra.tracking import job_run, tracking_uri
    from rredcot.stages.train import CurveCallback

    cfg, tok, _, _, _ = setup
    cfg = {**cfg, "rl": {**cfg["rl"], "max_steps": 2}}
    timeouts = dataclasses.asdict(Tracking())  # the config's default timeouts
    with job_run(
        "t", results_dir=tmp_path, experiment="x", rule="train", arm="rredcot", seed=0, **timeouts
    ) as run:
        callback = CurveCallback(run, tok, [], cfg["prompt"], 0, {}, tmp_path / "metrics.jsonl")
        credit = credit_config(cfg, "rredcot")
        trainer = _trainer(setup, "mlflow", credit, "rredcot", cfg=cfg, callbacks=[callback])
        callback.trainer = trainer
        trainer.train()
    client = MlflowClient(tracking_uri=tracking_uri(tmp_path))
    history = {m: client.get_metric_history(run.run_id, m) for m in ("credit/traces", "credit/seconds")}
    assert [m.step for m in history["credit/traces"]] == [1, 2]
    assert all(m.value > 0 for m in history["credit/traces"])
    assert [m.step for m in history["credit/seconds"]] == [1, 2]
    assert all(m.value > 0 for m in history["credit/seconds"])
