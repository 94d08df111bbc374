"""Progress lines on stderr for the command line's slow steps.

A step that is still running after ``REWRITE_EXT_PROGRESS_AFTER`` seconds
(default 3) gets a line ``rewrite-ext: <step>...``, and one more with its time
when it ends; quick steps print nothing.  ``0`` reports every step, ``inf``
none.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["ENVIRONMENT_VARIABLE", "progress_after", "step"]

ENVIRONMENT_VARIABLE = "REWRITE_EXT_PROGRESS_AFTER"
_DEFAULT_AFTER = 3.0


def progress_after() -> float:
    """Seconds after which a running step is reported, from the environment."""
    text = os.environ.get(ENVIRONMENT_VARIABLE, "")
    try:
        value = float(text) if text else _DEFAULT_AFTER
    except ValueError:
        return _DEFAULT_AFTER
    return value if value >= 0 and not math.isnan(value) else _DEFAULT_AFTER


def _say(line: str) -> None:
    try:
        print(f"rewrite-ext: {line}", file=sys.stderr, flush=True)
    except (OSError, ValueError):  # stderr closed: progress is not worth failing for
        pass


@contextmanager
def step(what: str) -> Iterator[None]:
    """Report ``what`` on stderr if it takes longer than :func:`progress_after` seconds."""
    after = progress_after()
    if math.isinf(after):
        yield
        return
    started = time.perf_counter()
    reported = threading.Event()
    lock = threading.Lock()

    def report() -> None:
        with lock:
            if not finished:
                reported.set()
                _say(f"{what}...")

    finished = False
    timer = threading.Timer(after, report)
    timer.daemon = True
    if after == 0:
        report()
    else:
        timer.start()
    try:
        yield
    finally:
        with lock:
            finished = True
        timer.cancel()
        if reported.is_set():
            _say(f"{what}: done in {time.perf_counter() - started:.1f} s")
