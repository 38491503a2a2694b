rule report:
    input:
        summaries=expand(
            f"{R}/eval/{{arm}}/seed{{seed}}.summary.json",
            arm=["base", *ARMS],
            seed=SEEDS,
        ),
        # Per-problem records beside each summary (read for the paired comparison).
        records=expand(
            f"{R}/eval/{{arm}}/seed{{seed}}.records.jsonl",
            arm=["base", *ARMS],
            seed=SEEDS,
        ),
        curves=expand(f"{R}/train/{{arm}}/seed{{seed}}/curve.csv", arm=ARMS, seed=SEEDS),
        # Each training step's seconds (accuracy against training compute).
        metrics=expand(f"{R}/train/{{arm}}/seed{{seed}}/metrics.jsonl", arm=ARMS, seed=SEEDS),
    output:
        table=report(TABLE, caption="../report/table.rst", category="Tables"),
        png=report(
            f"{R}/figures/learning_curve.png",
            caption="../report/curves.rst",
            category="Training",
        ),
        pdf=f"{R}/figures/learning_curve.pdf",
        paired=report(f"{R}/paired.csv", caption="../report/paired.rst", category="Tables"),
        compute=report(f"{R}/compute.csv", caption="../report/compute.rst", category="Tables"),
    log:
        f"{R}/logs/report.log",
    conda:
        "../../envs/rredcot.yaml"
    params:
        cfg=PY_CONFIG,
        settings=settings("report"),
    shell:
        "rredcot report --config {params.cfg} --summaries {input.summaries}"
        " --curves {input.curves} --table {output.table} --paired {output.paired}"
        " --metrics {input.metrics} --compute {output.compute}"
        " --figure {output.png} > {log} 2>&1"


# table2 (base vs GRPO- vs RREDCoT-trained, with the paper's quoted values apart) and the cost of each
# credit method and study. Costs are read from the jobs' benchmark files, so this runs last.
rule tables:
    input:
        summaries=expand(
            f"{R}/eval/{{arm}}/seed{{seed}}.summary.json",
            arm=["base", *ARMS],
            seed=SEEDS,
        ),
        curves=expand(f"{R}/train/{{arm}}/seed{{seed}}/curve.csv", arm=ARMS, seed=SEEDS),
        studies=STUDY_FIGURES,
    output:
        table2=report(
            f"{R}/table2.csv", caption="../report/table2.rst", category="Tables"
        ),
        cost=report(f"{R}/cost.csv", caption="../report/cost.rst", category="Tables"),
    log:
        f"{R}/logs/tables.log",
    conda:
        "../../envs/rredcot.yaml"
    params:
        cfg=PY_CONFIG,
        settings=settings("tables"),
        benchmarks=lambda wc, input: Path(input.curves[0]).parents[3] / "benchmarks",
        train=lambda wc, input: Path(input.curves[0]).parents[2],
        bench=lambda wc: (
            f"--bench {R}/bench/credit.json"
            if Path(f"{R}/bench/credit.json").is_file()
            else ""
        ),
    shell:
        "rredcot tables --config {params.cfg} --summaries {input.summaries}"
        " --table2 {output.table2} --cost {output.cost} --benchmarks-dir {params.benchmarks}"
        " --train-dir {params.train} {params.bench} > {log} 2>&1"


# The paper's claims, each with the measured value, its interval and a verdict on this run.
rule claims:
    input:
        paired=f"{R}/paired.csv",
        compute=f"{R}/compute.csv",
        cost=f"{R}/cost.csv",
        truncation=f"{FIG}/fig3_truncation.csv",
        attribution=f"{FIG}/fig4_attribution_correlation.csv",
        prm=f"{FIG}/fig5_prm_vs_nll.csv",
        variance=f"{FIG}/fig7_mc_variance.csv",
        localisation=STUDY_LOCALISATION,
        # Every credit method against the exact values (synthetic task).
        fidelity=STUDY_FIDELITY[:1],
        # The local PRM, whose validation says whether it learned step values (the PRM claim).
        prm_model=prm_model,
    output:
        csv=report(f"{R}/claims.csv", caption="../report/claims.rst", category="Tables"),
        md=f"{R}/claims.md",
        # The methods side by side: accuracy, fidelity, cost and the verdicts of each one's claims.
        methods=report(f"{R}/methods.csv", caption="../report/methods.rst", category="Tables"),
    log:
        f"{R}/logs/claims.log",
    benchmark:
        f"{R}/benchmarks/claims.tsv"
    conda:
        "../../envs/rredcot.yaml"
    params:
        cfg=PY_CONFIG,
        settings=settings("claims"),
        localisation=lambda wc, input: (
            f"--localisation {input.localisation}" if input.localisation else ""
        ),
        prm_model=lambda wc, input: f"--prm-model {input.prm_model}" if input.prm_model else "",
        fidelity=lambda wc, input: f"--fidelity {input.fidelity}" if input.fidelity else "",
    shell:
        "rredcot claims --config {params.cfg} --paired {input.paired} --compute {input.compute}"
        " --cost {input.cost}"
        " --truncation {input.truncation} --attribution {input.attribution} --prm {input.prm}"
        " --variance {input.variance} {params.localisation} {params.prm_model} {params.fidelity}"
        " --csv {output.csv} --md {output.md} --methods {output.methods}"
        " > {log} 2>&1"
