"""The model stage: a pretrained model from a GGUF file in an installed package (``model.gguf``),
converted once into ``<results_dir>/models/<name>/`` (safetensors, tokenizer, chat template), which
every later stage loads as an ordinary checkpoint (:mod:`rredcot.lm.gguf`; docs/models.md).

``rredcot model --config C --out DIR``: checks the file's sha256, dequantizes it to float32, and logs
what it read and wrote (tensors by GGUF type, parameters, special tokens set from the file).
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Sequence
from pathlib import Path

from rredcot.infra.logs import setup_logging
from rredcot.infra.tracking import stage_run
from rredcot.lm.gguf import convert_gguf, locate_gguf
from rredcot.settings.reads import stage_config

_log = logging.getLogger(__name__)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="rredcot model", description=__doc__)
    ap.add_argument("--config", nargs="+", required=True)
    ap.add_argument("--out", required=True, type=Path, help="the converted checkpoint's folder")
    args = ap.parse_args(argv)
    cfg = stage_config(args.config, "model")
    source = cfg["model"]["gguf"]
    if cfg["model"]["kind"] != "pretrained" or source is None:
        raise SystemExit("rredcot model: the config names no model.gguf to convert")
    path = locate_gguf(source["package"], source["file"])
    with stage_run(cfg, "model", rule="model", params={"gguf": source}) as run:
        t0 = time.time()
        done = convert_gguf(path, args.out, source["sha256"])
        for name, (before, after) in done.tokens_set.items():
            _log.info("tokenizer %s: %r -> %r (the id the GGUF file records)", name, before, after)
        quantized = [
            f"{n} {kind}" for kind, n in done.tensor_types.items() if kind not in ("F32", "F16", "BF16")
        ]
        kept = [f"{n} {kind}" for kind, n in done.tensor_types.items() if kind in ("F32", "F16", "BF16")]
        _log.info(
            "%s: %s, %d parameters, %s tensors dequantized to float32, %s kept -> %s (%.0f MB) in %.0f s",
            path.name,
            done.architecture,
            done.parameters,
            " and ".join(quantized) or "no",
            " and ".join(kept) or "none",
            args.out,
            done.bytes_written / 1e6,
            time.time() - t0,
        )
        run.log_metrics(
            {
                "parameters": done.parameters,
                "megabytes": done.bytes_written / 1e6,
                "seconds": time.time() - t0,
                **{f"tensors_{kind}": n for kind, n in done.tensor_types.items()},
            }
        )


if __name__ == "__main__":
    setup_logging()
    main()
