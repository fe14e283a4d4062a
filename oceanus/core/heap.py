"""The loaded models' objects kept out of the cyclic garbage collector's full passes.

A server that imported torch and transformers and loaded a model holds ~450,000 objects that
live as long as the model does. Python's full (generation 2) collection walks all of them:
~200 ms on a 2-core machine, with the GIL held, so the event loop stood still that long at
random moments under load (health probes answered in 177-412 ms under 32 streaming chats
instead of < 15 ms; bench/llm_openai.py). `gc.freeze()` after a load moves what exists then
into the permanent generation, which collections skip. After an unload the objects are handed
back (`gc.unfreeze()`) so that the unloaded model's reference cycles can be freed; one full
collection and a new freeze follow a second later, shared by the unloads of that second (a
repository unloading many models pays once, a server shutting down not at all).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc

REFREEZE_DELAY_S = 1.0

# The loop that will collect and freeze again, once the unloads of this second are done.
_refreezing: asyncio.AbstractEventLoop | None = None


def after_load() -> None:
    """A model version came up, on the loop: its objects (and the libraries it imported) are
    long-lived."""
    gc.collect(1)  # the young generations' garbage first (cheap), so it is not kept for good
    gc.freeze()


def after_unload(loop: asyncio.AbstractEventLoop | None) -> None:
    """A model version went away (from any thread): its cycles must become collectable."""
    gc.unfreeze()
    if loop is not None:
        with contextlib.suppress(RuntimeError):  # a closed loop: the server is stopping
            loop.call_soon_threadsafe(_schedule, loop)


def _schedule(loop: asyncio.AbstractEventLoop) -> None:
    global _refreezing
    if _refreezing is not loop:  # (another loop's: it closed before its turn)
        _refreezing = loop
        loop.call_later(REFREEZE_DELAY_S, _collect_and_freeze)


def _collect_and_freeze() -> None:
    global _refreezing
    _refreezing = None
    gc.collect()
    gc.freeze()
