"""What a bench/llm.py target label computes and caches in: `oceanus:bf16`, `inproc:fp32/bf16`
(our engine: COMPUTE[/KV], fp32 or bf16), `openvino:COMPUTE/KV` (f32, bf16, f16, u8 or the
plugin's `default`); other targets run transformers' default fp32. `oceanus+ov` and
`inproc+ov` (with the same precisions) run model.json's `engine: "openvino"` instead of ours."""

from __future__ import annotations

DTYPES = {"": "float32", "fp32": "float32", "f32": "float32", "bf16": "bfloat16"}


def parts(target: str) -> tuple[str, str, str]:
    """`oceanus+ov:bf16` -> ("oceanus", "openvino", "bf16"); the engine is "transformers"
    without `+ov`."""
    name, _, variant = target.partition(":")
    base, plus, _ = name.partition("+ov")
    return base, "openvino" if plus else "transformers", variant


def engine_args(target: str) -> dict[str, str]:
    """model.json's engine, dtype and kv_cache_dtype for one of our targets."""
    wanted = precision(target)
    names = {"fp32": "float32", "bf16": "bfloat16"}
    return {
        "engine": parts(target)[1],
        "dtype": names[wanted["compute"]],
        "kv_cache_dtype": names[wanted["kv_cache"]],
    }


OV_PRECISIONS = ("f32", "bf16", "f16", "u8", "default")


def precision(target: str) -> dict[str, str]:
    """What a target label (`name[:variant]`, see the docstring) computes and caches in."""
    name, _, variant = parts(target)
    if name in ("oceanus", "inproc"):
        compute, _, kv = variant.partition("/")
        if compute not in DTYPES or kv not in DTYPES:
            raise SystemExit(f"{target}: our engine runs fp32 or bf16 (`{name}:bf16`, fp32/bf16)")
        compute = "bf16" if DTYPES[compute] == "bfloat16" else "fp32"
        kv = compute if not kv else "bf16" if DTYPES[kv] == "bfloat16" else "fp32"
        return {"compute": compute, "kv_cache": kv}
    if name == "openvino":
        compute, _, kv = (variant or "f32/f32").partition("/")
        kv = kv or ("default" if compute == "default" else compute)
        if compute not in OV_PRECISIONS or kv not in OV_PRECISIONS:
            raise SystemExit(f"{target}: openvino:COMPUTE/KV, each one of {OV_PRECISIONS}")
        return {"compute": compute, "kv_cache": kv}
    if variant:
        raise SystemExit(f"{target}: only oceanus, inproc and openvino take a precision")
    return {"compute": "fp32", "kv_cache": "fp32"}  # transformers' default dtype
