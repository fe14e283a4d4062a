"""`--grpc-restricted-protocol` / `--http-restricted-api=<apis>:<key>=<value>`: API groups that
need a header with a given value, as Triton's restricted features.

Kept free of frontend imports so the command line can validate the flags cheaply.
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
GRPC_HEADER_PREFIX = "triton-grpc-protocol-"

Restrictions = dict[str, tuple[str, str]]  # category -> (header name, value)


def parse_restriction(
    text: str,
    option: str,
    feature: str,
    key_prefix: str = "",
    restrictions: Restrictions | None = None,
) -> Restrictions:
    """Add one flag value to `restrictions`; ValueError with Triton's words if it is bad.

    `option` is the flag's name without dashes, `feature` Triton's word for a group in errors
    ("protocol" for gRPC, "api" for HTTP)."""
    restrictions = {} if restrictions is None else restrictions
    error = f"--{option} option format is '<config name>:<setting>=<value>'. Got {text}"
    colon = text.find(":")
    equals = text.find("=", colon + 1) if colon >= 0 else -1
    if colon < 0 or equals < 0:
        raise ValueError(error)
    names, key, value = text[:colon], text[colon + 1 : equals], text[equals + 1 :]
    if not names or not key or not value:
        raise ValueError(error)
    for name in (n.strip() for n in names.split(",")):
        if name not in CATEGORIES:
            raise ValueError(f"unknown restricted {feature} '{name}'")
        if name in restrictions:
            raise ValueError(
                f"restricted {feature} '{name}' can not be specified in multiple config groups"
            )
        restrictions[name] = ((key_prefix + key).lower(), value)
    return restrictions
