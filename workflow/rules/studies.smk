# The paper's analyses on traces of the model RL starts from (Figures 3-7); paths and helpers are in
# common.smk. `analysis` traces come from the held-out problems (the benchmarks at full scale);
# `prm` traces, from the RL split, only train the small process reward model, so that it never
# scores the traces it learned from; `prm_analysis` traces, one each of the study split's fresh
# problems, are what it scores when studies.prm.analysis_problems is set. Each command gets files and the trace set only: a study reads
# its settings from the config file, the ones rredcot.settings.reads lists for it (the `settings`
# param), so a changed setting reruns exactly the jobs that read it.


rule study_traces:
    input:
        model=start_model_input,
        data=study_data,
    output:
        f"{STUDY}/{{set}}/traces.jsonl",
    log:
        f"{R}/logs/studies/{{set}}/traces.log",
    benchmark:
        f"{R}/benchmarks/studies/traces_{{set}}.tsv"
    wildcard_constraints:
        set="analysis|prm|localisation|prm_analysis",
    conda:
        "../../envs/rredcot.yaml"
    threads: config["threads"]["eval"]
    params:
        cfg=PY_CONFIG,
        model=START_MODEL,
        settings=settings("study_traces"),
    shell:
        "rredcot study-traces --config {params.cfg} --set {wildcards.set} --model {params.model}"
        " --data {input.data} --out {output} > {log} 2>&1"


rule study_mc:
    input:
        model=start_model_input,
        traces=f"{STUDY}/{{set}}/traces.jsonl",
    output:
        mc=f"{STUDY}/{{set}}/mc.jsonl",
        stats=f"{STUDY}/{{set}}/mc.stats.json",
    log:
        f"{R}/logs/studies/{{set}}/mc.log",
    benchmark:
        f"{R}/benchmarks/studies/mc_{{set}}.tsv"
    wildcard_constraints:
        set="analysis|prm",
    conda:
        "../../envs/rredcot.yaml"
    threads: config["threads"]["eval"]
    params:
        cfg=PY_CONFIG,
        model=START_MODEL,
        settings=settings("study_mc"),
    shell:
        "rredcot study-mc --config {params.cfg} --model {params.model} --traces {input.traces}"
        " --out {output.mc} --stats {output.stats} > {log} 2>&1"


rule study_mc_figures:
    input:
        traces=f"{STUDY}/analysis/traces.jsonl",
        mc=f"{STUDY}/analysis/mc.jsonl",
        stats=f"{STUDY}/analysis/mc.stats.json",
    output:
        fig3=report(
            f"{FIG}/fig3_truncation.png",
            caption="../report/fig3.rst",
            category="Studies",
        ),
        fig3_pdf=f"{FIG}/fig3_truncation.pdf",
        fig3_csv=f"{FIG}/fig3_truncation.csv",
        fig7=report(
            f"{FIG}/fig7_mc_variance.png",
            caption="../report/fig7.rst",
            category="Studies",
        ),
        fig7_pdf=f"{FIG}/fig7_mc_variance.pdf",
        fig7_csv=f"{FIG}/fig7_mc_variance.csv",
    log:
        f"{R}/logs/studies/mc_figures.log",
    conda:
        "../../envs/rredcot.yaml"
    params:
        cfg=PY_CONFIG,
        settings=settings("study_mc_figures"),
        out_dir=lambda wc, output: Path(output.fig3).parent,
    shell:
        "rredcot study-mc-figures --config {params.cfg} --traces {input.traces} --mc {input.mc}"
        " --mc-stats {input.stats} --out-dir {params.out_dir} > {log} 2>&1"


rule study_attribution:
    input:
        model=start_model_input,
        traces=f"{STUDY}/analysis/traces.jsonl",
        mc=f"{STUDY}/analysis/mc.jsonl",
    output:
        f"{STUDY}/analysis/attributions.jsonl",
    log:
        f"{R}/logs/studies/attribution.log",
    benchmark:
        f"{R}/benchmarks/studies/attribution.tsv"
    conda:
        "../../envs/rredcot.yaml"
    threads: config["threads"]["eval"]
    params:
        cfg=PY_CONFIG,
        model=START_MODEL,
        settings=settings("study_attribution"),
    shell:
        "rredcot study-attribution --config {params.cfg} --model {params.model}"
        " --traces {input.traces} --mc {input.mc} --out {output} > {log} 2>&1"


rule study_prm_train:
    input:
        model=start_model_input,
        traces=f"{STUDY}/prm/traces.jsonl",
        mc=f"{STUDY}/prm/mc.jsonl",
    output:
        directory(f"{STUDY}/prm/model"),
    log:
        f"{R}/logs/studies/prm_train.log",
    benchmark:
        f"{R}/benchmarks/studies/prm_train.tsv"
    conda:
        "../../envs/rredcot.yaml"
    threads: config["threads"]["train"]
    params:
        cfg=PY_CONFIG,
        model=START_MODEL,
        settings=settings("study_prm_train"),
    shell:
        "rredcot study-prm-train --config {params.cfg} --model {params.model} --traces {input.traces}"
        " --mc {input.mc} --out {output} > {log} 2>&1"


rule study_prm:
    input:
        prm=prm_model,
        traces=f"{STUDY}/{PRM_SET}/traces.jsonl",
    output:
        f"{STUDY}/{PRM_SET}/prm.jsonl",
    log:
        f"{R}/logs/studies/prm.log",
    benchmark:
        f"{R}/benchmarks/studies/prm.tsv"
    conda:
        "../../envs/rredcot.yaml"
    threads: config["threads"]["eval"]
    params:
        cfg=PY_CONFIG,
        settings=settings("study_prm"),
        # The PRM trained here (kind local); a hub PRM is the config's studies.prm.name_or_path.
        prm=lambda wc, input: f"--prm {input.prm[0]}" if input.prm else "",
    shell:
        "rredcot study-prm --config {params.cfg} {params.prm} --traces {input.traces}"
        " --out {output} > {log} 2>&1"


rule study_attr_figures:
    input:
        attributions=f"{STUDY}/analysis/attributions.jsonl",
        prm=f"{STUDY}/{PRM_SET}/prm.jsonl",
    output:
        fig4=report(
            f"{FIG}/fig4_attribution_correlation.png",
            caption="../report/fig4.rst",
            category="Studies",
        ),
        fig4_pdf=f"{FIG}/fig4_attribution_correlation.pdf",
        fig4_csv=f"{FIG}/fig4_attribution_correlation.csv",
        fig4_value=f"{FIG}/fig4_attribution_correlation_value.png",
        fig4_value_pdf=f"{FIG}/fig4_attribution_correlation_value.pdf",
        fig4_value_csv=f"{FIG}/fig4_attribution_correlation_value.csv",
        fig5=report(
            f"{FIG}/fig5_prm_vs_nll.png",
            caption="../report/fig5.rst",
            category="Studies",
        ),
        fig5_pdf=f"{FIG}/fig5_prm_vs_nll.pdf",
        fig5_csv=f"{FIG}/fig5_prm_vs_nll.csv",
        fig6=report(
            f"{FIG}/fig6_prm_vs_rredcot.png",
            caption="../report/fig6.rst",
            category="Studies",
        ),
        fig6_pdf=f"{FIG}/fig6_prm_vs_rredcot.pdf",
        fig6_csv=f"{FIG}/fig6_prm_vs_rredcot.csv",
    log:
        f"{R}/logs/studies/attr_figures.log",
    conda:
        "../../envs/rredcot.yaml"
    params:
        cfg=PY_CONFIG,
        settings=settings("study_attr_figures"),
        out_dir=lambda wc, output: Path(output.fig4).parent,
    shell:
        "rredcot study-attr-figures --config {params.cfg} --attributions {input.attributions}"
        " --prm {input.prm} --out-dir {params.out_dir} > {log} 2>&1"


# Where the blame of wrong traces lands, checked against the step where each goes wrong; only the
# synthetic task says which step that is.
rule study_localisation:
    input:
        traces=f"{STUDY}/localisation/traces.jsonl",
    output:
        summary=f"{STUDY}/localisation/localisation.json",
        views=directory(f"{STUDY}/localisation/views"),
    log:
        f"{R}/logs/studies/localisation.log",
    benchmark:
        f"{R}/benchmarks/studies/localisation.tsv"
    conda:
        "../../envs/rredcot.yaml"
    params:
        cfg=PY_CONFIG,
        settings=settings("study_localisation"),
    shell:
        "rredcot study-localisation --config {params.cfg} --traces {input.traces}"
        " --out {output.summary} --views {output.views} > {log} 2>&1"


# Every registered credit method on the analysis traces, judged by the exact values of the synthetic
# task, with its cost (Monte Carlo credit at each of studies.fidelity.mc_samples).
STUDY_FIDELITY = (
    [f"{STUDY}/analysis/fidelity.json", f"{FIG}/fidelity_cost.csv", f"{FIG}/fidelity_cost.png"]
    if SYNTHETIC
    else []
)


rule study_fidelity:
    input:
        model=start_model_input,
        traces=f"{STUDY}/analysis/traces.jsonl",
        data=eval_data,
    output:
        json=f"{STUDY}/analysis/fidelity.json",
        csv=f"{FIG}/fidelity_cost.csv",
        png=report(
            f"{FIG}/fidelity_cost.png",
            caption="../report/fidelity.rst",
            category="Studies",
        ),
        pdf=f"{FIG}/fidelity_cost.pdf",
    log:
        f"{R}/logs/studies/fidelity.log",
    benchmark:
        f"{R}/benchmarks/studies/fidelity.tsv"
    conda:
        "../../envs/rredcot.yaml"
    threads: config["threads"]["eval"]
    params:
        cfg=PY_CONFIG,
        model=START_MODEL,
        settings=settings("study_fidelity"),
    shell:
        "rredcot study-fidelity --config {params.cfg} --model {params.model} --traces {input.traces}"
        " --data {input.data} --json {output.json} --csv {output.csv} --figure {output.png} > {log} 2>&1"
