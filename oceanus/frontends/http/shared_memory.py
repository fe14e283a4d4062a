"""HTTP handlers of Triton's shared memory extensions (`/v2/systemsharedmemory/...` and
`/v2/cudasharedmemory/...`), over the core's regions (oceanus/core/shared_memory.py).

Paths, as Triton matches them: `/v2/<kind>[/region/<name>]/(status|register|unregister)`, the
name taken verbatim (not URL-decoded). `status` is GET and answers a JSON array; `register` and
`unregister` are POST and answer 200 with an empty body. Register bodies are checked in Triton's
order with its texts; errors raise the core's InferenceServerError (the app maps the code).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from oceanus.core.errors import invalid_arg
from oceanus.core.shared_memory import SharedMemoryManager

KINDS = ("systemsharedmemory", "cudasharedmemory")
ACTIONS = ("status", "register", "unregister")
CUDA_IPC_HANDLE_SIZE = 64  # sizeof(cudaIpcMemHandle_t)


def route(parts: list[str]) -> tuple[str, str] | None:
    """(region name or "", action) when `/v2/<parts>` is a shared memory path, else None."""
    if len(parts) == 2 and parts[1] in ACTIONS:
        return "", parts[1]
    if len(parts) == 4 and parts[1] == "region" and parts[2] and parts[3] in ACTIONS:
        return parts[2], parts[3]
    return None


def allowed_method(action: str) -> str:
    return "GET" if action == "status" else "POST"


def handle(
    shm: SharedMemoryManager, kind: str, name: str, action: str, body: Any
) -> list[dict[str, Any]] | None:
    """Do `action`; the status document, or None for register / unregister. `body` is the parsed
    register request (unused otherwise)."""
    cuda = kind == "cudasharedmemory"
    if action == "status":
        return shm.cuda_status(name) if cuda else shm.status(name)
    if action == "unregister":
        if not cuda:  # nothing is ever registered as CUDA shared memory
            if name:
                shm.unregister(name)
            else:
                shm.unregister_all()
        return None
    if not name:
        what = "cuda" if cuda else "system"
        raise invalid_arg(f"'region name' is necessary to register {what} shared memory region")
    document = body if isinstance(body, dict) else {}
    if cuda:
        _check_cuda_register(document)
        shm.register_cuda(name)
        return None
    if "key" not in document:
        raise invalid_arg("Shared memory register request has no 'key' field")
    key = document["key"]
    if not isinstance(key, str):
        raise invalid_arg("attempt to access JSON non-string as string")
    offset = _unsigned(document["offset"]) if "offset" in document else 0
    if "byte_size" not in document:
        raise invalid_arg("Shared memory register request has no 'byte_size' field")
    shm.register(name, key, offset, _unsigned(document["byte_size"]))
    return None


def _unsigned(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise invalid_arg("attempt to access JSON non-unsigned-integer as unsigned-integer")
    return value


def _member(document: Any, key: str) -> Any:
    if not isinstance(document, dict) or key not in document:
        raise invalid_arg(f"attempt to access non-existing object member '{key}'")
    return document[key]


def _check_cuda_register(document: dict[str, Any]) -> None:
    """The checks Triton makes of a CUDA register request before it tries to open the handle."""
    if "raw_handle" not in document:
        raise invalid_arg("Shared memory register request has no 'raw_handle' field")
    encoded = _member(document["raw_handle"], "b64")
    if not isinstance(encoded, str):
        raise invalid_arg("attempt to access JSON non-string as string")
    _unsigned(_member(document, "byte_size"))
    _unsigned(_member(document, "device_id"))
    try:
        handle = base64.b64decode(encoded)
    except (binascii.Error, ValueError):
        handle = b""
    if len(handle) != CUDA_IPC_HANDLE_SIZE:
        raise invalid_arg("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")
