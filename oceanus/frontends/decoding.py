"""When a frontend decodes a request off the event loop.

Turning megabytes of JSON, BYTES elements or protobuf typed contents into arrays takes long
enough (a million BYTES elements: ~0.45 s) to hold up every other connection of the loop,
health probes included; such bodies are decoded on a thread instead (the GIL is handed back to
the loop every few milliseconds meanwhile).
"""

from __future__ import annotations

# Bodies bigger than this are decoded on a thread.
DECODE_ON_THREAD_BYTES = 1 << 20
