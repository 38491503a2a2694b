rule sft:
    input:
        f"{R}/data/sft.jsonl",
    output:
        directory(f"{R}/models/sft"),
    log:
        f"{R}/logs/sft.log",
    benchmark:
        f"{R}/benchmarks/sft.tsv"
    conda:
        "../../envs/rredcot.yaml"
    threads: launch_threads("sft")
    resources:
        **launch_resources(),
    params:
        cfg=PY_CONFIG,
        settings=settings("sft"),
        # Not an output: Snakemake deletes a failed job's outputs, and a rerun resumes from these.
        checkpoints=f"{R}/checkpoints/sft",
    shell:
        # exec: the launcher replaces the job's shell, which would end on SLURM's SIGTERM before the
        # stage saves its checkpoint (docs/resume.md, "Preemption and time limits").
        "exec rredcot launch sft --config {params.cfg} --data {input} --out {output}"
        " --checkpoint-dir {params.checkpoints} > {log} 2>&1"
