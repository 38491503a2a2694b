"""Load math datasets from local files or the Hugging Face Hub into the common schema.

Every dataset becomes a list of rows ``{id, problem, answer, solution, source, level}``: ``answer`` is
always a string, ``solution`` a string or ``None``, ``level`` an int or ``None``. Columns that no mapping
consumes are kept under their own names. How a source's columns map onto the schema is data, not code:
a *dataset spec* (a dict, usually an entry of ``config/datasets.yaml``) says where the rows live and
how to read them, so adding a dataset never needs a new branch here.

Spec keys:

``path``
    Local ``.jsonl``, ``.json`` (a list of objects) or ``.parquet`` file, relative to ``root``.
``hub``, ``config``, ``split``, ``revision``
    Hugging Face dataset id and its ``datasets.load_dataset`` arguments (``split`` defaults to train).
``fields``
    Target name -> column. A column is a name or a dotted path into nested objects (``meta.year``), or
    ``{"from": column, "type": "int" | "float" | "str", "extract": "boxed"}``: ``extract: boxed`` takes
    the last ``\\boxed{}`` of the column (for sources whose only answer is in the solution), ``type``
    converts the value (``int`` rounds floats half up and reads the first integer of a string such as
    ``"Level 3"``). Unmapped schema fields default to the column of the same name.
``source``
    Constant source label; without it the ``source`` column is used, then the hub id or file stem.
``id_prefix``
    Rows without an id get ``{id_prefix}-{row index}`` (defaults to the source label).
``keep_extra``
    Keep unmapped columns (default true).
``description``
    Free text for people; ignored by the loader.

``rredcot datasets NAME --out FILE`` (``rredcot.tools.datasets``) writes one registry dataset as JSONL.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from rredcot.data.grading import extract_boxed

SCHEMA_FIELDS = ("id", "problem", "answer", "solution", "source", "level")
DEFAULT_REGISTRY = Path("config/datasets.yaml")
_SPEC_KEYS = {
    "path",
    "hub",
    "config",
    "split",
    "revision",
    "fields",
    "source",
    "id_prefix",
    "keep_extra",
    "description",
}
_TRANSFORM_KEYS = {"from", "type", "extract"}
_TYPES = ("int", "float", "str")
_EXTRACTORS = ("boxed",)
_LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")
_INT_RE = re.compile(r"-?\d+")


class DatasetSpecError(ValueError):
    """A dataset spec that cannot be used as written; the message quotes the spec."""


class DatasetLoadError(RuntimeError):
    """A valid spec whose data could not be read (missing file, no network for a hub id)."""


def check_spec(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Return a copy of ``spec`` after checking its keys and field mappings."""
    if not isinstance(spec, Mapping):
        raise DatasetSpecError(f"a dataset spec must be a mapping, got {spec!r}")
    spec = dict(spec)
    unknown = set(spec) - _SPEC_KEYS
    if unknown:
        raise DatasetSpecError(f"unknown key(s) {sorted(unknown)} in dataset spec {spec!r}")
    if ("path" in spec) == ("hub" in spec):
        raise DatasetSpecError(f"a dataset spec needs exactly one of 'path' and 'hub': {spec!r}")
    fields = spec.get("fields") or {}
    if not isinstance(fields, Mapping):
        raise DatasetSpecError(f"'fields' must map schema names to columns in dataset spec {spec!r}")
    for target, rule in fields.items():
        if isinstance(rule, str):
            continue
        if not isinstance(rule, Mapping) or "from" not in rule or set(rule) - _TRANSFORM_KEYS:
            raise DatasetSpecError(
                f"field {target!r} must be a column name or {{from, type, extract}} in dataset spec {spec!r}"
            )
        if rule.get("type", "str") not in _TYPES or rule.get("extract", "boxed") not in _EXTRACTORS:
            raise DatasetSpecError(
                f"field {target!r}: type must be one of {_TYPES} and extract one of {_EXTRACTORS} "
                f"in dataset spec {spec!r}"
            )
    return spec


def load_registry(path: str | Path = DEFAULT_REGISTRY) -> dict[str, dict[str, Any]]:
    """Read a registry file (``datasets: {name: spec}``) and check every spec in it."""
    with open(path) as fh:
        data = yaml.safe_load(fh) or {}
    entries = data.get("datasets") if isinstance(data, Mapping) else None
    if not isinstance(entries, Mapping):
        raise DatasetSpecError(f"{path}: expected a top-level 'datasets' mapping of name -> spec")
    return {str(name): check_spec(spec) for name, spec in entries.items()}


def resolve_dataset(
    name_or_spec: str | Mapping[str, Any], registry: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """The spec for a registry name, an inline spec, or a bare local file path."""
    if isinstance(name_or_spec, Mapping):
        return check_spec(name_or_spec)
    if name_or_spec in registry:
        return check_spec(registry[name_or_spec])
    if Path(name_or_spec).suffix in _LOCAL_SUFFIXES:
        return {"path": str(name_or_spec)}
    raise DatasetSpecError(
        f"unknown dataset {name_or_spec!r}; the registry has: {', '.join(sorted(registry))}"
    )


def load_dataset_spec(spec: Mapping[str, Any], root: Path = Path(".")) -> list[dict[str, Any]]:
    """Load the rows a spec describes, converted to the common schema."""
    spec = check_spec(spec)
    raw = _read_local(spec, Path(root) / spec["path"]) if "path" in spec else _read_hub(spec)
    default_source = spec.get("source") or (Path(spec["path"]).stem if "path" in spec else spec["hub"])
    return [_convert(row, index, spec, default_source) for index, row in enumerate(raw)]


def _read_local(spec: Mapping[str, Any], path: Path) -> list[dict[str, Any]]:
    """Rows of a local JSONL / JSON / Parquet file; errors name the file and the spec."""
    if not path.is_file():
        raise DatasetLoadError(f"no such file {path} for dataset spec {dict(spec)!r}")
    if path.suffix == ".parquet":
        import polars as pl

        return pl.read_parquet(path).to_dicts()
    if path.suffix == ".json":
        rows = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(rows, list):
            raise DatasetLoadError(f"{path}: expected a JSON list of objects for dataset spec {dict(spec)!r}")
        return rows
    if path.suffix != ".jsonl":
        raise DatasetSpecError(
            f"unsupported file type {path.suffix!r} (use {_LOCAL_SUFFIXES}) in {dict(spec)!r}"
        )
    rows = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                # Loading is strict; the cleaner is the tool that tolerates and reports broken lines.
                raise DatasetLoadError(
                    f"{path}:{number}: invalid JSON ({exc}); run `rredcot clean` on it"
                ) from exc
    return rows


def _read_hub(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Rows of a Hugging Face dataset; imported lazily because most runs never touch the Hub."""
    import datasets as hf_datasets

    split = spec.get("split", "train")
    try:
        data = hf_datasets.load_dataset(
            spec["hub"], name=spec.get("config"), split=split, revision=spec.get("revision")
        )
    except Exception as exc:
        raise DatasetLoadError(
            f"could not load {spec['hub']!r} (split {split!r}) from the Hugging Face Hub for dataset spec "
            f"{dict(spec)!r}: {type(exc).__name__}: {exc}. Without network access, save the dataset as "
            "JSONL or Parquet elsewhere and use a spec with 'path' instead."
        ) from exc
    return [dict(row) for row in data]


def _lookup(row: Mapping[str, Any], column: str) -> Any:
    """A column value; a dotted name walks nested objects unless a column has that literal name."""
    if column in row:
        return row[column]
    value: Any = row
    for part in column.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _to_int(value: Any) -> int | None:
    """An integer level from ints, floats (rounded half up) or text such as ``"Level 3"``."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return None if math.isnan(value) else math.floor(value + 0.5)
    match = _INT_RE.search(str(value))
    return int(match.group()) if match else None


def _to_text(value: Any) -> str:
    """Answers as strings; integral floats (``27.0``, common in exported answer columns) lose the ``.0``."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return "" if value is None else str(value)


def _apply(rule: str | Mapping[str, Any], row: Mapping[str, Any]) -> Any:
    """Evaluate one field mapping on a source row."""
    if isinstance(rule, str):
        return _lookup(row, rule)
    value = _lookup(row, rule["from"])
    if rule.get("extract") == "boxed":
        value = extract_boxed(value) if isinstance(value, str) else None
    kind = rule.get("type")
    if value is None or kind is None:
        return value
    if kind == "int":
        return _to_int(value)
    if kind == "float":
        try:
            return float(value)
        except (TypeError, ValueError):
            return None
    return _to_text(value)


def _convert(row: Any, index: int, spec: Mapping[str, Any], default_source: str) -> dict[str, Any]:
    """One source row in the common schema (plus kept extra columns)."""
    if not isinstance(row, Mapping):
        raise DatasetLoadError(
            f"row {index} is not an object ({type(row).__name__}) in dataset spec {dict(spec)!r}"
        )
    fields = dict(spec.get("fields") or {})
    rules = {name: fields.get(name, name) for name in SCHEMA_FIELDS} | fields
    values = {name: _apply(rule, row) for name, rule in rules.items()}
    prefix = spec.get("id_prefix") or default_source
    out: dict[str, Any] = {
        "id": f"{prefix}-{index}" if values["id"] in (None, "") else _to_text(values["id"]),
        "problem": _to_text(values["problem"]),
        "answer": _to_text(values["answer"]),
        "solution": None if values["solution"] is None else str(values["solution"]),
        "source": spec.get("source") or (values["source"] and str(values["source"])) or default_source,
        "level": _to_int(values["level"]),
    }
    out |= {name: value for name, value in values.items() if name not in out}
    if spec.get("keep_extra", True):
        # Renamed columns would only repeat a value; a column read through a transform (difficulty ->
        # level) is kept because the converted value loses information.
        consumed = {rule for rule in rules.values() if isinstance(rule, str)}
        out |= {key: value for key, value in row.items() if key not in consumed and key not in out}
    return out
