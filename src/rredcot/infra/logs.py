"""Messages of the stages: ``logging`` to stderr as ``[stage] message``, at a level the user sets.

Every module logs through ``logging.getLogger(__name__)``; :func:`setup_logging` (called by the
``rredcot`` command and by each stage run as ``python -m``) prints a record as ``[<short name>]
<message>``, the short name being the module's (``rredcot.stages.train`` -> ``train``,
``rredcot.studies.mc`` -> ``study-mc``). ``RREDCOT_LOG_LEVEL`` (``DEBUG``, ``INFO`` (default),
``WARNING``, ``ERROR``) sets the verbosity. Command output that is the result itself (a table of
runs, a resolved config) is printed to stdout, not logged.
"""

from __future__ import annotations

import logging
import os
import sys

LEVEL_ENV = "RREDCOT_LOG_LEVEL"


def _main_module() -> str:
    """The dotted name of a module run as ``python -m`` (its logger is called ``__main__``)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) or "__main__"


def short_name(name: str) -> str:
    """``rredcot.stages.train`` -> ``train``; ``rredcot.studies.figures_mc`` -> ``study-figures-mc``."""
    if name == "__main__":
        name = _main_module()
    parts = name.split(".")
    last = parts[-1].replace("_", "-")
    return f"study-{last}" if len(parts) > 2 and parts[1] == "studies" else last


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        record.short = short_name(record.name)
        return super().format(record)


def setup_logging(level: str | None = None) -> None:
    """Log ``[short name] message`` lines to stderr at ``level`` (default: ``RREDCOT_LOG_LEVEL`` or INFO).

    Idempotent; third-party loggers keep their own levels (warnings and above show)."""
    level = (level or os.environ.get(LEVEL_ENV) or "INFO").upper()
    root = logging.getLogger()
    if not any(getattr(h, "_rredcot", False) for h in root.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(_Formatter("[%(short)s] %(message)s"))
        handler._rredcot = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("rredcot").setLevel(level)
    if _main_module().startswith("rredcot."):  # a stage run as `python -m rredcot.stages.X`
        logging.getLogger("__main__").setLevel(level)
