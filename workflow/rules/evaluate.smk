rule evaluate:
    input:
        model=model_dir,
        data=f"{R}/data/test.jsonl",
    output:
        records=f"{R}/eval/{{arm}}/seed{{seed}}.records.jsonl",
        summary=f"{R}/eval/{{arm}}/seed{{seed}}.summary.json",
    params:
        cfg=PY_CONFIG,
        section=config["eval"],
    wildcard_constraints:
        arm="|".join(["base", *ARMS]),
    threads: config["threads"]["eval"]
    log:
        f"{R}/logs/eval/{{arm}}/seed{{seed}}.log",
    benchmark:
        f"{R}/benchmarks/eval/{{arm}}/seed{{seed}}.tsv"
    conda:
        "../../envs/rredcot.yaml"
    shell:
        "rredcot evaluate --config {params.cfg} --model {input.model} --data {input.data}"
        " --out {output.records} --summary {output.summary}"
        " --arm {wildcards.arm} --seed {wildcards.seed} > {log} 2>&1"
