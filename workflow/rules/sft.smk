rule sft:
    input:
        f"{R}/data/sft.jsonl",
    output:
        directory(f"{R}/models/sft"),
    params:
        cfg=PY_CONFIG,
        model=config["model"],
        sft=config["sft"],
    threads: config["threads"]["sft"]
    log:
        f"{R}/logs/sft.log",
    benchmark:
        f"{R}/benchmarks/sft.tsv"
    conda:
        "../../envs/rredcot.yaml"
    shell:
        "rredcot sft --config {params.cfg} --data {input} --out {output} > {log} 2>&1"
