"""``rredcot datasets [NAME --out FILE | --list]``: the dataset registry on the command line."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from rredcot.data.registry import DEFAULT_REGISTRY, load_dataset_spec, load_registry, resolve_dataset
from rredcot.infra.io import write_jsonl
from rredcot.infra.logs import setup_logging


def main(argv: Sequence[str] | None = None) -> None:
    """CLI: write one dataset (registry name, or a local file) as common-schema JSONL."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("dataset", nargs="?", help="registry name or local .jsonl/.json/.parquet path")
    parser.add_argument("--registry", type=Path, default=DEFAULT_REGISTRY)
    parser.add_argument("--root", type=Path, default=Path("."), help="base of relative paths in specs")
    parser.add_argument("--out", type=Path, help="output JSONL")
    parser.add_argument("--list", action="store_true", help="list the registry and exit")
    args = parser.parse_args(argv)
    registry = load_registry(args.registry)
    if args.list or not args.dataset:
        for name, spec in registry.items():
            print(f"{name:28s} {spec.get('path') or spec.get('hub')}")
        return
    rows = load_dataset_spec(resolve_dataset(args.dataset, registry), root=args.root)
    if args.out:
        write_jsonl(args.out, rows)
    print(f"{args.dataset}: {len(rows)} rows" + (f" -> {args.out}" if args.out else ""))


if __name__ == "__main__":
    setup_logging()
    main()
