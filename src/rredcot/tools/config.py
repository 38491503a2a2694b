"""``rredcot config``: the files derived from the settings tree, and a look at a resolved config.

    rredcot config --write            # config/config.yaml, config/README.md and the JSON schema, from
                                      # the dataclasses of rredcot.settings.config (the one home of defaults)
    rredcot config --check            # exit 1 if any of them is stale (CI runs the test that does this)
    rredcot config --show C [C ...]   # the resolved config of these files, every default filled in

``config/config.yaml`` is the embedded default written out in full, with each key's documentation
as a comment; ``config/README.md`` documents every key (type, default, meaning) by section;
``src/rredcot/schemas/config.schema.yaml`` is the JSON schema. None of them is edited by hand.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from rredcot.infra.typed import field_docs, json_schema, to_dict
from rredcot.settings.config import ExperimentConfig, load_config, schema
from rredcot.settings.reads import READS

ROOT = Path(__file__).resolve().parents[3]
CONFIG_YAML = ROOT / "config" / "config.yaml"
CONFIG_README = ROOT / "config" / "README.md"
SCHEMA_YAML = Path(__file__).resolve().parents[1] / "schemas" / "config.schema.yaml"
WIDTH = 100


def _scalar(value: Any) -> str:
    """A YAML scalar or flow collection (JSON is YAML). A float in exponent form gets a dot in its
    mantissa (``1.0e-06``): YAML 1.1 reads ``1e-06`` as text."""
    text = json.dumps(value, ensure_ascii=False)
    if isinstance(value, float) and "e" in text and "." not in text:
        mantissa, exponent = text.split("e")
        return f"{mantissa}.0e{exponent}"
    return text


def _comment(text: str, indent: str) -> list[str]:
    return [f"{indent}# {line}" for line in textwrap.wrap(text, WIDTH - len(indent) - 2)]


def _yaml_lines(obj: Any, indent: str = "") -> list[str]:
    """``obj`` (a settings instance) as commented block YAML."""
    docs = field_docs(type(obj))
    lines: list[str] = []
    for f in dataclasses.fields(obj):
        if not f.init:
            continue
        value = getattr(obj, f.name)
        lines += _comment(docs.get(f.name, ""), indent) if f.name in docs else []
        if dataclasses.is_dataclass(value):
            lines.append(f"{indent}{f.name}:")
            lines += _yaml_lines(value, indent + "  ")
        elif isinstance(value, dict) and value and all(dataclasses.is_dataclass(v) for v in value.values()):
            lines.append(f"{indent}{f.name}:")
            for key, item in value.items():
                lines.append(f"{indent}  {key}:")
                lines += [
                    f"{indent}    {k}: {_scalar(v)}"
                    for k, v in to_dict(item).items()
                    if v not in (None, {}, [])
                ]
        else:
            lines.append(f"{indent}{f.name}: {_scalar(to_dict(value))}")
    return lines


def render_yaml() -> str:
    head = [
        "# The default config: the whole pipeline on a 2-core CPU with no downloads. A synthetic",
        "# multi-step arithmetic task, a tokenizer and a small Qwen2 model trained locally, and three",
        "# training methods (GRPO, RREDCoT, the oracle) over four seeds: a quick run, not a verdict",
        "# (config/testbed.yaml decides). Written by `rredcot config --write` from the settings tree",
        "# (src/rredcot/settings/config.py and the method's own config classes): edit those, not this file.",
        "# Other config files override it key by key; every key is documented in config/README.md.",
        "",
    ]
    return "\n".join(head + _yaml_lines(ExperimentConfig())) + "\n"


_BOUNDS = {"minimum": ">= ", "exclusiveMinimum": "> ", "maximum": "<= "}


def _type_text(node: dict[str, Any], inner: bool = False) -> str:
    """A schema node's type in words, with its rules: in parentheses, or run on for the items of a
    list or the values of a mapping (``list of integer >= 0 (at least 1 item)``)."""
    if "enum" in node:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in node["enum"])
    kind = node.get("type", "any")
    if "anyOf" in node:
        text = " or ".join(_type_text(n, inner) for n in node["anyOf"])
    elif kind == "array":
        text = f"list of {_type_text(node.get('items', {}), inner=True)}"
    elif kind == "object" and node.get("additionalProperties", False) is not False:
        text = f"mapping to {_type_text(node['additionalProperties'], inner=True)}"
    else:
        text = {"null": "null", "object": "mapping"}.get(kind, kind)
    rules = [f"{name}{node[k]}" for k, name in _BOUNDS.items() if k in node]
    if "pattern" in node:
        rules.append("not blank" if node["pattern"] == r"\S" else f"matching `{node['pattern']}`")
    least, most = node.get("minItems"), node.get("maxItems")
    if least is not None and least == most:
        rules.append(f"exactly {least} item{'s' * (least != 1)}")
    else:
        if least is not None:
            rules.append(f"at least {least} item{'s' * (least != 1)}")
        if most is not None:
            rules.append(f"at most {most} item{'s' * (most != 1)}")
    if node.get("uniqueItems"):
        rules.append("no repeats")
    if not rules:
        return text
    return f"{text} {' '.join(rules)}" if inner else f"{text} ({', '.join(rules)})"


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _overlay_names() -> list[str]:
    """The config files beside the default that override it: every YAML file under config/ but the
    default itself, the dataset registry and accelerate's launch configs."""
    folder = CONFIG_YAML.parent
    return sorted(
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*.yaml")
        if p.name not in {"config.yaml", "datasets.yaml"} and p.parent.name != "accelerate"
    )


def render_readme() -> str:
    root = json_schema(ExperimentConfig)
    overlays = ", ".join(f"`{name}`" for name in _overlay_names())
    out = [
        "# Configuration",
        "",
        "Written by `rredcot config --write` from the settings tree (`src/rredcot/settings/config.py` and",
        "the method's own config classes: `CreditSettings`, `SegmentationConfig`, `ScoringBudget`,",
        "`TaskConfig`, `CleanSettings`); do not edit by hand. `config/config.yaml` is the default config",
        f"with every key; the other files here ({overlays}), each headed by what it is for, override",
        "it key by key (`snakemake --configfile FILE`), and `--config key=value` overrides single",
        "keys. `datasets.yaml` is the dataset registry (`data.registry`) and `accelerate/` holds",
        "accelerate's launch configs. A bad key or value fails before any job runs, naming it.",
        "`rredcot config --show FILE` prints a resolved config.",
        "",
    ]

    def section(path: str, node: dict[str, Any], level: int) -> None:
        rows, subsections = [], []
        for key, sub in node["properties"].items():
            name = f"{path}.{key}" if path else key
            if sub.get("type") == "object" and "properties" in sub:
                subsections.append((name, sub))
                continue
            default = (
                "*(required)*" if key in node.get("required", []) else f"`{json.dumps(sub.get('default'))}`"
            )
            rows.append(
                f"| `{name}` | {_type_text(sub)} | {default} | {_md_cell(sub.get('description', ''))} |"
            )
        if rows:
            out.extend(["| key | type | default | meaning |", "|---|---|---|---|", *rows, ""])
        for name, sub in subsections:
            out.extend([f"{'#' * level} `{name}`", "", sub.get("description", ""), ""])
            section(name, sub, min(level + 1, 4))

    section("", root, 2)
    arm = root["properties"]["arms"]["additionalProperties"]
    out.extend(["## Each training method (`arms.<name>`)", "", arm.get("description", ""), ""])
    section("arms.<name>", arm, 3)
    out.extend(_reads_section())
    return "\n".join(out).rstrip() + "\n"


def _credit_reads() -> list[str]:
    """What each registered credit method reads of the ``credit`` section (``CreditSettings.read_by``)
    and which training methods of the default config use it, drawn from the registry."""
    import rredcot.method.sources  # noqa: F401  (registers the built-in methods)
    from rredcot.method.registry import CREDIT_METHODS
    from rredcot.method.settings import CreditSettings

    arms = to_dict(ExperimentConfig())["arms"]
    reads = {name: CreditSettings.read_by(method) for name, method in CREDIT_METHODS.items()}
    lines = [
        "| credit method | reads under `credit` | training methods of the default config that use it |",
        "|---|---|---|",
    ]
    for name, keys in reads.items():
        used = [arm for arm, spec in arms.items() if spec["credit"] == name]
        shown = ", ".join(f"`{k}`" for k in keys) or "(none: TRL's advantages stay as they are)"
        lines.append(f"| `{name}` | {shown} | {', '.join(f'`{a}`' for a in used) or '(none)'} |")
    sections = [
        f"`credit.{key}` only those of "
        + " or ".join(f"`{name}`" for name, keys in reads.items() if key in keys)
        for key in ("mc", "spo", "prime")
    ]
    return [
        *lines,
        "",
        "Changing "
        + sections[0].replace(" only those of ", " retrains only the arms whose credit method is ")
        + f", {', '.join(sections[1:])}; the other arms' `train` jobs stay as they were.",
        "",
    ]


def _reads_section() -> list[str]:
    """Which settings each workflow stage reads (rredcot.settings.reads), and what each credit method
    reads of the ``credit`` section."""
    lines = [
        "## Which settings each stage reads",
        "",
        "A rule's `params` hold the settings its stage computes with, so changing one reruns exactly",
        "the jobs that read it (and what depends on them); a stage that reads a setting it does not",
        "declare fails. Settings under *runs only* are read but cannot change the outputs: changing",
        "them reruns nothing. `{arm}` is the job's training method (its name under `arms`); a key",
        "names the whole section under it. `credit.<what the arm reads>` are the credit settings the",
        "arm's credit method depends on (`CreditSettings.read_by`), listed per method below the table.",
        "",
        "| stage | computes with | runs only |",
        "|---|---|---|",
    ]
    for stage, reads in READS.items():
        computes = [f"`{k}`" for k in reads.computes]
        computes += [f"`{k}` ({v})" for v, keys in reads.variants.items() for k in keys]
        runs = ", ".join(f"`{k}`" for k in reads.runs)
        lines.append(f"| `{stage}` | {', '.join(computes) or '(none)'} | {runs} |")
    return [*lines, "", "### What each credit method reads", "", *_credit_reads()]


def render_schema() -> str:
    head = "# JSON schema of the workflow config. Written by `rredcot config --write`; do not edit.\n"
    return head + yaml.safe_dump(schema(), sort_keys=False, allow_unicode=True, width=WIDTH)


def generated() -> dict[Path, str]:
    return {CONFIG_YAML: render_yaml(), CONFIG_README: render_readme(), SCHEMA_YAML: render_schema()}


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="rredcot config", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", action="store_true", help="write the derived files")
    group.add_argument("--check", action="store_true", help="fail if a derived file is stale")
    group.add_argument("--show", nargs="+", metavar="CONFIG", help="print the resolved config of these files")
    args = ap.parse_args(argv)
    if args.show:
        print(yaml.safe_dump(load_config(args.show), sort_keys=False, allow_unicode=True), end="")
        return
    stale = [path for path, text in generated().items() if not path.exists() or path.read_text() != text]
    if args.check:
        for path in stale:
            print(f"stale: {path.relative_to(ROOT)} (run: rredcot config --write)", file=sys.stderr)
        raise SystemExit(1 if stale else 0)
    for path, text in generated().items():
        path.write_text(text)
        print(f"wrote {path.relative_to(ROOT)}")
