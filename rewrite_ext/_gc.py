"""Pausing Python's cyclic garbage collector while a pass runs."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector for the ``with`` body.

    A pass keeps a few Python objects per binding alive until it ends (TVM's
    wrappers of what it read or made, and its records), all freed by reference
    counting when it does.  The collector cannot free them but counts them:
    every 700 it scans the young ones, and as they pile up it runs full
    collections that scan every object of the process (TVM's import alone
    makes 90k).  On a 10k-binding rewrite at every binding matching that was
    5% of its instructions (benchmarks/NOTES.md).
    Cycles made meanwhile (by a rewriter, say) wait for the next collection.
    The pause is process-wide, as ``gc.disable`` is: other threads see it.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
