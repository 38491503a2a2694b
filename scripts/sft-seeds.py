"""Does SFT converge for every seed and thread count? The convergence matrix of the default.

For each (``sft.seed``, ``threads.sft``) pair the workflow runs the SFT job and the base model's
evaluation (greedy and sampled avg@4 on the held-out split) in a results folder of its own, with the
config files given plus an override of those two keys. The table prints as each run ends; the whole
matrix also goes to ``<out>/sft-seeds.csv``. A converged SFT model scores 0.85-1.0 greedy (chance
is 0.1); one that copies and formats but has not learnt the arithmetic 0.2-0.6 (docs/testbed.md,
"The SFT model").

    python scripts/sft-seeds.py --seeds 0 1 2 --threads 1 2           # six SFT runs, one at a time
    python scripts/sft-seeds.py --seeds 1 2 --threads 1 --parallel 2   # two one-thread runs side by side

Each run takes as long as the default's SFT (docs/results.md#the-default-run); a finished pair is
not run again (snakemake finds its outputs), so an interrupted matrix resumes.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml


def run_pair(seed: int, threads: int, configs: list[str], out: Path) -> dict:
    folder = out / f"seed{seed}-threads{threads}"
    folder.mkdir(parents=True, exist_ok=True)
    override = folder / "override.yaml"
    override.write_text(
        yaml.safe_dump(
            {
                "results_dir": str(folder),
                "experiment": "sft-seeds",
                "seeds": [0],
                "sft": {"seed": seed},
                "threads": {"sft": threads},
            }
        )
    )
    target = folder / "eval" / "base" / "seed0.summary.json"
    t0 = time.time()
    cmd = [
        "snakemake",
        str(target),
        "--cores",
        str(threads),
        "--nolock",
        "--configfile",
        *configs,
        str(override),
    ]
    with open(folder / "snakemake.log", "w") as log:
        done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False)
    if done.returncode:
        return {
            "seed": seed,
            "threads": threads,
            "error": f"snakemake exited {done.returncode}: {folder}/snakemake.log",
        }
    summary = json.loads(target.read_text())["benchmarks"]["all"]
    bench = folder / "benchmarks" / "sft.tsv"
    sft_s = float(bench.read_text().splitlines()[1].split("\t")[0]) if bench.exists() else float("nan")
    return {
        "seed": seed,
        "threads": threads,
        "greedy": summary["greedy"],
        "avg@4": summary["avg@4"],
        "n": summary["n"],
        "sft_seconds": round(sft_s),
        "wall_seconds": round(time.time() - t0),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="sft.seed values")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="threads.sft values")
    ap.add_argument("--configfile", nargs="+", default=["config/config.yaml"], help="config files, in order")
    ap.add_argument("--out", default="results/sft-seeds", help="one results folder per pair under it")
    ap.add_argument("--parallel", type=int, default=1, help="pairs run side by side (mind the cores)")
    args = ap.parse_args()
    out = Path(args.out)
    pairs = list(itertools.product(args.seeds, args.threads))
    print(f"{len(pairs)} SFT runs, {args.parallel} at a time, under {out}/", flush=True)
    rows = []
    with ThreadPoolExecutor(args.parallel) as pool:
        for row in pool.map(lambda p: run_pair(p[0], p[1], args.configfile, out), pairs):
            rows.append(row)
            print(json.dumps(row), flush=True)
    fields = ["seed", "threads", "greedy", "avg@4", "n", "sft_seconds", "wall_seconds", "error"]
    with open(out / "sft-seeds.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    print(f"\n{'seed':>4} {'threads':>7} {'greedy':>7} {'avg@4':>6} {'SFT s':>6}")
    for r in rows:
        if "error" in r:
            print(f"{r['seed']:>4} {r['threads']:>7}  {r['error']}")
        else:
            scores = f"{r['greedy']:>7.4f} {r['avg@4']:>6.3f} {r['sft_seconds']:>6}"
            print(f"{r['seed']:>4} {r['threads']:>7} {scores}")
    sys.exit(1 if any("error" in r for r in rows) else 0)


if __name__ == "__main__":
    main()
