"""Credit passes on an FSDP2-sharded model, two processes, different amounts of work each.

Run by tests/test_distributed.py as ``torchrun --nproc_per_node 2 tests/fsdp_scoring.py OUT``
(gloo: FSDP2 runs on CPUs, while accelerate refuses FSDP without GPUs). Process r assigns credit to
2 + 3r traces, so the processes run different numbers of forward passes; under
``rredcot.adapter.distributed.whole_parameters`` none of them is a collective, and the credit equals that
of the unsharded model. Each process writes ``OUT.rank<r>.json``.
"""

from __future__ import annotations

import copy
import json
import random
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from tiny_models import CharTokens, tiny_qwen

from rredcot.adapter.distributed import whole_parameters
from rredcot.method.assign import CreditAssigner
from rredcot.method.registry import TraceInput
from rredcot.method.settings import CreditConfig


def items(tok: CharTokens, n: int, seed: int) -> list[TraceInput]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        lines = "\n".join(
            "".join(rng.choice("abcdef ") for _ in range(rng.randrange(4, 9))) for _ in range(5)
        )
        completion = tok(f"{lines}\nz\nabc x{{7}}")["input_ids"] + [tok.eos_token_id]
        out.append(
            TraceInput(tok("q 1 2")["input_ids"], completion, rng.choice([-1.0, 1.0]), [("ab cd", "8")])
        )
    return out


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    from torch.distributed.fsdp import fully_shard

    tok = CharTokens()
    model = tiny_qwen(CharTokens.eos_token_id + 1, 0, "sdpa")
    plain = copy.deepcopy(model).eval()
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]))  # FSDP2's lazy initialisation, as training would have done
    cfg = CreditConfig(method="rredcot", exit_string="\nz\n", answer_prefix=" x{", answer_suffix="}", mix=0.5)
    work = items(tok, 2 + 3 * rank, seed=rank)
    with whole_parameters(model, "fsdp2") as whole:
        whole.eval()
        sharded = CreditAssigner(tok, cfg).assign(whole, work)
    reference = CreditAssigner(tok, cfg).assign(plain, work)
    diff = max(
        float((a.multiplier - b.multiplier).abs().max()) for a, b in zip(sharded, reference, strict=True)
    )
    # The parameters are sharded again afterwards, and training-style forwards still work.
    resharded = all(
        type(p).__name__ == "DTensor" for p in model.parameters()
    )  # FSDP2 keeps sharded parameters as DTensors
    with torch.no_grad():
        logits = model(torch.tensor([[4, 5, 6]])).logits
    same = torch.allclose(logits, plain(torch.tensor([[4, 5, 6]])).logits, atol=1e-5)
    dist.barrier()
    out.with_name(f"{out.name}.rank{rank}.json").write_text(
        json.dumps({"traces": len(work), "max_diff": diff, "resharded": resharded, "forward_ok": same})
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
