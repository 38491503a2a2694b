rule train:
    input:
        model=f"{R}/models/sft",
        data=f"{R}/data/rl.clean.jsonl",
        heldout=f"{R}/data/test.jsonl",
    output:
        model=directory(f"{R}/train/{{arm}}/seed{{seed}}/model"),
        curve=f"{R}/train/{{arm}}/seed{{seed}}/curve.csv",
    params:
        cfg=PY_CONFIG,
        arm=lambda wc: config["arms"][wc.arm],
        rl=config["rl"],
        credit=config["credit"],
        out=lambda wc: f"{R}/train/{wc.arm}/seed{wc.seed}",
    threads: config["threads"]["train"]
    log:
        f"{R}/logs/train/{{arm}}/seed{{seed}}.log",
    benchmark:
        f"{R}/benchmarks/train/{{arm}}/seed{{seed}}.tsv"
    conda:
        "../../envs/rredcot.yaml"
    shell:
        "rredcot train --config {params.cfg} --arm {wildcards.arm} --seed {wildcards.seed}"
        " --model {input.model} --data {input.data} --eval-data {input.heldout}"
        " --out {params.out} > {log} 2>&1"
