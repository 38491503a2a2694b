"""Peak memory of a block of CPU work: the process's resident set size, sampled while it runs."""

from __future__ import annotations

import threading
import time


def _rss() -> int:
    import psutil  # here, not above: the GPU check imports this module where psutil may be missing

    return psutil.Process().memory_info().rss


class PeakRSS:
    """The largest RSS while the block runs (a sampling thread; torch's CPU memory is plain malloc).
    Sampled, since the kernel's own peak (``ru_maxrss``, psutil's too) is the process's whole life and
    cannot be reset for one block."""

    def __enter__(self) -> PeakRSS:
        self.start = _rss()
        self.peak = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss())
            time.sleep(0.002)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())
