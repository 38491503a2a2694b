rule report:
    input:
        summaries=expand(
            f"{R}/eval/{{arm}}/seed{{seed}}.summary.json", arm=["base", *ARMS], seed=SEEDS
        ),
        curves=expand(f"{R}/train/{{arm}}/seed{{seed}}/curve.csv", arm=ARMS, seed=SEEDS),
    output:
        table=f"{R}/table1.csv",
        png=f"{R}/figures/learning_curve.png",
        pdf=f"{R}/figures/learning_curve.pdf",
    params:
        cfg=PY_CONFIG,
    log:
        f"{R}/logs/report.log",
    conda:
        "../../envs/rredcot.yaml"
    shell:
        "rredcot report --config {params.cfg} --summaries {input.summaries}"
        " --curves {input.curves} --table {output.table} --figure {output.png} > {log} 2>&1"
