"""From a batch of traces to token coefficients σ: the credit pipeline shared by the trainer and the CLI.

``CreditAssigner.assign`` takes traces as token ids (prompt, completion), their advantage and what the
method's reward source needs (reference pairs as text, where a trace goes wrong, rollouts), and
returns one :class:`TraceCredit` per trace: σ·|o| plus everything it came from (segments, exit
points, values, thought and answer NLLs, entropies). It reads as the method does::

    entropies → segments → the method's reward source → multiplier

The reward sources are registered functions (``rredcot.method.registry``, the built-ins in
``rredcot.method.sources``); the assigner gives them what every source shares: token texts, the
policy's entropies, segmentation at the thinking's end, the exit texts, timing. It knows nothing of
TRL: ``RREDCoTTrainer`` feeds it the generation batch, ``rredcot credit-view`` a trace file.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from rredcot.method import segmentation as S
from rredcot.method.answer_baseline import SolutionDecoder
from rredcot.method.forward import low_precision_linears, model_device
from rredcot.method.registry import Batch, Rollouts, SegmentRewards, TraceInput, advantage_shares
from rredcot.method.scoring.entropies import completion_entropies
from rredcot.method.scoring.types import ExitStrings
from rredcot.method.settings import CreditConfig

_log = logging.getLogger(__name__)


@dataclass
class TraceCredit:
    """Credit computed for one completion (kept for logging and inspection)."""

    multiplier: torch.Tensor  # σ·|o| over the completion's tokens
    segment_starts: list[int] = field(default_factory=list)
    cuts: list[int] = field(default_factory=list)
    log_values: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    log_p_solution: torch.Tensor = field(default_factory=lambda: torch.empty(0))  # [n_cuts, N]
    log_p_answer: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    entropies: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    # The answer segment after the model's own exit: log of the value after the model's own final
    # solution over the value at the exit (its reward in log space).
    answer_reward: float | None = None
    baseline_solution: list[int] | None = None  # greedy solution at the exit (answer_baseline greedy)
    # r̂ per segment as σ used them (value_space), the answer segment's last; empty for uniform credit.
    # A method of the advantage form: each segment's advantage (SPO-chain: V(end) - V(start)).
    segment_rewards: torch.Tensor = field(default_factory=lambda: torch.empty(0))
    # A method of the advantage form: the float32 advantage of every completion token, applied as it
    # is (the trace's GRPO advantage is not multiplied in; ``multiplier`` is then each token's share of
    # their absolute sum, for statistics and views). None for share methods (A·multiplier).
    advantages: torch.Tensor | None = None


def paid_credit(credit: TraceCredit, advantage: float) -> torch.Tensor:
    """The token advantages the trainer applies to a trace whose GRPO advantage is ``advantage``:
    the method's own (``credit.advantages``) for the advantage form, else ``advantage`` times σ·|o|."""
    if credit.advantages is not None:
        return credit.advantages
    return advantage * credit.multiplier


class CreditAssigner:
    """Computes σ for batches of traces with a tokenizer and a :class:`CreditConfig`."""

    def __init__(self, tokenizer: Any, config: CreditConfig) -> None:
        self.tok = tokenizer
        self.cfg = config
        self._token_text: dict[int, str] = {}
        self._encoded: dict[str, list[int]] = {}
        self._warned: set[str] = set()
        self.seconds: dict[str, float] = {}
        """Wall seconds of each pass of the last ``assign`` call: ``entropies``, ``scoring``,
        ``answer_baseline``, ``rollouts`` (the ones the method ran). Every pass ends with its results
        on the host, so on a GPU these are the device's times too."""

    @contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """Add the wall seconds of the block to ``seconds[name]``; under ``torch.profiler`` the block is
        the range ``credit.<name>``."""
        t0 = time.perf_counter()
        try:
            with torch.profiler.record_function(f"credit.{name}"):
                yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    def encode(self, text: str) -> list[int]:
        if text not in self._encoded:
            self._encoded[text] = self.tok(text, add_special_tokens=False)["input_ids"]
        return self._encoded[text]

    def token_text(self, token: int) -> str:
        """Decoded text of one token (cached)."""
        if token not in self._token_text:
            self._token_text[token] = self.tok.decode([token])
        return self._token_text[token]

    def completion_text(self, ids: list[int]) -> str:
        """A completion's text as the credit passes read it: its tokens' texts joined (character
        offsets in it, such as ``TraceInput.culprit``, map to tokens)."""
        return "".join(self.token_texts(ids))

    def token_texts(self, ids: list[int]) -> list[str]:
        """Decoded text of each token (cached per id: decoding one by one is slow)."""
        missing = [t for t in set(ids) if t not in self._token_text]
        if missing:
            texts = self.tok.batch_decode([[t] for t in missing])
            self._token_text.update(zip(missing, texts, strict=True))
        return [self._token_text[t] for t in ids]

    def baseline_text(self, credit: TraceCredit) -> str | None:
        """The greedy final solution a trace's answer segment was judged against, as text."""
        if credit.baseline_solution is None:
            return None
        return "".join(self.token_texts(credit.baseline_solution))

    def strings(self) -> ExitStrings:
        c = self.cfg
        return ExitStrings(
            self.encode(c.exit_string), self.encode(c.answer_prefix), self.encode(c.answer_suffix)
        )

    def final_solution(self, text: str) -> tuple[str, str] | None:
        """(solution, answer) written after the last exit string of a completion, if well formed."""
        c = self.cfg
        at = text.rfind(c.exit_string)
        if at < 0:
            return None
        rest = text[at + len(c.exit_string) :]
        a = rest.rfind(c.answer_prefix)
        b = rest.rfind(c.answer_suffix) if c.answer_suffix else len(rest)
        if a < 0 or b < a + len(c.answer_prefix):
            return None
        return rest[:a], rest[a + len(c.answer_prefix) : b]

    # -- the pipeline ----------------------------------------------------------------------------
    def assign(
        self,
        policy: torch.nn.Module,
        items: list[TraceInput],
        value_model: torch.nn.Module | None = None,
        rollouts: Rollouts | None = None,
        decoder: SolutionDecoder | None = None,
    ) -> list[TraceCredit]:
        """σ for every trace. ``policy`` supplies entropies; ``value_model`` (default: the policy) scores;
        ``rollouts`` supplies the outcome sums of Monte Carlo and SPO-chain credit; ``decoder``, an
        inference engine that holds the policy's weights, writes the greedy answer baseline's solutions
        (:func:`rredcot.method.answer_baseline.engine_answer_log_probs`) when the policy is the value model.

        Models are used as given (the caller puts them in eval mode); nothing needs gradients.
        """
        self.seconds = {}
        method = self.cfg.kind
        if not items:
            return []
        if method.uniform:
            return [TraceCredit(torch.ones(len(t.completion_ids)), _one_segment(t)) for t in items]
        precision = self.cfg.precision == "float32"
        with ExitStack() as stack:
            if precision:
                stack.enter_context(torch.autocast(model_device(policy).type, enabled=False))
            # Under autocast: the linear weights cast once for every pass, not once per call.
            for model in {id(m): m for m in (policy, value_model) if m is not None}.values():
                stack.enter_context(low_precision_linears(model))
            batch = self.batch(policy, items, value_model, rollouts, decoder)
            segments = method.reward_source.fn(self, batch)
        if len(segments) != len(items):
            raise ValueError(f"reward source {method.source!r} gave {len(segments)} answers for {len(items)}")
        return [self._credit(item, rewards) for item, rewards in zip(items, segments, strict=True)]

    def batch(
        self,
        policy: torch.nn.Module,
        items: list[TraceInput],
        value_model: torch.nn.Module | None = None,
        rollouts: Rollouts | None = None,
        decoder: SolutionDecoder | None = None,
    ) -> Batch:
        """What a reward source reads: token texts and, per trace, where its thinking ends (exit
        points lie in the thinking only; the answer after the model's own exit is one more segment)."""
        texts = [self.token_texts(t.completion_ids) for t in items]
        ends = [S.thinking_end(tx, self.cfg.exit_string) for tx in texts]
        value_model = value_model if value_model is not None else policy
        return Batch(items, texts, ends, policy, value_model, rollouts, decoder)

    def entropies(self, batch: Batch) -> list[torch.Tensor]:
        """The policy's token entropies (bits) of every completion, computed once per batch."""
        if batch.entropies is None:
            with self.timed("entropies"):
                pairs = [(t.prompt_ids, t.completion_ids) for t in batch.items]
                batch.entropies = completion_entropies(batch.policy, pairs, self.cfg.budget)
        return batch.entropies

    def segment(self, batch: Batch, j: int, entropies: torch.Tensor) -> list[int]:
        """Segment trace ``j``'s thinking (into ``batch.starts[j]``) and return its exit cuts."""
        completion, end, texts = batch.items[j].completion_ids, batch.ends[j], batch.texts[j]
        if end is not None:
            batch.starts[j] = S.segment_trace(texts[:end], entropies[:end].tolist(), self.cfg.segmentation)
            return S.exit_cuts(batch.starts[j], end) if end > 0 else [0]
        # No exit of its own (e.g. cut off at the length limit): the final exit follows the whole
        # trace but not its EOS (nothing is read after EOS, and a segment never starts at the EOS:
        # it joins the last segment), so cuts stay increasing.
        found = S.segment_trace(texts, entropies.tolist(), self.cfg.segmentation)
        eos = self.tok.eos_token_id
        scored = len(completion) - 1 if completion and completion[-1] == eos else len(completion)
        batch.starts[j] = [s for s in found if s < scored] or [0]
        return [min(c, scored) for c in S.exit_cuts(batch.starts[j], len(completion))]

    def warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            _log.warning(message)

    def _credit(self, item: TraceInput, seg: SegmentRewards) -> TraceCredit:
        """σ·|o| from a trace's segment rewards (the advantage form: the token advantages and their
        shares), and what they came from."""
        method, n = self.cfg.kind, len(item.completion_ids)
        if method.form == "advantage":
            if seg.advantages is None or seg.advantages.numel() != n:
                raise ValueError(f"credit method {method.name!r} must give one advantage per token")
            advantages = seg.advantages.float()
            return TraceCredit(
                advantage_shares(advantages),
                seg.starts,
                seg.cuts,
                seg.log_values,
                entropies=seg.entropies,
                segment_rewards=seg.rewards,
                advantages=advantages,
            )
        ids = S.segment_ids_from_starts(seg.starts, n) if method.reward_source.segments else None
        entropies = seg.entropies if method.token_weights == "entropy" else None
        rewards = seg.rewards if method.reward_source.segments else None
        mult = method.multiplier(n, item.advantage, self.cfg.mix, ids, rewards, entropies)
        return TraceCredit(
            mult,
            seg.starts,
            seg.cuts,
            seg.log_values,
            seg.log_p_solution,
            seg.log_p_answer,
            seg.entropies,
            seg.answer_reward,
            seg.baseline_solution,
            seg.rewards,
        )


def _one_segment(item: TraceInput) -> list[int]:
    """Segment starts of a method without segments: the whole trace is one segment."""
    return [0] if item.completion_ids else []


def credit_record(
    tokens: list[str],
    credit: TraceCredit,
    method: str,
    step: int | None,
    trace_id: str,
    prompt: str,
    answer: str,
    advantage: float,
    reward: float | None = None,
    baseline_text: str | None = None,
    mix: float | None = None,
) -> dict[str, Any]:
    """A JSON-ready description of one trace's credit (the input of ``rredcot.viz.credit_view``).

    ``mix`` is the setting σ was computed with (None: not known); with the segment rewards it lets a
    picture say why σ came out uniform."""

    def finite(x: torch.Tensor) -> list[float | None]:
        return [float(v) if math.isfinite(float(v)) else None for v in x.flatten().tolist()]

    n = len(tokens)
    sigma = (credit.multiplier[:n].double() / max(n, 1)).tolist()
    first = (lambda t: -t[:, 0]) if credit.log_p_solution.dim() == 2 else (lambda t: t)
    return {
        "trace_id": trace_id,
        "step": step,
        "method": method,
        "prompt": prompt,
        "answer": answer,
        "reward": reward if reward is not None else float(advantage > 0),
        "advantage": advantage,
        "tokens": tokens,
        "sigma": sigma,
        "segment_starts": list(credit.segment_starts),
        "cuts": list(credit.cuts),
        "log_values": finite(credit.log_values),
        "thought_nll": finite(first(credit.log_p_solution)) if credit.log_p_solution.numel() else None,
        "answer_nll": finite(first(credit.log_p_answer)) if credit.log_p_answer.numel() else None,
        # A method that reads no entropies (SPO-chain, PRIME) has none to picture.
        "entropies": [float(h) for h in credit.entropies.tolist()] if credit.entropies.numel() else None,
        "answer_reward": credit.answer_reward,
        "answer_baseline": baseline_text,
        "segment_rewards": credit.segment_rewards.tolist() if credit.segment_rewards.numel() else None,
        "mix": mix,
        **({} if credit.advantages is None else {"advantages": finite(credit.advantages)}),
    }
