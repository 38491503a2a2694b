"""Credit records: the JSON description of how credit was assigned over one trace, checked and
read for the views.


Numbers in a training log say *that* RREDCoT moved credit around; looking at the trace says whether
it moved it to the right place (the wrong step, the lucky guess). Both views show the same three
things: the exit-point values log v̂ along the trace (the signal credit is derived from), the token
coefficient σ per token, and the segment boundaries with each segment's share of the credit.

Input is one *credit record* per trace, a JSON-serialisable dict::

    trace_id, step, method, prompt, answer, reward, advantage   # identification and outcome
    tokens          list[str]           decoded text of each completion token
    sigma           list[float]         token coefficient σ (non-negative, sums to 1)
    segment_starts  list[int]           first token of each segment (first is 0; [] for an empty trace)
    cuts            list[int]           exit points (token indices 0..len(tokens))
    log_values      list[float | None]  log v̂ per cut (None where v̂ = 0, i.e. log v̂ = -inf)
    thought_nll, answer_nll             optional, list[float | None] per cut
    entropies                           optional, list[float] per token (bits)
    answer_reward                       optional float: Δ log v̂ of the answer segment after the
                                        model's own exit (log of the value after its own final
                                        solution over the value at the exit; the last segment when
                                        ``cuts`` end at its start)
    answer_baseline                     optional str: the final solution the answer segment was
                                        judged against (the model's greedy one at its exit)
    segment_rewards                     optional list[float]: r̂ per segment as σ used them (the
                                        answer segment's last); None for a method without segments
    mix                                 optional float: the ``credit.mix`` σ was computed with

σ is shown relative to uniform credit, σ·|o| (1 = every token weighted alike), on a diverging log
scale: blue below uniform, white at uniform, red above, clipped at ``2**±CLIP_LOG2``.
"""

from __future__ import annotations

import bisect
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# σ·|o| is clipped to [2**-CLIP_LOG2, 2**CLIP_LOG2] before colouring: beyond 8x (or 1/8 of) uniform
# the eye cannot tell shades apart anyway, and a single near-zero σ must not wash out the rest.
CLIP_LOG2: float = 3.0

# Diverging scale (ColorBrewer RdBu, white in the middle) as (position in [-1, 1], RGB in [0, 1]).
STOPS: tuple[tuple[float, tuple[float, float, float]], ...] = (
    (-1.0, (0x21 / 255, 0x66 / 255, 0xAC / 255)),
    (-0.5, (0x92 / 255, 0xC5 / 255, 0xDE / 255)),
    (0.0, (1.0, 1.0, 1.0)),
    (0.5, (0xF4 / 255, 0xA5 / 255, 0x82 / 255)),
    (1.0, (0xB2 / 255, 0x18 / 255, 0x2B / 255)),
)

# Past this |position| the background is dark enough that text must be white to stay legible.
_DARK: float = 0.75

# Tolerance of the "σ sums to 1" check: σ is usually computed in float32.
_SIGMA_SUM_TOL: float = 1e-3

# σ·|o| within this of 1 on every token is uniform credit: the methods then give exactly 1/|o|
# (σ·|o| = 1.0 in float32), and credit that was moved at all moves far more than this.
_UNIFORM_TOL: float = 1e-6

# DejaVu Sans Mono (matplotlib's bundled monospace font) advances every glyph by 1233/2048 em.
MONO_FONT = "DejaVu Sans Mono"
MONO_ADVANCE_EM: float = 1233 / 2048

_OPTIONAL_PER_CUT = ("thought_nll", "answer_nll")


def validate_record(record: Mapping[str, Any]) -> None:
    """Raise ValueError naming the first bad field, so a broken record fails before anything is drawn."""
    if not isinstance(record, Mapping):
        raise ValueError(f"credit record must be a mapping, got {type(record).__name__}")
    for key in ("trace_id", "method", "prompt", "answer"):
        if not isinstance(_field(record, key), str):
            raise ValueError(f"'{key}' must be a string")
    step = _field(record, "step")
    if step is not None and not _is_int(step):
        raise ValueError("'step' must be an int or None")
    for key in ("reward", "advantage"):
        if not _is_finite(_field(record, key)):
            raise ValueError(f"'{key}' must be a finite number")
    n_tokens = _check_tokens(record)
    _check_sigma(record, n_tokens)
    _check_segment_starts(record, n_tokens)
    n_cuts = _check_cuts(record, n_tokens)
    _check_per_cut(record, "log_values", n_cuts)
    for key in _OPTIONAL_PER_CUT:
        if record.get(key) is not None:
            _check_per_cut(record, key, n_cuts)
    if record.get("entropies") is not None:
        values = _number_list(record, "entropies", n_tokens)
        if any(not _is_finite(h) or h < 0 for h in values):
            raise ValueError("'entropies' must be finite and non-negative")
    if record.get("answer_reward") is not None and not _is_finite(record["answer_reward"]):
        raise ValueError("'answer_reward' must be a finite number or None")
    if record.get("answer_baseline") is not None and not isinstance(record["answer_baseline"], str):
        raise ValueError("'answer_baseline' must be a string or None")
    if record.get("segment_rewards") is not None:
        if not all(_is_finite(r) for r in _sequence(record, "segment_rewards")):
            raise ValueError("'segment_rewards' must be a list of finite numbers or None")
    mix = record.get("mix")
    if mix is not None and not (_is_finite(mix) and 0.0 <= mix <= 1.0):
        raise ValueError("'mix' must be a number in [0, 1] or None")


def _field(record: Mapping[str, Any], key: str) -> Any:
    if key not in record:
        raise ValueError(f"credit record is missing '{key}'")
    return record[key]


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_finite(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def _sequence(record: Mapping[str, Any], key: str) -> Sequence[Any]:
    value = _field(record, key)
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ValueError(f"'{key}' must be a list")
    return value


def _number_list(record: Mapping[str, Any], key: str, length: int) -> Sequence[Any]:
    values = _sequence(record, key)
    if len(values) != length:
        raise ValueError(f"'{key}' has {len(values)} entries, expected {length}")
    return values


def _check_tokens(record: Mapping[str, Any]) -> int:
    tokens = _sequence(record, "tokens")
    if not all(isinstance(t, str) for t in tokens):
        raise ValueError("'tokens' must be a list of strings")
    return len(tokens)


def _check_sigma(record: Mapping[str, Any], n_tokens: int) -> None:
    sigma = _number_list(record, "sigma", n_tokens)
    if any(not _is_finite(s) or s < 0 for s in sigma):
        raise ValueError("'sigma' must be finite and non-negative (no NaN)")
    if n_tokens and abs(math.fsum(sigma) - 1.0) > _SIGMA_SUM_TOL:
        raise ValueError(f"'sigma' must sum to 1, sums to {math.fsum(sigma):.6g}")


def _check_segment_starts(record: Mapping[str, Any], n_tokens: int) -> None:
    starts = _sequence(record, "segment_starts")
    if not all(_is_int(b) for b in starts):
        raise ValueError("'segment_starts' must be a list of ints")
    if n_tokens == 0:
        if starts:
            raise ValueError("'segment_starts' must be empty for an empty trace")
        return
    if not starts or starts[0] != 0:
        raise ValueError("'segment_starts' must begin with 0")
    if not _strictly_increasing(starts) or starts[-1] >= n_tokens:
        raise ValueError(f"'segment_starts' must increase strictly and stay below {n_tokens}")


def _check_cuts(record: Mapping[str, Any], n_tokens: int) -> int:
    cuts = _sequence(record, "cuts")
    if not all(_is_int(c) for c in cuts):
        raise ValueError("'cuts' must be a list of ints")
    if any(c < 0 or c > n_tokens for c in cuts):
        raise ValueError(f"'cuts' must lie in 0..{n_tokens} (the number of tokens)")
    if not _strictly_increasing(cuts):
        raise ValueError("'cuts' must increase strictly")
    return len(cuts)


def _check_per_cut(record: Mapping[str, Any], key: str, n_cuts: int) -> None:
    values = _number_list(record, key, n_cuts)
    if any(v is not None and not _is_finite(v) for v in values):
        raise ValueError(f"'{key}' must be finite numbers or None (use None for -inf)")


def _strictly_increasing(xs: Sequence[int]) -> bool:
    return all(b > a for a, b in zip(xs[:-1], xs[1:], strict=True))


@dataclass(frozen=True)
class Segment:
    """One segment's token range and credit, as both views print it."""

    index: int
    start: int
    end: int
    share: float  # Σσ over the segment
    length_share: float  # the share uniform credit would give it, to read ``share`` against
    delta_log_value: float | None  # log v̂(end) - log v̂(start) when the cuts are the segment bounds


def credit_position(ratio: float) -> float:
    """Position of σ·|o| on the colour scale: log2, clipped to ±CLIP_LOG2, scaled to [-1, 1]."""
    if ratio <= 0:
        return -1.0
    return max(-1.0, min(1.0, math.log2(ratio) / CLIP_LOG2))


def credit_rgb(ratio: float) -> tuple[float, float, float]:
    """Background colour for a token with σ·|o| = ``ratio`` (shared by the HTML and PNG views)."""
    pos = credit_position(ratio)
    for (p0, c0), (p1, c1) in zip(STOPS[:-1], STOPS[1:], strict=True):
        if pos <= p1:
            w = (pos - p0) / (p1 - p0)
            return (c0[0] + w * (c1[0] - c0[0]), c0[1] + w * (c1[1] - c0[1]), c0[2] + w * (c1[2] - c0[2]))
    return STOPS[-1][1]


def credit_hex(ratio: float) -> str:
    """``credit_rgb`` as a CSS ``#rrggbb`` string."""
    return "#" + "".join(f"{round(255 * c):02x}" for c in credit_rgb(ratio))


def is_dark(ratio: float) -> bool:
    return abs(credit_position(ratio)) > _DARK


def token_ratios(record: Mapping[str, Any]) -> list[float]:
    """σ·|o| per token."""
    n = len(record["tokens"])
    return [float(s) * n for s in record["sigma"]]


def token_segments(record: Mapping[str, Any]) -> list[int]:
    """Segment index of every token."""
    starts = list(record["segment_starts"])
    return [bisect.bisect_right(starts, t) - 1 for t in range(len(record["tokens"]))]


def uniform_reason(record: Mapping[str, Any]) -> str | None:
    """Why σ is uniform over the trace, in words for the pictures' titles; None when σ moved credit
    (or the trace is empty).

    The cases are those in which the credit methods give every token exactly 1/|o|
    (``rredcot.method.credit.token_multiplier`` and ``entropy_multiplier``): the uniform method, a zero
    advantage, ``mix`` 0, entropy weighting with every entropy 0, a single segment (no other segment
    to move credit to), and no segment reward of the advantage's sign (all of them 0 included).
    Fields a record lacks (``mix``, ``segment_rewards``) rule their cases out; a uniform σ that no
    case explains gets the plain statement.
    """
    ratios = token_ratios(record)
    if not ratios or any(abs(r - 1.0) > _UNIFORM_TOL for r in ratios):
        return None
    advantage = float(record["advantage"])
    rewards = record.get("segment_rewards")
    entropies = record.get("entropies")
    n_segments = len(record["segment_starts"])
    if record["method"] == "uniform":
        return "uniform credit (GRPO): σ is the same on every token"
    if advantage == 0.0:
        return "advantage 0: nothing to redistribute, σ is uniform"
    if record.get("mix") == 0.0:
        return "mix 0: no credit is redistributed, σ is uniform"
    if rewards is None and entropies and not any(entropies):
        return "every token's entropy is 0: nothing to weight tokens by, σ is uniform"
    if n_segments == 1:
        return "one segment: nothing to redistribute, σ is uniform"
    if rewards:
        paid = [float(r) for r in rewards[:n_segments]]  # a reward beyond the last start has no tokens
        if not any(paid):
            return "all segment rewards are 0: nothing to redistribute, σ is uniform"
        if advantage > 0 and not any(r > 0 for r in paid):
            return "no segment raised the value (every segment reward ≤ 0): nothing to credit, σ is uniform"
        if advantage < 0 and not any(r < 0 for r in paid):
            return "no segment lowered the value (every segment reward ≥ 0): nothing to blame, σ is uniform"
    return "σ is uniform: no credit was redistributed"


def record_segments(record: Mapping[str, Any]) -> list[Segment]:
    """Segments with their credit share; Δ log v̂ only where cuts k and k+1 bound segment k.

    Cuts sit at the segment starts, plus one at the end of the thinking part: the trace's end (before
    its EOS) or, when the model exits on its own, the start of the answer segment, whose Δ is the
    record's ``answer_reward``.
    """
    n = len(record["tokens"])
    starts = list(record["segment_starts"])
    bounds = starts + [n]
    cuts = list(record["cuts"])
    aligned = cuts[: len(starts)] == starts[: len(cuts)]
    lv = record["log_values"]
    out = []
    for k, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        delta = None
        if aligned and k + 1 == len(cuts) and record.get("answer_reward") is not None:
            delta = float(record["answer_reward"])  # the answer segment, after the model's exit
        elif aligned and k + 1 < len(cuts) and lv[k] is not None and lv[k + 1] is not None:
            delta = float(lv[k + 1]) - float(lv[k])
        out.append(Segment(k, a, b, math.fsum(record["sigma"][a:b]), (b - a) / n, delta))
    return out


def nll_series(record: Mapping[str, Any]) -> list[tuple[str, list[float | None]]]:
    """The per-cut NLL components present in the record, labelled."""
    labels = {"thought_nll": "thought NLL", "answer_nll": "answer NLL"}
    return [(labels[k], list(record[k])) for k in _OPTIONAL_PER_CUT if record.get(k) is not None]


def fmt(x: float | None, spec: str = ".4g") -> str:
    return "−∞" if x is None else format(x, spec)
