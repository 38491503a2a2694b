"""Credit under each TRL loss type and the off-policy sequence mask, for both credit forms
(docs/library.md, "TRL's sign tests" and "The loss type").

TRL tests the sign of a sequence's advantage in its off-policy sequence mask and in VESPO's gamma
weights; given (B, T) advantages those tests would decide per token. The trainer hands them the
trace's outcome advantage A (TRL's (B,) one) instead. Under a ``share`` method (here ``rredcot``)
that changes nothing: its token advantages A·σ·|o| have A's sign. Under an ``advantage`` method (here
SPO-chain, whose token advantages change sign within a trace) the sequence rules stay sequence rules,
while TRL's token-level sign tests (PPO's clipping, SAPO's temperatures) keep deciding per token.

Each case computes the loss of one real generation batch of the method, with importance ratios away
from 1 (some tokens clipped) and half the traces far off policy, as TRL's ``_compute_loss`` does in
training, and compares it with TRL's own loss on advantages built to make the same decisions.
"""

from __future__ import annotations

import pytest
import torch
from synthetic_setup import arm_trainer, one_credit_step, synthetic_setup
from test_trainer import LOSS_TYPES
from trl import GRPOTrainer

FORMS = {"share": "rredcot", "advantage": "spo"}
THRESHOLD = 0.5  # off_policy_mask_threshold: the mean KL above which a negative sequence is dropped


def _rollout_reward(row, text):  # noqa: ANN001, ANN202
    """A rollout reward in (0, 1] that varies with the text, so an untrained policy's values differ."""
    return 1.0 / (1 + len(text))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    overrides = {"credit": {"spo": {"samples": 2, "max_new_tokens": 8, "batch_size": 16}}}
    return (*synthetic_setup(overrides), tmp_path_factory.mktemp("loss-types"))


@pytest.fixture(scope="module")
def batches(setup):
    """Per credit form: (trainer, the batch TRL's parent method returns, the trainer's batch), both
    generated from the same random state, so of the same completions."""
    made = {}

    def get(form: str):
        if form not in made:
            trainer, dataset = arm_trainer(setup, FORMS[form], rollout_reward=_rollout_reward)
            torch.manual_seed(0)
            trainer.model.train()
            stock = GRPOTrainer._generate_and_score_completions(trainer, [dataset[i] for i in range(8)])
            made[form] = trainer, stock, one_credit_step(trainer, dataset)  # seeds 0 again
        return made[form]

    return get


def _token_mean(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (advantages * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)


@pytest.mark.parametrize("form", FORMS)
def test_the_batch_keeps_trls_advantages_and_logs_what_the_loss_uses(batches, form):
    trainer, stock, ours = batches(form)
    assert torch.equal(ours["completion_ids"], stock["completion_ids"])  # the same completions
    mask = ours["completion_mask"]
    assert ours["advantages"].shape == mask.shape
    assert torch.equal(ours["outcome_advantages"], stock["advantages"])  # TRL's (B,) advantages
    # TRL's completion log holds the advantages the loss uses, each completion's token mean.
    logged = list(trainer._logs["advantages"])[-mask.shape[0] :]
    means = torch.where(mask.sum(dim=1) > 0, _token_mean(ours["advantages"], mask), stock["advantages"])
    assert logged == means.tolist()
    if form == "share":  # σ·|o| averages to 1 over a trace: the token mean is A again
        torch.testing.assert_close(torch.tensor(logged), stock["advantages"], rtol=1e-5, atol=1e-6)
    else:  # SPO-chain's own advantages: not A
        assert not torch.allclose(torch.tensor(logged), stock["advantages"], atol=1e-3)


def _off_policy(trainer, batch):
    """The batch with old log-probabilities a little off the policy's (log ratios ~ N(0, 0.1²) per
    token: some tokens outside the clip range) and sampling log-probabilities whose mean KL is 1
    (above THRESHOLD) on even rows and 0 on odd ones; and the log ratios, the rows' KL."""
    model = trainer.model.eval()
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    with torch.no_grad():
        logps = trainer._get_per_token_logps_and_entropies(model, ids, attention, ids.shape[1] // 2)[0]
    logps = logps[:, -batch["completion_ids"].shape[1] :]
    rows, length = logps.shape
    log_ratio = 0.1 * torch.randn(rows, length, generator=torch.Generator().manual_seed(1))
    kl = torch.tensor([1.0 if i % 2 == 0 else 0.0 for i in range(rows)]).unsqueeze(1)
    inputs = {**batch, "old_per_token_logps": logps - log_ratio, "sampling_per_token_logps": logps + kl}
    return inputs, log_ratio, kl


def _loss(trainer, inputs, advantages, *, stock: bool, masked: bool):
    """(loss, d loss / d advantages): TRL's own _compute_loss (``stock``: it sees no outcome
    advantages, so it tests the signs of ``advantages``) or the trainer's, with or without the
    off-policy mask."""
    a = advantages.detach().clone().requires_grad_(True)
    x = {**inputs, "advantages": a}
    if stock:
        x.pop("outcome_advantages")
    threshold = trainer.off_policy_mask_threshold
    trainer.off_policy_mask_threshold = threshold if masked else None
    try:
        loss = (
            GRPOTrainer._compute_loss(trainer, trainer.model, x)
            if stock
            else trainer._compute_loss(trainer.model, x)
        )
    finally:
        trainer.off_policy_mask_threshold = threshold
    (grad,) = torch.autograd.grad(loss, a)
    return loss.detach(), grad


def _phi(trainer, sign: float, log_ratio, mask) -> torch.Tensor:
    """VESPO's gamma weight of every row for an advantage of ``sign``, as TRL computes it, (B, 1)."""
    args = trainer.args
    return GRPOTrainer.get_gamma_weights(
        advantages=torch.full((log_ratio.shape[0], 1), sign),
        log_ratio_per_token=log_ratio,
        mask=mask,
        importance_sampling_ratio=None,
        k_pos=args.vespo_k_pos,
        lambda_pos=args.vespo_lambda_pos,
        k_neg=args.vespo_k_neg,
        lambda_neg=args.vespo_lambda_neg,
    )


@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "off-policy-mask"])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("form", FORMS)
def test_sequence_sign_tests_read_the_outcome_advantage(batches, form, loss_type, masked):
    trainer, _, batch = batches(form)
    inputs, log_ratio, kl = _off_policy(trainer, batch)
    trainer.loss_type = loss_type
    trainer.off_policy_mask_threshold = THRESHOLD
    mask = batch["completion_mask"].float()
    a, outcome = batch["advantages"], batch["outcome_advantages"].unsqueeze(1)
    ours, _ = _loss(trainer, inputs, a, stock=False, masked=masked)
    assert torch.isfinite(ours) and ours != 0

    # What the trainer decides: the mask keeps a trace by its outcome advantage (or its low KL), and
    # VESPO weighs a trace by its outcome advantage's sign. TRL's own loss without the mask, on token
    # advantages rescaled so that its per-token tests reach the same decisions, is the expectation.
    keep = ((outcome >= 0) | (kl <= THRESHOLD)).float() if masked else torch.ones_like(outcome)
    weight = torch.ones_like(a)
    if loss_type == "vespo":
        pos, neg = _phi(trainer, 1.0, log_ratio, mask), _phi(trainer, -1.0, log_ratio, mask)
        weight = torch.where(outcome >= 0, pos, neg) / torch.where(a >= 0, pos, neg)
    expected, _ = _loss(trainer, inputs, a * keep * weight, stock=True, masked=False)
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-7)

    trl, _ = _loss(trainer, inputs, a, stock=True, masked=masked)  # TRL deciding per token
    sequence_rule = masked or loss_type == "vespo"
    if form == "share" or not sequence_rule:
        # A share method's token advantages have A's sign: TRL's per-token tests decide as the
        # sequence's; and token-level tests (clipping, SAPO's temperatures) stay TRL's.
        torch.testing.assert_close(ours, trl, rtol=1e-5, atol=1e-7)
    else:
        assert not torch.isclose(ours, trl, rtol=1e-4), "SPO-chain's signs must differ from A's somewhere"

    if form == "share":
        # Each token's term is stock TRL's term for the trace's advantage A, times σ·|o|: the loss is
        # Σ_t A·σ_t·|o|·h_t with h_t stock TRL's coefficient of token t's advantage.
        A = outcome.expand_as(a)
        _, h = _loss(trainer, inputs, A, stock=True, masked=masked)
        torch.testing.assert_close(ours, (a * h).sum(), rtol=1e-5, atol=1e-7)
