"""Progress bars for long loops over rows: tqdm, hidden for short lists and when stderr is no terminal."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

# Below this many items a progress bar is just noise.
MIN_ITEMS = 2000


def progress(items: Sequence[Any], desc: str, unit: str = "row", min_items: int = MIN_ITEMS) -> Any:
    """``items`` wrapped in a progress bar when there are many (``disable=None`` lets tqdm hide
    itself when stderr is not a terminal, e.g. under a workflow manager)."""
    return tqdm(items, desc=desc, unit=unit, disable=len(items) < min_items or None)
