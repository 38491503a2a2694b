"""``RREDCoTTrainer``: TRL's GRPOTrainer with token-level credit assignment (docs/library.md; the
method: docs/method.md, "From a trace to σ").

The adapter is deliberately thin. The parent generates, rewards and computes one advantage per
completion; :meth:`RREDCoTTrainer._generate_and_score_completions` turns each advantage ``A`` into
per-token advantages ``A · σ·|o|`` (σ·|o|, read "sigma times length": token t's share σ_t of the
trace's advantage times the trace's length |o|; uniform GRPO is σ·|o| = 1 for every token), so
that TRL's sequence-mean loss (``loss_type="grpo"``) becomes ``Σ_t σ_t ℓ_t``. The credit method
chooses σ (:func:`rredcot.method.registry.credit_multiplier`, :meth:`rredcot.method.registry
.CreditMethod.multiplier`): ``uniform`` leaves TRL's advantages untouched (stock GRPO bit for bit
under every loss type), ``entropy`` weights tokens by the policy's entropy, ``rredcot`` and
``rredcot+entropy`` spread the advantage over segments by the change of exit-point values, scored
by teacher forcing the reference pairs with the value model in a single pass per trace
(:func:`rredcot.method.scoring.single_pass.score_traces_single_pass`), through
:meth:`rredcot.method.assign.CreditAssigner.assign`. A method of the ``advantage`` form (``spo``,
SPO-chain; ``prime``, PRIME) gives every token its own advantage instead: those replace TRL's
advantages as they are (:func:`rredcot.method.assign.paid_credit`), for every completion, whatever its
group's advantage. PRIME's implicit process reward model (:mod:`rredcot.adapter.prime`) is updated on
each generation batch before its credit is assigned, and saved in every checkpoint. TRL's (B,)
advantages stay in the batch (``outcome_advantages``): TRL's sequence-level sign tests (the
off-policy sequence mask, VESPO's gamma weights) read them, so they stay sequence rules under every
credit form (:meth:`RREDCoTTrainer._compute_loss`).

Distributed runs (``accelerate launch``: DDP, DeepSpeed ZeRO-1/2/3, FSDP2): the credit passes run on
whole parameters (:func:`rredcot.adapter.distributed.scoring_model`), so each process scores its own slice
of the batch with no collective call inside; group mates for ``group_pairs`` and the credit
statistics are gathered over all processes, so neither depends on the number of GPUs. Evaluation
batches get no credit.

With TRL's ``use_vllm`` the run's vLLM engine holds each step's weights when credit is computed: it
writes the greedy answer baseline's solutions (a colocated engine or a server) and the Monte Carlo
method's rollouts (a colocated engine), and it computes in the training's dtype
(:mod:`rredcot.adapter.engine`; on a CPU, with a weight sync that reaches vLLM's packed kernels).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from trl import GRPOTrainer

from rredcot.adapter.distributed import average_gradients, check_backend, gather_objects, scoring_model
from rredcot.adapter.engine import colocated_engine_options, run_decoder, run_engine, use_cpu_weight_sync
from rredcot.adapter.prime import ImplicitPrm
from rredcot.data.grading import grade
from rredcot.lm.generation import sample_seed
from rredcot.lm.rollouts import PolicyRollouts
from rredcot.method.assign import CreditAssigner, TraceCredit, credit_record, paid_credit
from rredcot.method.registry import TraceInput
from rredcot.method.settings import CreditConfig, prm_learning_rate

__all__ = ["CreditConfig", "RREDCoTTrainer", "TraceCredit", "credit_record"]

TaskValues = Callable[[list[dict[str, Any]], list[str]], list[Callable[[list[int]], list[float]]]]
"""``task_values(rows, completions)``: per completion, its values at character offsets (the ``exact``
credit method's need)."""

_log = logging.getLogger(__name__)


class RREDCoTTrainer(GRPOTrainer):
    """GRPOTrainer whose advantages are redistributed over tokens by a credit method.

    Pass ``credit=CreditConfig(...)`` (or a dict of its settings) in addition to the usual
    GRPOTrainer arguments; the settings, what the method needs and the dataset's columns are checked
    here, before TRL builds anything. Dataset columns
    by method: ``uniform`` and ``entropy`` need none beyond TRL's; ``rredcot*`` need ``answer`` (the
    reference answer) and ``reference`` (the reference solution text; empty is allowed), and
    optionally ``reference_log_q`` (``proposal: given``) and ``reference_utility``. ``oracle`` needs
    ``culprit``: a function of a dataset row and a completion's text that returns the character
    offset where the completion first goes wrong (None: nowhere), which only a task that can check
    every step knows (``rredcot.data.synthetic.culprit``). ``mc`` needs ``rollout_reward``: a function
    of a dataset row and a completion's text that returns its reward in [0, 1] (the run's outcome
    reward, applied to each policy rollout from an exit point). ``exact`` needs ``task_values``: a
    function of the step's dataset rows and completion texts that returns, per completion, a function
    from character offsets to the values the task computes there (``rredcot.data.synthetic
    .exact_value_functions``), and ``rollout_reward`` for each trace's own outcome. ``spo`` needs
    ``rollout_reward`` as ``mc`` does (for the rollouts from its segment boundaries and each trace's
    own outcome); ``prime`` needs ``rollout_reward`` for each trace's outcome, the label of its implicit
    process reward model, which the trainer builds and trains itself. Credit records of
    sampled traces accumulate in ``credit_views`` (main process) when ``view_every`` > 0.
    ``sampling_seed`` (an int) pairs the sampling of runs that share it (common random numbers, for
    comparing credit methods); None keeps TRL's random stream, and with uniform credit the run is
    then stock GRPO bit for bit.
    """

    def __init__(
        self,
        *args: Any,
        credit: CreditConfig | None = None,
        culprit: Callable[[dict[str, Any], str], int | None] | None = None,
        rollout_reward: Callable[[dict[str, Any], str], float] | None = None,
        task_values: TaskValues | None = None,
        sampling_seed: int | None = None,
        **kwargs: Any,
    ) -> None:
        # What can be checked before TRL builds anything (and long before a first generation): the
        # credit settings, what the method needs of the caller, and the dataset's columns.
        credit = _credit_config(credit)
        _check_needs(credit, culprit=culprit, rollout_reward=rollout_reward, task_values=task_values)
        _check_columns(credit, kwargs.get("train_dataset", args[3] if len(args) > 3 else None))
        training_args = kwargs.get("args", args[2] if len(args) > 2 else None)  # GRPOTrainer's third
        cpu_colocated = _cpu_colocated_vllm(training_args)
        with colocated_engine_options(training_args):
            super().__init__(*args, **kwargs)
        if cpu_colocated:
            use_cpu_weight_sync(self)
        self.credit = credit
        self._outcome_advantages: torch.Tensor | None = None  # of the micro-batch _compute_loss is on
        # None: TRL's own random stream, which after the first step depends on everything drawn
        # before. An int: every generation batch draws from a stream of its own, seeded by
        # (sampling_seed, step, batch of the step, process); see _generate_and_score_completions.
        self.sampling_seed = sampling_seed
        self._generation_batches: dict[int, int] = {}  # step -> generation batches drawn in it
        self.culprit = culprit
        self.rollout_reward = rollout_reward
        self.task_values = task_values
        self.credit_views: list[dict[str, Any]] = []
        self.assigner = CreditAssigner(self.processing_class, self.credit)
        self._value_model: torch.nn.Module | None = None
        if not self.credit.kind.uniform:
            check_backend(self.accelerator, self.args.ds3_gather_for_generation)
        if "reference_pairs" in self.credit.kind.needs and self.credit.value_model == "reference":
            # TRL keeps a reference model only when beta > 0; otherwise load a frozen initial policy.
            self._value_model = self.ref_model if self.ref_model is not None else self._frozen_start()
        self._prime: ImplicitPrm | None = None
        if "process_log_probs" in self.credit.kind.needs:
            self._prime = self._implicit_prm()
        if not self.credit.kind.uniform and self.loss_type != "grpo":
            # σ·|o| moves weight between a trace's tokens under every normaliser; σ_t is token t's
            # share of the trace's loss only where the normaliser takes each trace's token mean
            # ("grpo", "sapo"; docs/library.md, "The loss type").
            _log.info("loss_type=%r: σ·|o| is applied under that normaliser", self.loss_type)

    def _frozen_start(self) -> torch.nn.Module:
        """A frozen model with the initial policy's weights, prepared for the launcher as TRL prepares
        its reference model (:meth:`_initial_copy`)."""
        return self._initial_copy(trainable=False)

    def _initial_copy(self, trainable: bool) -> torch.nn.Module:
        """A model with the initial policy's weights: frozen and prepared for the launcher as TRL
        prepares its reference model, or ``trainable`` (PRIME's reward model: whole on every
        process, on the policy's device).

        A new instance, never a copy of the policy object: TRL rebinds the policy's ``forward`` (the
        fused LM head) to a closure over the live policy, which a deep copy would keep calling. The
        weights come from the checkpoint the policy was loaded from, if any (also right after a
        resume, when the policy holds later weights), else from the policy as it is now.
        """
        from transformers import AutoModelForCausalLM
        from trl.models import prepare_deepspeed, prepare_fsdp
        from trl.trainer.utils import create_model_from_path, disable_dropout_in_model, get_config_model_id

        policy = self.accelerator.unwrap_model(self.model)
        source = get_config_model_id(policy.config)
        attn = policy.config._attn_implementation
        dtype = next(policy.parameters()).dtype
        if source:
            frozen = create_model_from_path(source, dtype=dtype, attn_implementation=attn)
        else:
            if self.is_deepspeed_enabled or self.is_fsdp_enabled:
                raise ValueError(
                    "value_model 'reference' under ZeRO or FSDP needs a policy loaded from a checkpoint "
                    "(its config's _name_or_path), or beta > 0 so that TRL keeps a reference model"
                )
            frozen = AutoModelForCausalLM.from_config(policy.config, dtype=dtype, attn_implementation=attn)
            frozen.load_state_dict(policy.state_dict())
        disable_dropout_in_model(frozen)
        if trainable:
            return frozen.to(self.accelerator.device).train()
        frozen.requires_grad_(False)
        if self.is_deepspeed_enabled:
            return prepare_deepspeed(frozen, self.accelerator)
        if self.is_fsdp_enabled:
            return prepare_fsdp(frozen, self.accelerator)
        return self.accelerator.prepare_model(frozen.eval(), evaluation_mode=True)

    def _implicit_prm(self) -> ImplicitPrm:
        """PRIME's implicit PRM: a trainable copy of the initial policy, and the frozen initial policy
        as its reference (TRL's reference model when beta > 0, else one of its own). With several
        processes each keeps a whole PRM and their gradients are averaged before every update."""
        from trl.trainer.utils import add_fused_lm_head

        fused = {"temperature": self.temperature, "cast_lm_head_to_fp32": self.args.cast_lm_head_to_fp32}
        prm = self._initial_copy(trainable=True)
        add_fused_lm_head(prm, **fused)  # log-probabilities as TRL computes the policy's
        reference = None
        if self.ref_model is None:  # with one, TRL computes the reference's log-probabilities itself
            reference = self._frozen_start()
            add_fused_lm_head(self.accelerator.unwrap_model(reference), **fused)

        def log_probs(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, keep: int) -> Any:
            return self._get_per_token_logps_and_entropies(model, ids, mask, keep)[0]

        return ImplicitPrm(
            prm,
            reference,
            self.credit.prime,
            log_probs,
            self.num_generations,
            self.args.per_device_train_batch_size,
            average_gradients if self.accelerator.num_processes > 1 else None,
            prm_learning_rate(self.credit.prime, self.args.learning_rate),
        )

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)
        if self._prime is not None and self.args.should_save:  # PRIME's reward model resumes too
            folder = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            self._prime.save(os.path.join(self._get_output_dir(trial=trial), folder))

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        if checkpoint is not None and self._prime is not None:
            self._prime.load(checkpoint)
        # transformers loads a multi-process run's optimizer state with map_location=args.device;
        # for CPU processes (gloo) that is "cpu:0", which torch.load cannot restore to. Load it on
        # "cpu" as a single process would (GPU devices are unaffected).
        device = self.args.device
        if checkpoint is None or device.type != "cpu" or device.index is None:
            super()._load_optimizer_and_scheduler(checkpoint)
            return
        self.args.__dict__["_setup_devices"] = torch.device("cpu")  # the cached_property behind .device
        try:
            super()._load_optimizer_and_scheduler(checkpoint)
        finally:
            self.args.__dict__["_setup_devices"] = device

    # -- the override ----------------------------------------------------------------------------
    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        if self.sampling_seed is not None and self.model.training:
            # Common random numbers: two runs with the same sampling_seed (the credit methods of one
            # seed) draw the same noise for the same step and row, so they sample the same completions
            # wherever their policies agree, and the difference between methods is not drowned by which
            # completions each happened to draw. A resumed run draws what the uninterrupted one did.
            step = int(self.state.global_step)
            batch = self._generation_batches.get(step, 0)
            self._generation_batches = {step: batch + 1}
            torch.manual_seed(sample_seed(self.sampling_seed, step, batch, self.accelerator.process_index))
        out = super()._generate_and_score_completions(inputs)
        if self.credit.kind.uniform or not self.model.training:
            return out  # stock GRPO; evaluation batches get no credit either
        t0 = time.perf_counter()
        advantages, mask = out["advantages"], out["completion_mask"]
        per_token = self._credit_multipliers(inputs, out).to(advantages.dtype)
        # TRL's (B,) advantages stay in the batch as the outcome advantages: where TRL tests the sign
        # of a sequence's advantage, the loss reads them (_compute_loss). TRL splits and shuffles
        # every tensor of the batch along dim 0 together, so each row keeps its own.
        out["outcome_advantages"] = advantages
        if self.credit.kind.form == "advantage":
            # The method's own token advantages replace TRL's (B,) ones; 0 on padding, which the
            # loss masks out anyway.
            out["advantages"] = torch.where(mask.bool(), per_token, 0.0)
            self._log_loss_advantages(out)
            return self._log_credit_seconds(out, t0)
        # Here TRL's (B,) advantages become (B, T): row i is A_i · σ·|o| over completion i's tokens.
        # This relies on GRPOTrainer._compute_loss (TRL >= 0.26; pyproject.toml's floor is 0.29): it
        # unsqueezes `inputs["advantages"]` only when it is 1-D, so a (B, T) tensor multiplies the
        # (B, T) per-token ratio terms element by element, and the loss type's normaliser (per
        # sequence for "grpo", per token for "bnpo"/"dapo") then sums them with the completion mask.
        # TRL splits and shuffles the batch dict along dim 0 only, so (B, T) rows travel intact.
        # Padding positions are masked out of the loss; keep the factor 1 there so nothing changes.
        out["advantages"] = advantages.unsqueeze(1) * torch.where(mask.bool(), per_token, 1.0)
        self._log_loss_advantages(out)
        return self._log_credit_seconds(out, t0)

    def _log_loss_advantages(self, out: dict[str, Any]) -> None:
        """Put the advantages the loss uses into TRL's completion log in place of the (B,) ones TRL
        logged before the credit (its ``advantage`` column): each completion's token advantages
        averaged over its tokens. Under a ``share`` method that is A again (σ·|o| averages to 1 over
        a trace); under an ``advantage`` method it is the mean of the method's own. An empty
        completion has no token: its entry stays TRL's."""
        logged = getattr(self, "_logs", {}).get("advantages")
        if logged is None:  # a TRL without the completion log
            return
        advantages, mask = out["advantages"], out["completion_mask"]
        lengths = mask.sum(dim=1)
        means = (advantages * mask).sum(dim=1) / lengths.clamp(min=1)
        local = torch.where(lengths > 0, means, out["outcome_advantages"]).tolist()
        every = gather_objects(self.accelerator, local)  # in process order, as TRL logged them
        n = min(len(every), len(logged))
        for k, value in zip(range(len(logged) - n, len(logged)), every[len(every) - n :], strict=True):
            logged[k] = value

    # -- TRL's sequence-level sign tests ----------------------------------------------------------
    # TRL tests the sign of a sequence's advantage in two places: the off-policy sequence mask
    # (off_policy_mask_threshold: drop a sequence with a negative advantage that is far off policy)
    # and VESPO's gamma weights (loss_type="vespo": the shape of a sequence's weight by the sign of its
    # advantage). Given (B, T) advantages both would decide per token. The loss gives them the trace's
    # outcome advantage A (TRL's own (B,) one) instead, so that they decide per sequence as in TRL:
    # under a ``share`` method this changes nothing in the loss (A·σ·|o| has A's sign wherever it is
    # not 0); under an ``advantage`` method (SPO-chain, PRIME), whose token advantages change sign
    # within a trace, it keeps the sequence rule a sequence rule. TRL's token-level sign tests stay
    # token-level: PPO's clipping (and its clip_ratio metrics) and SAPO's temperatures, which gate each
    # token's own update by the sign of that token's advantage (docs/library.md, "TRL's sign tests").
    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
        self._outcome_advantages = inputs.get("outcome_advantages")
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._outcome_advantages = None

    def _sequence_advantages(self, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        """The arguments of a sequence-level sign test with the outcome advantages, (B, 1), in place
        of the token advantages (unchanged where the batch has none: uniform credit, evaluation)."""
        if self._outcome_advantages is None:
            return args, kwargs
        outcome = self._outcome_advantages.unsqueeze(1)
        if "advantages" in kwargs:
            return args, {**kwargs, "advantages": outcome}
        return (outcome, *args[1:]), kwargs

    def get_off_policy_mask(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        args, kwargs = self._sequence_advantages(args, kwargs)
        return super().get_off_policy_mask(*args, **kwargs)

    def get_gamma_weights(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        args, kwargs = self._sequence_advantages(args, kwargs)
        return super().get_gamma_weights(*args, **kwargs)

    def _log_credit_seconds(self, out: dict[str, Any], t0: float) -> dict[str, Any]:
        """Log the credit's seconds since ``t0`` and return ``out``. The step waits for the slowest
        process: the maximum over processes, in all and per pass."""
        parts = gather_objects(self.accelerator, [(time.perf_counter() - t0, self.assigner.seconds)])
        self._metrics["train"]["credit/seconds"].append(max(total for total, _ in parts))
        for name in sorted({name for _, passes in parts for name in passes}):
            slowest = max(passes.get(name, 0.0) for _, passes in parts)
            self._metrics["train"][f"credit/seconds_{name}"].append(slowest)
        return out

    # -- credit ----------------------------------------------------------------------------------
    def _group_finals(
        self, inputs: list[dict[str, Any]], texts: list[str]
    ) -> dict[str, list[tuple[str, str]]]:
        """Final solutions of every correct completion, by prompt, over all processes (in the order
        of the whole generation batch, so the pairs do not depend on the number of processes)."""
        local = []
        for row, text in zip(inputs, texts, strict=True):
            answer = str(row["answer"])
            final = self.assigner.final_solution(text) if grade(text, answer) else None
            local.append((_prompt_key(row["prompt"]), final))
        finals: dict[str, list[tuple[str, str]]] = {}
        for key, final in gather_objects(self.accelerator, local):
            if final is not None:
                finals.setdefault(key, []).append(tuple(final))
        return finals

    def _reference_pairs(
        self, row: dict[str, Any], finals: dict[str, list[tuple[str, str]]] | None
    ) -> TraceInput:
        """The dataset pair of a row, then (optionally) the final solutions of correct group mates."""
        if "answer" not in row:
            raise KeyError(f"credit method {self.credit.method!r} needs an 'answer' column in the dataset")
        answer = str(row["answer"])
        pairs = [(row.get("reference") or "", answer)]
        if finals is not None:
            for final in finals.get(_prompt_key(row["prompt"]), []):
                if final not in pairs:
                    pairs.append(final)
        log_q = None
        if self.credit.proposal == "given":
            if row.get("reference_log_q") is None:
                raise ValueError("proposal 'given' needs a 'reference_log_q' column in the dataset")
            log_q = torch.tensor([float(row["reference_log_q"])], dtype=torch.float64)
        utility = torch.ones(len(pairs), dtype=torch.float64)
        if row.get("reference_utility") is not None:
            utility[0] = float(row["reference_utility"])
        return TraceInput([], [], 0.0, pairs, log_q, utility)

    @contextmanager
    def _credit_models(self) -> Iterator[tuple[torch.nn.Module, torch.nn.Module | None]]:
        """Policy and value model with whole parameters, under the run's mixed-precision autocast.

        Every process enters and leaves together, whatever its share of the work."""
        with ExitStack() as stack:
            policy = stack.enter_context(scoring_model(self.accelerator, self.model_wrapped))
            value = None
            if self._value_model is not None:
                value = stack.enter_context(scoring_model(self.accelerator, self._value_model))
            stack.enter_context(self.accelerator.autocast())
            yield policy, value

    def _credit_multipliers(self, inputs: list[dict[str, Any]], out: dict[str, Any]) -> torch.Tensor:
        """σ·|o| of every completion token of the batch, [B, T] (1 for completions with a zero
        advantage, which have nothing to spread, and beyond each completion's end). For a method of
        the ``advantage`` form: its token advantages, of every completion (0 beyond its end)."""
        prompt_ids, prompt_mask = out["prompt_ids"], out["prompt_mask"]
        completion_ids, completion_mask = out["completion_ids"], out["completion_mask"]
        advantages = out["advantages"]
        method = self.credit.kind
        own = method.form == "advantage"  # the method's token advantages, not shares of A
        fill = torch.zeros if own else torch.ones
        per_token = fill(completion_ids.shape, dtype=torch.float32, device=completion_ids.device)
        lengths = completion_mask.sum(dim=1).tolist()
        finals = None
        if "reference_pairs" in method.needs and self.credit.group_pairs:  # a collective: every process
            every = [completion_ids[i][: lengths[i]].tolist() for i in range(len(inputs))]
            finals = self._group_finals(
                inputs, self.processing_class.batch_decode(every, skip_special_tokens=True)
            )
        grouped = "process_log_probs" in method.needs  # every completion of every group, empty ones too
        rows = [
            i
            for i in range(len(inputs))
            if (own or float(advantages[i]) != 0.0) and (lengths[i] > 0 or grouped)
        ]
        values_at = None
        if "task_values" in method.needs:  # every completion of the process's batch gives the slip rate
            texts = [
                self.assigner.completion_text(completion_ids[i][: lengths[i]].tolist())
                for i in range(len(inputs))
            ]
            values_at = self.task_values(inputs, texts)  # type: ignore[misc]
        items = []
        for i in rows:
            item = self._reference_pairs(inputs[i], finals) if "reference_pairs" in method.needs else None
            item = item or TraceInput([], [], 0.0, [])
            item.prompt_ids = prompt_ids[i][prompt_mask[i].bool()].tolist()
            item.completion_ids = completion_ids[i][: lengths[i]].tolist()
            item.advantage = float(advantages[i])
            # What the method's reward source needs of the task, from the dataset row.
            if "culprit" in method.needs:
                item.culprit = self.culprit(inputs[i], self.assigner.completion_text(item.completion_ids))
            if "task_values" in method.needs:
                item.task_values = values_at[i]
            if "outcome" in method.needs:
                text = self.processing_class.decode(item.completion_ids, skip_special_tokens=True)
                item.outcome = self._reward(inputs[i], text)
            items.append(item)
        if grouped:
            self._update_prime(out, items, rows)
        rollouts = None
        if "rollouts" in method.needs:
            # Sampled as the run samples its completions, each rollout from a random stream of its
            # own: (run seed, step, process) and the trace, exit point and rollout.
            cfg, keys = self.credit.rollout_settings, [_row_key(inputs[i]) for i in rows]
            rollouts = PolicyRollouts(
                self.processing_class,
                lambda j, text: self._reward(inputs[rows[j]], text),
                keys,
                samples=cfg.samples,
                batch_size=cfg.batch_size,
                max_new_tokens=cfg.max_new_tokens or self.max_completion_length,
                temperature=self.temperature,
                top_p=self.top_p if self.top_p is not None else 1.0,
                seed=(self.args.seed, int(self.state.global_step), self.accelerator.process_index),
                engine=run_engine(self),
            )
        # The run's vLLM engine holds the policy's weights: it writes the greedy answer baseline.
        decoder = run_decoder(self) if self.credit.answer_baseline == "greedy" else None
        with self._credit_models() as (policy, value_model):  # collective on entry and exit
            credits = self.assigner.assign(policy, items, value_model, rollouts, decoder)
        if rollouts is not None:  # the generation cost of the Monte Carlo values, over every process
            counts = gather_objects(self.accelerator, [(rollouts.rollouts, rollouts.tokens)])
            self._metrics["train"]["credit/rollouts"].append(float(sum(c[0] for c in counts)))
            self._metrics["train"]["credit/rollout_tokens"].append(float(sum(c[1] for c in counts)))
        stats = _CreditStats()
        for i, tc in zip(rows, credits, strict=True):
            paid = paid_credit(tc, float(advantages[i])) if own else tc.multiplier
            per_token[i, : lengths[i]] = paid.to(per_token.device)
            stats.add(tc)
        # Over every process's traces, so the logged numbers do not depend on the GPU count.
        for name, value in _CreditStats.merge(gather_objects(self.accelerator, [stats])).summary().items():
            if math.isfinite(value):  # no traces with an advantage: only the count (0) is logged
                self._metrics["train"][f"credit/{name}"].append(value)
        if self.accelerator.is_main_process:
            self._keep_views(inputs, rows, [it.completion_ids for it in items], advantages, credits)
        return per_token

    def _update_prime(self, out: dict[str, Any], items: list[TraceInput], rows: list[int]) -> None:
        """Update PRIME's reward model on the batch's completions and their outcomes, give each trace
        the log-probabilities read before the update, and log the update and its cost."""
        assert self._prime is not None
        k = self.num_generations
        # A process's share of the batch must hold whole groups: PRIME's baselines are taken within a
        # group. Shares are consecutive slices of the batch, whose groups are consecutive.
        if len(items) % k or any(
            items[a].prompt_ids != items[b].prompt_ids
            for a in range(0, len(items), k)
            for b in range(a + 1, a + k)
        ):
            raise ValueError(
                f"credit method {self.credit.method!r} needs whole groups of {k} completions on each "
                f"process, got {len(items)} completions here: make each process's share of a generation "
                "batch (prompts_per_step x num_generations / processes) a multiple of num_generations"
            )
        ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
        attention = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
        outcomes = torch.tensor([item.outcome for item in items], dtype=torch.float32)
        result = self._prime.step(
            ids, attention, out["completion_mask"], outcomes, out.get("ref_per_token_logps")
        )
        self._prime.supply(items, rows, result)
        metrics = self._metrics["train"]
        # The loss and ranking accuracy over every process (equal shares), as the credit statistics.
        shares = gather_objects(self.accelerator, [(result.loss, result.accuracy)])
        metrics["prime/loss"].append(sum(x[0] for x in shares) / len(shares))
        metrics["prime/accuracy"].append(sum(x[1] for x in shares) / len(shares))
        metrics["prime/grad_norm"].append(result.grad_norm)
        metrics["prime/seconds"].append(result.seconds)
        metrics["prime/memory_gib"].append(self._prime.memory_bytes() / 2**30)

    def _reward(self, row: dict[str, Any], text: str) -> float:
        value = float(self.rollout_reward(row, text))  # type: ignore[misc]
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"rollout_reward must return a reward in [0, 1], got {value}")
        return value

    def _keep_views(
        self,
        inputs: list[dict[str, Any]],
        rows: list[int],
        completions: list[list[int]],
        advantages: torch.Tensor,
        credits: list[TraceCredit],
    ) -> None:
        """Keep credit records of a few traces every ``view_every`` steps: alternately one with a
        negative and one with a positive advantage, and within each sign traces with several segments
        first.

        A one-segment trace (no thinking before the exit, say) has nothing to redistribute between
        segments: its σ is uniform (but for entropy weighting), a picture that shows nothing, so one is
        kept only when its sign has no trace with several segments left. Among the
        traces with several segments the batch's order stands (a fair sample of what the policy
        writes, not always its longest traces).
        """
        cfg = self.credit
        step = int(self.state.global_step)
        if (
            cfg.view_every <= 0
            or step % cfg.view_every != 0
            or any(v["step"] == step for v in self.credit_views)
        ):
            return

        def candidates(sign: float) -> list[int]:
            # A trace that is only an EOS has two equal cuts (0, 0): nothing to picture.
            found = [
                j
                for j, i in enumerate(rows)
                if float(advantages[i]) * sign > 0
                and len(set(credits[j].cuts)) == len(credits[j].cuts)
                and completions[j]
            ]
            return sorted(found, key=lambda j: len(credits[j].segment_starts) < 2)  # stable: batch order

        neg, pos = candidates(-1.0), candidates(1.0)
        order = [j for pair in zip(neg, pos, strict=False) for j in pair] + neg[len(pos) :] + pos[len(neg) :]
        for j in order[: cfg.view_samples]:
            i, tc = rows[j], credits[j]
            self.credit_views.append(
                credit_record(
                    tokens=self.assigner.token_texts(completions[j]),
                    credit=tc,
                    method=cfg.method,
                    step=step,
                    trace_id=f"step{step}-{j}",
                    prompt=str(inputs[i]["prompt"]),
                    answer=str(inputs[i].get("answer", "")),  # only methods with reference pairs need it
                    advantage=float(advantages[i]),
                    baseline_text=self.assigner.baseline_text(tc),
                    mix=cfg.mix,
                )
            )


def _credit_config(credit: CreditConfig | dict[str, Any] | None) -> CreditConfig:
    """``credit=`` as a ``CreditConfig``: None is the default one, a dict its settings; its fields are
    checked again (a setting changed after construction)."""
    if credit is None:
        return CreditConfig()
    if isinstance(credit, dict):
        return CreditConfig.from_dict(credit)
    if not isinstance(credit, CreditConfig):
        raise ValueError(
            f"credit= must be a CreditConfig or a dict of its settings, got {type(credit).__name__}"
        )
    credit.validate()
    return credit


def _check_needs(credit: CreditConfig, **given: Any) -> None:
    """The functions of the task that the credit method needs, given to the trainer."""
    needs = credit.kind.needs
    if "culprit" in needs and given["culprit"] is None:
        raise ValueError(
            f"credit method {credit.method!r} needs culprit=: where each completion first goes "
            "wrong, which only a task that can check every step knows (the synthetic task)"
        )
    if "outcome" in needs and given["rollout_reward"] is None:
        raise ValueError(
            f"credit method {credit.method!r} needs rollout_reward=: the reward in [0, 1] of a "
            "completion's text for its dataset row, to score the policy rollouts from each exit point"
        )
    if "task_values" in needs and given["task_values"] is None:
        raise ValueError(
            f"credit method {credit.method!r} needs task_values=: the values a task computes at "
            "character offsets of each completion, which only a task that can check every step knows "
            "(the synthetic task)"
        )


def required_columns(credit: CreditConfig) -> tuple[str, ...]:
    """The dataset columns that ``credit``'s method reads of every row: ``answer`` for a method that
    scores reference pairs (and ``reference_log_q`` with ``proposal="given"``); none for the others.
    ``reference`` and ``reference_utility`` are optional."""
    if "reference_pairs" not in credit.kind.needs:
        return ()
    return ("answer", "reference_log_q") if credit.proposal == "given" else ("answer",)


def _check_columns(credit: CreditConfig, dataset: Any) -> None:
    """The training dataset has the columns the credit method reads (where it knows its columns: a
    ``datasets`` Dataset does; an IterableDataset may not, and is then checked row by row)."""
    columns = getattr(dataset, "column_names", None)
    if not isinstance(columns, list):
        return
    missing = [c for c in required_columns(credit) if c not in columns]
    if missing:
        what = {"answer": "the reference answer", "reference_log_q": "the pair's log q, for proposal 'given'"}
        raise ValueError(
            f"credit method {credit.method!r} needs the train_dataset column(s) "
            + ", ".join(f"{c!r} ({what[c]})" for c in missing)
            + f"; the dataset has {columns}"
        )


def _cpu_colocated_vllm(args: Any) -> bool:
    """Whether the trainer will start a colocated vLLM engine on a CPU; checks that its KV cache has a
    size (vLLM would otherwise reserve a share of the host's whole memory)."""
    if args is None or not getattr(args, "use_vllm", False) or args.vllm_mode != "colocate":
        return False
    if torch.cuda.is_available() and not args.use_cpu:
        return False
    if not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        raise ValueError(
            "a colocated vLLM engine on a CPU needs the size of its KV cache: set VLLM_CPU_KVCACHE_SPACE "
            "(GiB), or call rredcot.lm.vllm_engine.prepare_engine(kv_cache_gib, model_path) before building "
            "the trainer"
        )
    return True


def _row_key(row: dict[str, Any]) -> str:
    """A hashable key of a dataset row (rows with equal content judge a rollout alike)."""
    return repr(sorted(row.items(), key=lambda kv: str(kv[0])))


def _prompt_key(prompt: Any) -> str:
    """A hashable key of a prompt (plain text or a conversation)."""
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)


class _CreditStats:
    """Running σ statistics over the traces of one generation batch."""

    def __init__(self) -> None:
        self.max_share: list[float] = []
        self.sigma_entropy: list[float] = []
        self.segments: list[int] = []
        self.exit_log_value: list[float] = []

    def add(self, tc: TraceCredit) -> None:
        length = tc.multiplier.numel()
        if length == 0:  # an empty completion (PRIME passes every one of a group): no σ to describe
            return
        sigma = (tc.multiplier / length).double()
        self.max_share.append(float(sigma.max()))
        nz = sigma[sigma > 0]
        # Normalised entropy of σ: 1.0 = uniform over tokens, lower = concentrated credit.
        ent = float(-(nz * nz.log()).sum()) / math.log(length) if length > 1 else 1.0
        self.sigma_entropy.append(ent)
        if tc.segment_starts:
            self.segments.append(len(tc.segment_starts))
        finite = tc.log_values[torch.isfinite(tc.log_values)]
        if finite.numel():
            self.exit_log_value.append(float(finite.mean()))

    @classmethod
    def merge(cls, parts: list[_CreditStats]) -> _CreditStats:
        """The statistics of several processes' traces together."""
        whole = cls()
        for part in parts:
            whole.max_share += part.max_share
            whole.sigma_entropy += part.sigma_entropy
            whole.segments += part.segments
            whole.exit_log_value += part.exit_log_value
        return whole

    def summary(self) -> dict[str, float]:
        def mean(xs: list[float] | list[int]) -> float:
            return float(sum(xs) / len(xs)) if xs else float("nan")

        return {
            "traces": float(len(self.sigma_entropy)),
            "sigma_max_share": mean(self.max_share),
            "sigma_norm_entropy": mean(self.sigma_entropy),
            "segments": mean(self.segments),
            "exit_log_value": mean(self.exit_log_value),
        }
