"""A job's tracking journal: what the job logs, on local disk first, delivered to the store later.

A job never waits on its tracking store. Each thing it logs (the start of its run, params, metrics,
tags, artifacts, its end) is appended as one JSON record to ``<results_dir>/journal/<id>.jsonl``,
flushed and fsync'd before the call returns; a logged file is copied beside the journal
(``<id>.files/``) as it was when it was logged. A :class:`Courier` thread hands the records, in
order, to a ``deliver`` function (the store side lives in :mod:`rredcot.infra.tracking`) whenever the
store answers, and ``<id>.state.json`` says how many records were delivered (written atomically after
each one), so that delivery resumes where it stopped: in the job, in a rerun of the job (which
continues the same journal) or in ``rredcot tracking sync``.

While a job runs it holds an ``fcntl`` lock on its journal, released by the kernel whatever way the
process ends (the lock of the journal's own append handle: filelock would lock a separate file it
truncates, one more file per journal for nothing); ``sync`` skips a journal that is held. A record
cut short by a kill is the journal's last line without its newline: readers ignore it (with a
warning) and a rerun cuts it off before it appends.

The module knows nothing of MLflow: records are plain JSON objects with an ``op`` key.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rredcot.infra.io import write_json

_log = logging.getLogger(__name__)

JOURNAL_DIR = "journal"
BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 30.0


def journal_dir(results_dir: str | Path) -> Path:
    """The folder of a results dir's journals."""
    return Path(results_dir) / JOURNAL_DIR


def new_journal_id(name: str) -> str:
    """``<name>-<time>-<random>``: unique among the jobs of all invocations."""
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in name)
    return f"{safe}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def _read_lines(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The complete records of journal ``path`` and the byte length they take up.

    A last line without its newline, or that is no JSON object, was cut short by a kill: left out."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], 0
    records, end = [], 0
    for line in data.splitlines(keepends=True):
        try:
            record = json.loads(line) if line.endswith(b"\n") else None
        except ValueError:
            record = None
        if not isinstance(record, dict):
            if end + len(line) < len(data):
                raise ValueError(f"{path}: broken record at byte {end}, before the last line")
            _log.warning("%s: ignoring its last record, cut short (%d bytes)", path, len(line))
            break
        records.append(record)
        end += len(line)
    return records, end


class Journal:
    """One job's journal file, its delivery state and its kept files (see the module docstring)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.id = self.path.name.removesuffix(".jsonl")
        self.state_path = self.path.with_name(f"{self.id}.state.json")
        self.files = self.path.with_name(f"{self.id}.files")
        self._lock = threading.Lock()
        self._records: list[dict[str, Any]] | None = None  # in memory while we write it
        self._fh: Any = None

    @classmethod
    def at(cls, results_dir: str | Path, journal_id: str) -> Journal:
        return cls(journal_dir(results_dir) / f"{journal_id}.jsonl")

    def exists(self) -> bool:
        return self.path.exists()

    # ------------------------------------------------------------------------------------ writing
    def open(self) -> Journal:
        """Take the journal for writing: hold its lock, cut off a torn last record, load the rest.

        Raises ``BlockingIOError`` if another process holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "ab")  # noqa: SIM115 (held until close)
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            raise
        records, end = _read_lines(self.path)
        if end < self.path.stat().st_size:
            os.truncate(self.path, end)
        self._fh, self._records = fh, records
        return self

    def close(self) -> None:
        """Release the journal (the kernel does too if the process dies)."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def append(self, record: dict[str, Any]) -> None:
        """Append ``record`` and make it durable before returning."""
        line = (json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n").encode()
        with self._lock:
            assert self._fh is not None and self._records is not None, "journal not open"
            self._fh.write(line)
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._records.append(record)

    def keep(self, path: str | Path) -> str:
        """Copy a file or folder beside the journal, as it is now; its place relative to the journal's
        folder (for a record). A copy, not a link: the job may rewrite the file in place later."""
        source = Path(path)
        target = self.files / secrets.token_hex(4) / source.name
        target.parent.mkdir(parents=True)
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            shutil.copy2(source, target)
        return str(target.relative_to(self.path.parent))

    def kept(self, relative: str) -> Path:
        """The kept copy a record names."""
        return self.path.parent / relative

    # ------------------------------------------------------------------------------------ reading
    def records(self) -> list[dict[str, Any]]:
        """The complete records: those in memory while we hold the journal, else from disk."""
        with self._lock:
            if self._records is not None:
                return list(self._records)
        return _read_lines(self.path)[0]

    def state(self) -> dict[str, Any]:
        """The delivery state: ``delivered`` (records) and what delivery learnt (e.g. the run id)."""
        try:
            return json.loads(self.state_path.read_text())
        except (OSError, ValueError):
            return {"delivered": 0}

    def save_state(self, state: dict[str, Any]) -> None:
        write_json(self.state_path, state)

    def pending(self) -> list[dict[str, Any]]:
        return self.records()[self.state().get("delivered", 0) :]


def held(path: Path) -> bool:
    """Whether a running job holds journal ``path``."""
    with open(path, "ab") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
        return False


def journals(results_dir: str | Path) -> Iterator[Journal]:
    """The journals of a results dir, oldest first."""
    for path in sorted(journal_dir(results_dir).glob("*.jsonl"), key=lambda p: p.stat().st_mtime):
        yield Journal(path)


Deliver = Callable[[Journal, dict[str, Any], dict[str, Any]], None]
"""Delivers one record; may update the state (saved with ``delivered`` after it returns)."""


def deliver_pending(journal: Journal, deliver: Deliver, stop: threading.Event | None = None) -> int:
    """Deliver the journal's pending records in order; the number delivered. The state is saved after
    each record, so an error or a kill loses no more than the record in flight, which is delivered
    again next time (``deliver`` must make that harmless)."""
    state = journal.state()
    done = 0
    records = journal.records()
    while state.get("delivered", 0) < len(records):
        if stop is not None and stop.is_set():
            break
        deliver(journal, records[state["delivered"]], state)
        state["delivered"] = state.get("delivered", 0) + 1
        journal.save_state(state)
        done += 1
        if state["delivered"] == len(records):
            records = journal.records()  # the job may have logged more meanwhile
    return done


class Courier:
    """A thread that delivers a journal's records whenever the store answers.

    While the store is away it warns once (and once when it is back), retrying with a backoff of
    1 s doubling to 30 s; the job's calls only append to the journal and never wait on the store."""

    def __init__(self, journal: Journal, deliver: Deliver, store: str) -> None:
        self.journal = journal
        self.deliver = deliver
        self.store = store
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._idle = threading.Event()
        self._urgent = threading.Event()
        self._failing = False
        self._thread = threading.Thread(target=self._loop, name=f"courier-{journal.id}", daemon=True)

    def start(self) -> Courier:
        self._thread.start()
        return self

    def try_once(self) -> bool:
        """Deliver what is pending now, in the calling thread; whether all of it got through."""
        try:
            deliver_pending(self.journal, self.deliver)
            return True
        except Exception as exc:
            self._warn(exc)
            return False

    def _warn(self, exc: BaseException) -> None:
        if not self._failing:
            self._failing = True
            _log.warning(
                "tracking store %s does not answer (%s); the job goes on and logs to %s, delivered "
                "when the store is back",
                self.store,
                str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__,
                self.journal.path,
            )

    def notify(self) -> None:
        """Something new was appended."""
        self._idle.clear()
        self._wake.set()

    def _loop(self) -> None:
        delay = BACKOFF_START_S
        while not self._stop.is_set():
            self._wake.clear()
            try:
                deliver_pending(self.journal, self.deliver, self._stop)
            except Exception as exc:
                self._warn(exc)
                # New records don't cut a backoff short (each would cost a try), the job's end does.
                if self._urgent.wait(delay):
                    self._urgent.clear()
                else:
                    delay = min(delay * 2, BACKOFF_MAX_S)
                continue
            delay = BACKOFF_START_S
            if self._failing:
                self._failing = False
                _log.warning("tracking store %s answers again; delivering the journal", self.store)
            if not self.journal.pending():
                self._idle.set()
            self._wake.wait()

    def drain(self, timeout: float) -> list[dict[str, Any]]:
        """Wait up to ``timeout`` s until every record is delivered, then stop; the records left."""
        deadline = time.monotonic() + timeout
        self._wake.set()
        while self.journal.pending() and time.monotonic() < deadline:
            self._urgent.set()  # after a failed try, try again now rather than after the backoff
            self._idle.wait(min(0.5, max(0.0, deadline - time.monotonic())))
        self._stop.set()
        self._urgent.set()
        self._wake.set()
        self._thread.join(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
        return self.journal.pending()
