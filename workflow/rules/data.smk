# Training and evaluation data. The synthetic task writes all three splits in one job; real datasets
# (data.kind: datasets) are fetched one file each: rl = data.train, test = data.heldout and
# bench/NAME = data.benchmarks.NAME.
if SYNTHETIC:

    rule data:
        output:
            sft=f"{R}/data/sft.jsonl",
            rl=f"{R}/data/rl.jsonl",
            test=f"{R}/data/test.jsonl",
        log:
            f"{R}/logs/data.log",
        conda:
            "../../envs/rredcot.yaml"
        params:
            cfg=PY_CONFIG,
            settings=settings("data"),
            out_dir=lambda wildcards, output: Path(output.sft).parent,
        shell:
            "rredcot data --config {params.cfg} --out-dir {params.out_dir} > {log} 2>&1"

    # Fresh problems for the PRM study alone (studies.prm.analysis_problems), disjoint from the three
    # splits and written by a job of their own, so that sizing the study leaves the splits untouched.
    rule study_problems:
        output:
            f"{R}/data/study.jsonl",
        log:
            f"{R}/logs/study_problems.log",
        benchmark:
            f"{R}/benchmarks/study_problems.tsv"
        conda:
            "../../envs/rredcot.yaml"
        params:
            cfg=PY_CONFIG,
            settings=settings("study_problems"),
        shell:
            "rredcot study-problems --config {params.cfg} --out {output} > {log} 2>&1"

else:

    rule fetch:
        output:
            f"{R}/data/{{dataset}}.jsonl",
        log:
            f"{R}/logs/fetch/{{dataset}}.log",
        wildcard_constraints:
            dataset="rl|test|bench/[A-Za-z0-9_.-]+",
        conda:
            "../../envs/rredcot.yaml"
        params:
            cfg=PY_CONFIG,
            name=lambda wc: fetch_name(wc.dataset),
            settings=settings("fetch"),
        shell:
            "rredcot fetch --config {params.cfg} --dataset {params.name} --out {output} > {log} 2>&1"


rule clean:
    input:
        data=f"{R}/data/rl.jsonl",
        eval_sets=lambda wc: [] if SYNTHETIC else eval_data(wc),
    output:
        clean=f"{R}/data/rl.clean.jsonl",
        flags=f"{R}/clean/rl.flags.jsonl",
        report=f"{R}/clean/report.json",
    log:
        f"{R}/logs/clean.log",
    conda:
        "../../envs/rredcot.yaml"
    params:
        cfg=PY_CONFIG,
        settings=settings("clean"),
        eval_flag=lambda wc, input: (
            f"--eval-sets {' '.join(input.eval_sets)}" if input.eval_sets else ""
        ),
    shell:
        "rredcot clean {input.data} --out {output.clean} --flags {output.flags}"
        " --report {output.report} --config {params.cfg} {params.eval_flag} > {log} 2>&1"
