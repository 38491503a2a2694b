"""Loading and validating the workflow configuration.

One schema (``schemas/config.schema.yaml``, shared with the Snakefile) describes every key. Configs are
layered: later files override earlier ones key by key, so ``config/smoke.yaml`` only names what it
shrinks. Validation fills schema defaults and fails before any work starts, naming the offending key.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml


class ConfigError(ValueError):
    """A configuration that does not match the schema; the message names the bad key."""


def schema() -> dict[str, Any]:
    """The configuration JSON schema (a dict)."""
    text = resources.files("rredcot").joinpath("schemas/config.schema.yaml").read_text()
    return yaml.safe_load(text)


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Recursively merge ``override`` into a copy of ``base`` (dicts merge, everything else replaces)."""
    merged = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _fill_defaults(node: dict[str, Any], instance: Any) -> None:
    """Insert schema defaults for absent keys, recursing into nested objects and arm entries."""
    if not isinstance(instance, dict):
        return
    for key, sub in node.get("properties", {}).items():
        if key not in instance and "default" in sub:
            instance[key] = copy.deepcopy(sub["default"])
        if key not in instance and sub.get("type") == "object" and "properties" in sub:
            instance[key] = {}
        if key in instance:
            _fill_defaults(sub, instance[key])
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        for key, value in instance.items():
            if key not in node.get("properties", {}):
                _fill_defaults(extra, value)


def validate(config: Mapping[str, Any]) -> dict[str, Any]:
    """Return a validated copy of ``config`` with defaults filled in, or raise :class:`ConfigError`."""
    cfg = copy.deepcopy(dict(config))
    sch = schema()
    _fill_defaults(sch, cfg)
    errors = sorted(jsonschema.Draft202012Validator(sch).iter_errors(cfg), key=lambda e: list(e.path))
    if errors:
        lines = []
        for err in errors:
            where = ".".join(str(p) for p in err.absolute_path) or "<top level>"
            lines.append(f"  {where}: {err.message}")
        raise ConfigError("invalid configuration:\n" + "\n".join(lines))
    _check_consistency(cfg)
    return cfg


def _check_consistency(cfg: dict[str, Any]) -> None:
    """Cross-field rules that a JSON schema cannot say."""
    model = cfg["model"]
    if model["kind"] == "pretrained" and not model.get("name_or_path"):
        raise ConfigError(
            "invalid configuration:\n  model.name_or_path: required when model.kind is pretrained"
        )
    if model["kind"] == "scratch" and model["hidden_size"] % model["num_heads"]:
        raise ConfigError("invalid configuration:\n  model.hidden_size: must be divisible by model.num_heads")
    if model["kind"] == "scratch" and model["num_heads"] % model["num_kv_heads"]:
        raise ConfigError("invalid configuration:\n  model.num_kv_heads: must divide model.num_heads")
    unknown = [a for a in cfg.get("run_arms", []) if a not in cfg["arms"]]
    if unknown:
        raise ConfigError(f"invalid configuration:\n  run_arms: unknown arm(s) {', '.join(unknown)}")
    data = cfg["data"]
    if data["kind"] == "synthetic" and "synthetic" not in data:
        data["synthetic"] = {}
    if data["kind"] == "datasets":
        for key in ("train", "heldout"):
            if key not in data:
                raise ConfigError(f"invalid configuration:\n  data.{key}: required for data.kind datasets")
        if not data["benchmarks"]:
            raise ConfigError("invalid configuration:\n  data.benchmarks: name at least one benchmark")
        if cfg["sft"]["enabled"]:
            raise ConfigError(
                "invalid configuration:\n  sft.enabled: real datasets have no SFT split; set it to false"
            )
    if not cfg["sft"]["enabled"] and model["kind"] != "pretrained":
        raise ConfigError("invalid configuration:\n  sft.enabled: false needs model.kind pretrained")


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
        merged = deep_merge(merged, data)
    if overrides:
        merged = deep_merge(merged, overrides)
    return validate(merged)


def active_arms(cfg: Mapping[str, Any]) -> list[str]:
    """The arms a run trains and reports, in table order: ``run_arms``, else every configured arm."""
    return list(cfg.get("run_arms") or cfg["arms"])


def arm_label(cfg: Mapping[str, Any], arm: str) -> str:
    """Display name of an arm in tables and figures."""
    return cfg["arms"][arm].get("label") or arm
