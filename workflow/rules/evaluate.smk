rule evaluate:
    input:
        model=model_dir,
        data=eval_data,
    output:
        records=f"{R}/eval/{{arm}}/seed{{seed}}.records.jsonl",
        summary=f"{R}/eval/{{arm}}/seed{{seed}}.summary.json",
    log:
        f"{R}/logs/eval/{{arm}}/seed{{seed}}.log",
    benchmark:
        f"{R}/benchmarks/eval/{{arm}}/seed{{seed}}.tsv"
    wildcard_constraints:
        arm="|".join(["base", *ARMS]),
    conda:
        "../../envs/rredcot.yaml"
    threads: config["threads"]["eval"]
    params:
        cfg=PY_CONFIG,
        settings=settings("evaluate"),
        model=model_arg,
    shell:
        "rredcot evaluate --config {params.cfg} --model {params.model} --data {input.data}"
        " --out {output.records} --summary {output.summary}"
        " --arm {wildcards.arm} --seed {wildcards.seed} > {log} 2>&1"
