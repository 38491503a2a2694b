rule data:
    output:
        sft=f"{R}/data/sft.jsonl",
        rl=f"{R}/data/rl.jsonl",
        test=f"{R}/data/test.jsonl",
    params:
        cfg=PY_CONFIG,
        section=config["data"],
        out_dir=lambda wildcards, output: Path(output.sft).parent,
    log:
        f"{R}/logs/data.log",
    conda:
        "../../envs/rredcot.yaml"
    shell:
        "rredcot data --config {params.cfg} --out-dir {params.out_dir} > {log} 2>&1"


rule clean:
    input:
        f"{R}/data/rl.jsonl",
    output:
        clean=f"{R}/data/rl.clean.jsonl",
        flags=f"{R}/clean/rl.flags.jsonl",
        report=f"{R}/clean/report.json",
    params:
        cfg=PY_CONFIG,
        section=config["clean"],
    log:
        f"{R}/logs/clean.log",
    conda:
        "../../envs/rredcot.yaml"
    shell:
        "rredcot clean {input} --out {output.clean} --flags {output.flags}"
        " --report {output.report} --config {params.cfg} > {log} 2>&1"
