"""PRIME (``prime``; Process Reinforcement through IMplicit rEwards, arXiv 2502.01456) as a registered
credit method: the reward source against the paper's rule written out token by token (implicit
rewards β·log(π_PRM/π_ref), batch normalisation, leave-one-out baselines over a group for process and
outcome rewards, returns, whitening), and trained through RREDCoTTrainer: the PRM learns, the
reference stays, the first step's advantages are the outcome's, and a killed run resumes bit for bit
(the policy, the PRM and the PRM's optimizer)."""

from __future__ import annotations

import dataclasses
import inspect
import math

import pytest
import torch
from synthetic_setup import (
    arm_trainer,
    assert_same_weights,
    crash_and_resume,
    synthetic_setup,
)

from rredcot.adapter.prime import STATE_FILE
from rredcot.method.assign import CreditAssigner, paid_credit
from rredcot.method.prime import implicit_token_rewards, prime_advantages
from rredcot.method.registry import TraceInput, credit_method
from rredcot.method.settings import CreditSettings, PrimeSettings, prm_learning_rate
from rredcot.method.sources import prime as source
from rredcot.settings.config import credit_config
from rredcot.viz.credit_view import write_views


def paper_advantages(
    prm: list[list[float]],
    ref: list[list[float]],
    outcomes: list[float],
    k: int,
    beta: float,
    gamma: float = 1.0,
    whiten: bool = True,
) -> list[list[float]]:
    """PRIME's token advantages walked out in plain floats, as its code computes them: r_t = β·q_t;
    every r_t over (the batch's largest |Σ_{s≥t} r_s|) + 1e-6; process RLOO r_t·K/(K−1) − Σ_j m_j/(K−1)
    (m_j the mean of sample j's r); outcome RLOO o_i − mean_{j≠i} o_j on the last token; their
    returns summed (γ for both); whitened over every token of the batch (unbiased variance)."""
    r = [[beta * (a - b) for a, b in zip(p, q, strict=True)] for p, q in zip(prm, ref, strict=True)]
    to_go = [abs(sum(row[t:])) for row in r for t in range(len(row))]
    scale = max(to_go) + 1e-6
    r = [[x / scale for x in row] for row in r]
    means = [sum(row) / len(row) if row else 0.0 for row in r]
    out = []
    for i, row in enumerate(r):
        first = i - i % k
        group_sum = sum(means[first : first + k])
        process = [x * k / (k - 1) - group_sum / (k - 1) for x in row]
        mates = [outcomes[j] if r[j] else 0.0 for j in range(first, first + k) if j != i]
        outcome = outcomes[i] - sum(mates) / (k - 1)
        n, returns = len(row), []
        for t in range(n):
            g_process = sum(gamma ** (s - t) * process[s] for s in range(t, n))
            returns.append(g_process + gamma ** (n - 1 - t) * outcome)
        out.append(returns)
    if not whiten:
        return out
    pool = [x for row in out for x in row]
    mean = sum(pool) / len(pool)
    var = sum((x - mean) ** 2 for x in pool) / (len(pool) - 1)
    return [[(x - mean) / math.sqrt(var + 1e-8) for x in row] for row in out]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return (*synthetic_setup(), tmp_path_factory.mktemp("prime"))


def _traces(tok, seed: int = 0) -> tuple[list[TraceInput], list[list[float]], list[list[float]], list[float]]:
    """Two groups of three traces of different lengths, with random PRM and reference log-probs."""
    gen = torch.Generator().manual_seed(seed)
    lengths = [5, 3, 7, 4, 6, 2]
    outcomes = [1.0, 0.0, 0.5, 0.0, 0.0, 1.0]
    items, prm, ref = [], [], []
    for i, (n, o) in enumerate(zip(lengths, outcomes, strict=True)):
        p = -torch.rand(n, generator=gen, dtype=torch.float64) * 3
        q = -torch.rand(n, generator=gen, dtype=torch.float64) * 3
        ids = torch.randint(5, tok.vocab_size, (n,), generator=gen).tolist()
        items.append(
            TraceInput([3, 4], ids, 0.0, [], outcome=o, prm_log_probs=p, ref_log_probs=q, group=i // 3)
        )
        prm.append(p.tolist())
        ref.append(q.tolist())
    return items, prm, ref, outcomes


# -- the source on hand-built traces -----------------------------------------------------------------
def test_prime_is_a_method_of_the_advantage_form_reading_its_own_settings():
    method = credit_method("prime")
    assert method.form == "advantage" and not method.uniform
    assert method.needs == ("process_log_probs", "outcome")
    assert CreditSettings.read_by(method) == ("budget", "precision", "view_every", "view_samples", "prime")
    # The defaults are those of PRIME's recipe, as the pure-torch core documents them.
    settings, core = PrimeSettings(), inspect.signature(prime_advantages).parameters
    combine = ("process_coef", "outcome_coef", "process_gamma", "outcome_gamma", "normalise", "whiten")
    assert {k: getattr(settings, k) for k in combine} == {k: core[k].default for k in combine}
    rewards = inspect.signature(implicit_token_rewards).parameters
    assert (settings.beta, settings.granularity) == (rewards["beta"].default, rewards["granularity"].default)
    assert (settings.lr, settings.weight_decay, settings.grad_clip) == (None, 0.0, 10.0)
    # The PRM's learning rate: PRIME's ratio to the policy's (1e-6 beside 5e-7), or the one given.
    assert prm_learning_rate(settings, 5e-7) == pytest.approx(1e-6)
    assert prm_learning_rate(PrimeSettings(lr=3e-5), 5e-7) == 3e-5
    with pytest.raises(ValueError):
        PrimeSettings(lr=0.0)
    for bad in ({"beta": 0.0}, {"granularity": "step"}, {"outcome_gamma": 1.5}, {"grad_clip": 0.0}):
        with pytest.raises(ValueError):
            PrimeSettings(**bad)
    # No other method reads the section: an experiment changing it leaves their runs alone.
    readers = [
        m
        for m in ("uniform", "rredcot", "mc", "exact", "oracle", "spo")
        if "prime" in CreditSettings.read_by(credit_method(m))
    ]
    assert readers == []


@pytest.mark.parametrize("gamma, whiten", [(1.0, True), (0.9, False)])
def test_the_source_gives_primes_token_advantages(setup, gamma, whiten):
    cfg, tok, model, _, _ = setup
    items, prm, ref, outcomes = _traces(tok)
    config = credit_config(cfg, "prime")
    settings = dataclasses.replace(config.prime, process_gamma=gamma, outcome_gamma=gamma, whiten=whiten)
    assigner = CreditAssigner(tok, dataclasses.replace(config, prime=settings))
    credits = assigner.assign(model.eval(), items)
    want = paper_advantages(prm, ref, outcomes, 3, settings.beta, gamma, whiten)
    for item, credit, row in zip(items, credits, want, strict=True):
        assert credit.advantages.dtype == torch.float32
        torch.testing.assert_close(
            credit.advantages, torch.tensor(row, dtype=torch.float32), rtol=1e-5, atol=1e-6
        )
        assert torch.equal(paid_credit(credit, 5.0), credit.advantages)  # the group's A is not multiplied in
        score = settings.beta * float((item.prm_log_probs - item.ref_log_probs).sum())
        assert credit.segment_rewards.tolist() == pytest.approx([score])  # the PRM's implicit outcome reward
    if whiten:
        pooled = torch.cat([c.advantages for c in credits]).double()
        assert abs(float(pooled.mean())) < 1e-6 and float(pooled.var()) == pytest.approx(1.0, rel=1e-5)


def test_normalised_advantages_do_not_depend_on_beta_and_the_prm_moves_them(setup):
    cfg, tok, model, _, _ = setup
    items, *_ = _traces(tok, seed=1)
    config = credit_config(cfg, "prime")
    small = CreditAssigner(tok, config).assign(model.eval(), items)
    large = CreditAssigner(tok, dataclasses.replace(config, prime=PrimeSettings(beta=2.0))).assign(
        model, items
    )
    for a, b in zip(small, large, strict=True):
        torch.testing.assert_close(a.advantages, b.advantages, rtol=1e-5, atol=1e-5)
    # A PRM equal to its reference leaves the outcome's leave-one-out advantage alone.
    flat = [dataclasses.replace(it, prm_log_probs=it.ref_log_probs.clone()) for it in items]
    credits = CreditAssigner(tok, config).assign(model, flat)
    outcome = paper_advantages(
        [[0.0] * len(it.completion_ids) for it in items],
        [[0.0] * len(it.completion_ids) for it in items],
        [it.outcome for it in items],
        3,
        0.05,
    )
    for credit, row in zip(credits, outcome, strict=True):
        torch.testing.assert_close(
            credit.advantages, torch.tensor(row, dtype=torch.float32), rtol=1e-5, atol=1e-6
        )
        assert torch.unique(credit.advantages).numel() == 1  # one value per trace: the outcome's, whitened
    assert not all(torch.allclose(a.advantages, b.advantages) for a, b in zip(small, credits, strict=True))


def test_the_source_checks_its_inputs(setup):
    cfg, tok, model, _, _ = setup
    items, *_ = _traces(tok)
    assigner = CreditAssigner(tok, credit_config(cfg, "prime"))
    shuffled = [items[0], items[3], items[1], items[2], items[4], items[5]]
    with pytest.raises(ValueError, match="not consecutive"):
        assigner.assign(model, shuffled)
    with pytest.raises(ValueError, match="one size"):
        assigner.assign(model, items[:5])
    with pytest.raises(ValueError, match="group"):
        assigner.assign(model, [dataclasses.replace(it, group=None) for it in items])
    with pytest.raises(ValueError, match="log-probabilities"):
        assigner.assign(model, [dataclasses.replace(it, prm_log_probs=None) for it in items])
    with pytest.raises(ValueError, match="outcome"):
        assigner.assign(model, [dataclasses.replace(it, outcome=None) for it in items])
    assert source.group_size(items) == 3


# -- in the trainer ----------------------------------------------------------------------------------
def _outcome(row, text):  # noqa: ANN001, ANN202
    """An outcome in (0, 1] that varies with the text, so a group's outcomes differ."""
    return 1.0 / (1 + len(text))


def _params(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_the_first_step_pays_the_outcomes_leave_one_out_advantage(setup):
    """At the first step the PRM is the reference: no process reward, and each token's advantage is its
    trace's outcome RLOO, whitened over the batch; the update then moves the PRM and not the reference."""
    with pytest.raises(ValueError, match="needs rollout_reward="):
        arm_trainer(setup, "prime")
    trainer, dataset = arm_trainer(setup, "prime", rollout_reward=_outcome)
    prime = trainer._prime
    assert prime is not None and prime.reference is not None  # beta 0: a frozen start of its own
    assert prime.optimizer.param_groups[0]["lr"] == pytest.approx(2 * trainer.args.learning_rate)
    policy = list(trainer.model.parameters())
    assert not {p.data_ptr() for p in prime.model.parameters()} & {p.data_ptr() for p in policy}
    prm_before, ref_before = _params(prime.model), _params(prime.reference)
    for a, b in zip(prm_before, ref_before, strict=True):
        assert torch.equal(a, b)  # both the initial policy
    torch.manual_seed(0)
    trainer.model.train()
    # One step's batch as TRL samples it: two prompts, each in a group of num_generations (4) rows.
    batch = trainer._generate_and_score_completions([dataset[i // 4] for i in range(8)])
    adv, mask = batch["advantages"], batch["completion_mask"].bool()
    lengths = mask.sum(dim=1).tolist()
    texts = [
        trainer.processing_class.decode(batch["completion_ids"][i][:n].tolist(), skip_special_tokens=True)
        for i, n in enumerate(lengths)
    ]
    outcomes = [_outcome(None, t) for t in texts]
    zeros = [[0.0] * n for n in lengths]
    want = paper_advantages(zeros, zeros, outcomes, 4, 0.05)
    for i, row in enumerate(want):
        torch.testing.assert_close(adv[i][mask[i]], torch.tensor(row, dtype=adv.dtype), rtol=1e-5, atol=1e-5)
    assert (adv[~mask] == 0).all()
    metrics = trainer._metrics["train"]
    assert metrics["prime/loss"][-1] == pytest.approx(
        sum(math.log(2.0) for _ in outcomes) / len(outcomes), rel=1e-5
    )  # σ(0) = 1/2 against every label: the cross-entropy is log 2 whatever the label
    assert metrics["prime/accuracy"][-1] >= 0.0 and metrics["prime/seconds"][-1] > 0
    assert (
        metrics["prime/memory_gib"][-1] > 0 and metrics["credit/seconds"][-1] >= metrics["prime/seconds"][-1]
    )
    moved = any(not torch.equal(a, p) for a, p in zip(prm_before, prime.model.parameters(), strict=True))
    assert moved  # the PRM learnt from the outcomes
    for a, p in zip(ref_before, prime.reference.parameters(), strict=True):
        assert torch.equal(a, p)  # the reference did not
    views = trainer.credit_views  # PRIME's credit pictures: no entropies, its token advantages; they draw
    assert views and all(v["entropies"] is None and len(v["advantages"]) == len(v["tokens"]) for v in views)
    assert write_views(views, setup[-1] / "views")


def test_prime_trains_and_resumes_bit_for_bit(setup):
    """Two steps of PRIME straight, and cut short in the save of step 2 then resumed from step 1: the
    same policy, the same PRM and the same PRM optimizer state; the PRM moved, the reference did not."""
    start = setup[2]
    straight, resumed = crash_and_resume(setup, "prime", rollout_reward=_outcome)
    assert (setup[4] / "prime-cut" / "checkpoint-1" / STATE_FILE).is_file()
    assert_same_weights(straight.model, resumed.model, start)
    assert_same_weights(straight._prime.model, resumed._prime.model, start)
    for a, s in zip(resumed._prime.reference.parameters(), start.parameters(), strict=True):
        assert torch.equal(a, s)
    want, got = straight._prime.optimizer.state_dict(), resumed._prime.optimizer.state_dict()
    assert want["param_groups"] == got["param_groups"] and want["state"].keys() == got["state"].keys()
    for key, state in want["state"].items():
        assert int(state["step"]) == int(got["state"][key]["step"]) == 2
        for name in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(state[name], got["state"][key][name]), (key, name)
    logged = [h for h in resumed.state.log_history if "prime/loss" in h]
    assert logged and all("prime/accuracy" in h and "prime/seconds" in h for h in logged)


def test_a_group_split_over_processes_is_refused(setup):
    """PRIME's baselines are taken within a group: a batch whose consecutive rows of one group hold
    different prompts (a group cut by the split over processes) stops with the setting to change."""
    trainer, dataset = arm_trainer(setup, "prime", rollout_reward=_outcome)
    torch.manual_seed(0)
    trainer.model.train()  # evaluation batches get no credit
    with pytest.raises(ValueError, match="whole groups of 4 completions on each process"):
        trainer._generate_and_score_completions([dataset[i] for i in range(8)])
