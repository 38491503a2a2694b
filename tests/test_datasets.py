"""Tests for the math dataset loader and the dataset registry."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from rredcot.data.registry import (
    SCHEMA_FIELDS,
    DatasetLoadError,
    DatasetSpecError,
    load_dataset_spec,
    load_registry,
    resolve_dataset,
)

ROOT = Path(__file__).parents[1]
# Samples of the files the `local/...` entries name (provenance: tests/fixtures/README.md).
DATA_DIR = Path(__file__).parent / "fixtures" / "data"
LOCAL_COUNTS = {
    "math500": 50,
    "aime24": 20,
    "aime25": 20,
    "amc23": 25,
    "deepscaler_aime_train": 50,
    "math_train": 50,
}
HUB_IDS = {
    "knoveleng/open-rs",
    "AI-MO/NuminaMath-CoT",
    "HuggingFaceH4/MATH-500",
    "HuggingFaceH4/aime_2024",
    "math-ai/aime25",
    "math-ai/amc23",
    "math-ai/minervamath",
}


@pytest.fixture(scope="module")
def registry() -> dict[str, dict]:
    return load_registry(ROOT / "config" / "datasets.yaml")


def _check_schema(row: dict) -> None:
    assert list(row)[: len(SCHEMA_FIELDS)] == list(SCHEMA_FIELDS)
    assert isinstance(row["id"], str) and row["id"]
    assert isinstance(row["problem"], str) and row["problem"].strip()
    assert isinstance(row["answer"], str) and row["answer"].strip()
    assert row["solution"] is None or isinstance(row["solution"], str)
    assert isinstance(row["source"], str) and row["source"]
    assert row["level"] is None or type(row["level"]) is int


def test_registry_lists_hub_and_local_datasets(registry: dict) -> None:
    assert {spec["hub"] for spec in registry.values() if "hub" in spec} == HUB_IDS
    assert {name for name in registry if name.startswith("local/")} == {f"local/{n}" for n in LOCAL_COUNTS}


@pytest.mark.parametrize(("name", "count"), LOCAL_COUNTS.items())
def test_local_files_load_through_registry(registry: dict, name: str, count: int) -> None:
    """Each `local/...` entry's field mapping, applied to a sample of the file it names."""
    spec = resolve_dataset(f"local/{name}", registry)
    assert Path(spec["path"]).name == f"{name}.jsonl"
    rows = load_dataset_spec({**spec, "path": f"{name}.jsonl"}, root=DATA_DIR)
    assert len(rows) == count
    assert len({row["id"] for row in rows}) == count
    for row in rows:
        _check_schema(row)
    levels = {row["level"] for row in rows}
    if name == "math500":
        assert levels == {1, 2, 3, 4, 5}
    elif name == "math_train":
        # The MATH level is stored as a float difficulty (two rows of the whole file have 0.0).
        assert levels == {1, 2, 3, 4, 5} and rows[0]["difficulty"] == 5.0
    elif name == "deepscaler_aime_train":
        assert levels == {2, 3, 4, 5, 6}  # 2-7 over the whole file
    else:
        assert levels == {None}
    has_solution = {row["solution"] is not None for row in rows}
    assert has_solution == ({True} if name in ("math500", "aime24", "deepscaler_aime_train") else {False})


def test_field_mapping_dotted_paths_and_ids(tmp_path: Path) -> None:
    source = [
        {"q": "What is 1+1?", "meta": {"gold": 2.0, "lvl": "Level 3"}, "sol": "So $\\boxed{2}$.", "n": 7},
        {"q": "What is 2+2?", "meta": {"gold": 4.5, "lvl": None}, "sol": None, "n": 8, "id": "given"},
    ]
    path = tmp_path / "raw.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in source) + "\n")
    spec = {
        "path": "raw.jsonl",
        "source": "toy",
        "id_prefix": "toy",
        "fields": {
            "problem": "q",
            "answer": "meta.gold",
            "solution": "sol",
            "level": {"from": "meta.lvl", "type": "int"},
            "boxed": {"from": "sol", "extract": "boxed"},
        },
    }
    rows = load_dataset_spec(spec, root=tmp_path)
    assert rows == [
        {
            "id": "toy-0",
            "problem": "What is 1+1?",
            "answer": "2",
            "solution": "So $\\boxed{2}$.",
            "source": "toy",
            "level": 3,
            "boxed": "2",
            "meta": {"gold": 2.0, "lvl": "Level 3"},
            "n": 7,
        },
        {
            "id": "given",
            "problem": "What is 2+2?",
            "answer": "4.5",
            "solution": None,
            "source": "toy",
            "level": None,
            "boxed": None,
            "meta": {"gold": 4.5, "lvl": None},
            "n": 8,
        },
    ]
    assert load_dataset_spec({**spec, "keep_extra": False}, root=tmp_path)[0].keys() == {
        *SCHEMA_FIELDS,
        "boxed",
    }


def test_level_transform_rounds_half_up(tmp_path: Path) -> None:
    difficulties = [1.0, 2.4, 2.5, 6.5, float("nan"), None]
    path = tmp_path / "d.jsonl"
    path.write_text(
        "".join(json.dumps({"problem": "p", "answer": "1", "difficulty": d}) + "\n" for d in difficulties)
    )
    spec = {"path": str(path), "fields": {"level": {"from": "difficulty", "type": "int"}}}
    rows = load_dataset_spec(spec)
    assert [row["level"] for row in rows] == [1, 2, 3, 7, None, None]
    # The source column is kept: the rounded level loses information.
    assert [row["difficulty"] for row in rows][:4] == difficulties[:4]
    # Without a source column or constant, the file name is the source and the id prefix.
    assert rows[0]["source"] == "d" and rows[0]["id"] == "d-0"


def test_parquet_round_trip(tmp_path: Path) -> None:
    frame = pl.DataFrame(
        {
            "question": ["Find $x$ if $x+1=3$.", "Compute $2^3$."],
            "final": [2, 8],
            "level": ["Level 1", "Level 2"],
            "subject": ["Algebra", "Algebra"],
        }
    )
    frame.write_parquet(tmp_path / "toy.parquet")
    spec = {"path": "toy.parquet", "source": "pq", "fields": {"problem": "question", "answer": "final"}}
    rows = load_dataset_spec(spec, root=tmp_path)
    assert [(r["id"], r["problem"], r["answer"], r["level"], r["subject"]) for r in rows] == [
        ("pq-0", "Find $x$ if $x+1=3$.", "2", 1, "Algebra"),
        ("pq-1", "Compute $2^3$.", "8", 2, "Algebra"),
    ]
    assert all(row["solution"] is None for row in rows)


def test_hub_error_names_the_spec_when_offline(monkeypatch: pytest.MonkeyPatch, registry: dict) -> None:
    import datasets

    calls = []

    def offline(path: str, **kwargs: object) -> None:
        calls.append((path, kwargs))
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(DatasetLoadError, match=r"knoveleng/open-rs.*ConnectionError: no network.*'path'"):
        load_dataset_spec(resolve_dataset("open-rs", registry))
    assert calls == [("knoveleng/open-rs", {"name": None, "split": "train", "revision": None})]


def test_hub_rows_are_mapped(monkeypatch: pytest.MonkeyPatch, registry: dict) -> None:
    import datasets

    published = [
        {"source": "olympiads", "problem": "P?", "solution": "Thus $\\boxed{\\frac12}$.", "messages": []}
    ]
    monkeypatch.setattr(datasets, "load_dataset", lambda path, **kwargs: published)
    (row,) = load_dataset_spec(resolve_dataset("numinamath-cot", registry))
    assert row["id"] == "numina-0" and row["answer"] == "\\frac12" and row["source"] == "numinamath-cot"
    assert row["subset"] == "olympiads" and row["messages"] == []


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"hub": "a/b", "path": "x.jsonl"}, "exactly one of"),
        ({}, "exactly one of"),
        ({"path": "x.jsonl", "colums": {}}, "unknown key"),
        ({"path": "x.jsonl", "fields": {"level": {"from": "d", "type": "decimal"}}}, "type must be one of"),
        ({"path": "x.jsonl", "fields": {"level": {"type": "int"}}}, "must be a column name"),
        ("nonexistent", "unknown dataset 'nonexistent'"),
    ],
)
def test_bad_specs_are_rejected(spec: object, message: str, registry: dict) -> None:
    with pytest.raises(DatasetSpecError, match=message):
        resolve_dataset(spec, registry)


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(DatasetLoadError, match="no such file"):
        load_dataset_spec({"path": "absent.jsonl"}, root=tmp_path)
    (tmp_path / "bad.jsonl").write_text('{"problem": "p", "answer": "1"}\n{"problem": \n')
    with pytest.raises(DatasetLoadError, match=r"bad.jsonl:2: invalid JSON"):
        load_dataset_spec({"path": "bad.jsonl"}, root=tmp_path)
    assert resolve_dataset(str(tmp_path / "bad.jsonl"), {}) == {"path": str(tmp_path / "bad.jsonl")}
