# A pretrained model from a GGUF file in an installed package (model.gguf), converted once into a
# checkpoint of this workflow: the SFT warm-up, or RL when sft.enabled is false, starts from it.
if config["model"]["gguf"]:

    rule model:
        output:
            directory(PRETRAINED),
        log:
            f"{R}/logs/model.log",
        benchmark:
            f"{R}/benchmarks/model.tsv"
        conda:
            "../../envs/rredcot.yaml"
        params:
            cfg=PY_CONFIG,
            settings=settings("model"),
        shell:
            "rredcot model --config {params.cfg} --out {output} > {log} 2>&1"


rule sft:
    input:
        data=f"{R}/data/sft.jsonl",
        pretrained=PRETRAINED_INPUT,
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
        "exec rredcot launch sft --config {params.cfg} --data {input.data} --out {output}"
        " --checkpoint-dir {params.checkpoints} > {log} 2>&1"
