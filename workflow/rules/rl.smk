rule train:
    input:
        model=start_model_input,
        data=f"{R}/data/rl.clean.jsonl",
        heldout=f"{R}/data/test.jsonl",
    output:
        model=directory(f"{R}/train/{{arm}}/seed{{seed}}/model"),
        curve=f"{R}/train/{{arm}}/seed{{seed}}/curve.csv",
        # Per-step training metrics; the report reads each step's seconds (compute.csv).
        metrics=f"{R}/train/{{arm}}/seed{{seed}}/metrics.jsonl",
    log:
        f"{R}/logs/train/{{arm}}/seed{{seed}}.log",
    benchmark:
        f"{R}/benchmarks/train/{{arm}}/seed{{seed}}.tsv"
    conda:
        "../../envs/rredcot.yaml"
    threads: launch_threads("train")
    resources:
        **launch_resources(),
    params:
        cfg=PY_CONFIG,
        model=START_MODEL,
        settings=settings("train"),
        out=lambda wc: f"{R}/train/{wc.arm}/seed{wc.seed}",
        # Not an output: Snakemake deletes a failed job's outputs, and a rerun resumes from these.
        checkpoints=lambda wc: f"{R}/checkpoints/train/{wc.arm}/seed{wc.seed}",
    shell:
        # exec: the launcher replaces the job's shell, which would end on SLURM's SIGTERM before the
        # stage saves its checkpoint (docs/resume.md, "Preemption and time limits").
        "exec rredcot launch train --config {params.cfg} --arm {wildcards.arm} --seed {wildcards.seed}"
        " --model {params.model} --data {input.data} --eval-data {input.heldout}"
        " --out {params.out} --checkpoint-dir {params.checkpoints} > {log} 2>&1"
