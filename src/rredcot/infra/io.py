"""Small JSON / JSONL I/O helpers with atomic writes.

Every pipeline output goes through :func:`atomic_path` so that an interrupted job never leaves a
truncated file behind that a workflow manager would mistake for a finished output.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; move it onto ``path`` only if the block succeeds.

    The temporary file lives in the same directory (``os.replace`` is only atomic within one file
    system) and keeps the target's suffixes, so writers that infer the format from the file name
    (e.g. ``savefig``) still work. Parent directories are created. On error the temporary file is
    removed and the target is left untouched.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp{''.join(target.suffixes)}")
    # Create the file ourselves (instead of tempfile.mkstemp) so it gets the usual umask-based
    # permissions rather than mkstemp's private 0600.
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        yield tmp
        # Flush the data to disk before the rename, otherwise a crash could expose an empty file.
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(target.parent)


@contextmanager
def atomic_dir(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary directory next to ``path`` that replaces ``path`` only if the block succeeds.

    Used for model checkpoints (``save_pretrained`` writes several files): a crash mid-save leaves the
    previous directory, or none, never a half-written one. An existing target is moved aside first
    and deleted after the swap.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.{secrets.token_hex(6)}.old")
        os.replace(target, old)
    os.replace(tmp, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    _fsync_dir(target.parent)


def fsync_tree(directory: str | os.PathLike[str]) -> dict[str, int]:
    """Flush every file under ``directory`` and the folders themselves to disk; return each file's
    size in bytes by its path relative to ``directory`` (POSIX separators), read from the open file.

    For folders that other code wrote (a Trainer checkpoint): after this, a crash can no longer turn
    them into shorter or zero-filled files, so what is recorded about them afterwards stays true.
    """
    root = Path(directory)
    sizes: dict[str, int] = {}
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            path = Path(folder) / name
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
                sizes[path.relative_to(root).as_posix()] = os.fstat(fd).st_size
            finally:
                os.close(fd)
        _fsync_dir(Path(folder))
    _fsync_dir(root.parent)
    return sizes


def _fsync_dir(directory: Path) -> None:
    """Persist the directory entry created by the rename (a no-op where directories can't be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a JSONL file into a list of dicts, ignoring blank lines."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_jsonl(path: str | os.PathLike[str], rows: Iterable[dict[str, Any]]) -> None:
    """Atomically write ``rows`` as JSONL (one compact object per line, UTF-8, key order kept)."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False))
            f.write("\n")


def write_json(path: str | os.PathLike[str], obj: Any, indent: int = 2) -> None:
    """Atomically write ``obj`` as pretty-printed JSON with a trailing newline."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=indent)
        f.write("\n")
