"""The relay's garbage-collection policy.

Why the relay has one: every open stream holds a few hundred objects the cycle collector
tracks (its request, its connection's protocol and parser state, its reader's place), so
with thousands of streams the collector's full passes walk millions of objects — and a
full pass stops the event loop for all of it. Measured with ``bench/streams.py`` (3,000
streams, a loaded two-core machine), Python's defaults made 8–9 full passes in a minute
of the run, the longest 1.1–1.4 s, and /healthz p99 tracked them (98–103 ms); with the
young threshold at 50,000 there were none and p99 was 54 ms, for the same RSS.

What it does, once the relay has started and while it serves (:func:`applied`):

- collect what start-up left, then *freeze* the survivors (modules, the app, the
  settings, the store's statements): they live as long as the process, and frozen
  objects are never walked again by any pass;
- raise the young generation's threshold from Python's 700 to :data:`YOUNG` allocations:
  a young pass costs what it walks (the young objects), so fewer, larger young passes
  cost about the same in all, while the full passes, which Python schedules by counting
  young ones, come that many times less often. Garbage in cycles then waits longer to
  be freed: at most a young threshold's worth of objects, a few MiB.

``gc_threshold = 700`` (``--gc-threshold``, ``MELLAN_GC_THRESHOLD``) gives Python's own
schedule back (the freeze stays: it only ever saves work).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager

YOUNG = 50_000
"""The relay's young-generation threshold (allocations net of deallocations)."""

PYTHON_YOUNG = 700
"""CPython's own default, for comparison (``gc.get_threshold()[0]`` in a fresh process)."""


Callback = Callable[[str, dict[str, int]], None]


@contextmanager
def applied(young: int = YOUNG, on_pass: Callback | None = None) -> Iterator[int]:
    """Freeze what start-up made and set the young threshold for the block (the relay's
    serving); ``on_pass`` is told of every pass (``gc.callbacks``: the pauses metric).
    Yields how many objects were frozen. Python's schedule and the callbacks are put
    back after: the relay can be served in a process that goes on."""
    gc.collect()  # start-up's own garbage goes first: none of it is frozen
    gc.freeze()
    before = gc.get_threshold()
    gc.set_threshold(young, *before[1:])
    if on_pass is not None:
        gc.callbacks.append(on_pass)
    try:
        yield gc.get_freeze_count()
    finally:
        if on_pass is not None and on_pass in gc.callbacks:
            gc.callbacks.remove(on_pass)
        gc.set_threshold(*before)
        gc.unfreeze()
