"""The project's tools: commands a user runs by hand, beside the pipeline's stages.

``launch`` starts a stage on the job's processes and GPUs, ``config`` writes and shows the config,
``tracking`` opens the MLflow UI, lists runs and serves a tracking server, ``datasets`` exports a
registry dataset, ``credit_view`` pictures the credit of a trace file, and ``bench``,
``bench_memory`` and ``gpu_check`` measure the cost and memory of the credit passes.
"""
