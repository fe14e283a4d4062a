"""`--grpc-restricted-protocol=<protocols>:<key>=<value>`: RPC groups that need a header.

Kept free of grpc imports so the command line can validate the flag cheaply.
"""

from __future__ import annotations

# Triton's restricted categories, in its order.
CATEGORIES = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)

# Triton prefixes the configured key with this to form the gRPC metadata key.
HEADER_PREFIX = "triton-grpc-protocol-"


def parse_restricted_protocol(
    text: str, restrictions: dict[str, tuple[str, str]] | None = None
) -> dict[str, tuple[str, str]]:
    """Add one flag value to `restrictions` (category -> (header, value)); ValueError if bad."""
    restrictions = {} if restrictions is None else restrictions
    error = "--grpc-restricted-protocol option format is '<protocols>:<key>=<value>'. Got " + text
    colon = text.find(":")
    equals = text.find("=", colon + 1) if colon >= 0 else -1
    if colon < 0 or equals < 0:
        raise ValueError(error)
    names, key, value = text[:colon], text[colon + 1 : equals], text[equals + 1 :]
    if not names or not key or not value:
        raise ValueError(error)
    for name in (n.strip() for n in names.split(",")):
        if name not in CATEGORIES:
            raise ValueError(f"unknown restricted protocol '{name}'")
        if name in restrictions:
            raise ValueError(
                f"restricted protocol '{name}' can not be specified in multiple config groups"
            )
        restrictions[name] = ((HEADER_PREFIX + key).lower(), value)
    return restrictions
