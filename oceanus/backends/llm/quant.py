"""Weight-only int8 linears for the CPU engine (model.json's `quantization: "int8"`).

Each `nn.Linear` (the language-model head excepted, as vLLM's weight-only methods leave it) keeps
its weight as int8 with one float scale per output channel (symmetric: `w ~= q * scale`,
`scale = max|w_row| / 127`): a quarter of float32's bytes, half of bfloat16's. A matmul
dequantizes the weight a chunk of output rows at a time into the activations' dtype (int8 values
are exact in bfloat16 and float32), runs `F.linear` on the chunk and scales the chunk's outputs,
so at most ~4 MiB of float weight exists at once. Decode is bound by reading the weights, so
reading a quarter of the bytes pays for the conversion (bench/results/2026-12-06-llm-gguf.md).

torch's own `aten._weight_int8pack_mm` was measured here and not used: on this project's AMD
EPYC machines (torch 2.13 CPU) it took ~7x `F.linear`'s time in float32 at one row, and ~2x in
bfloat16 at 64 rows, where the chunked path stays within ~1.5x of the float matmul.
"""

from __future__ import annotations

import torch
from torch import nn

# Weight elements dequantized at once (4 MiB of float32).
CHUNK_ELEMENTS = 1 << 20


class Int8Linear(nn.Module):
    """`nn.Linear` with an int8 weight and per-output-channel scales (weight-only)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.qweight: torch.Tensor
        self.scales: torch.Tensor
        self.bias: torch.Tensor | None
        with torch.no_grad():
            weight = linear.weight.detach().float()
            scales = weight.abs().amax(dim=1).clamp(min=1e-12) / 127.0
            qweight = torch.round(weight / scales[:, None]).clamp_(-127, 127).to(torch.int8)
        dtype = linear.weight.dtype
        self.register_buffer("qweight", qweight.contiguous())
        self.register_buffer("scales", scales.to(dtype))
        bias = linear.bias.detach() if linear.bias is not None else None
        self.register_buffer("bias", bias)
        self.rows = max(1, CHUNK_ELEMENTS // max(1, self.in_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        if self.out_features <= self.rows:
            out = nn.functional.linear(x, self.qweight.to(dtype)) * self.scales.to(dtype)
        else:
            parts = [
                nn.functional.linear(x, self.qweight[i : i + self.rows].to(dtype))
                * self.scales[i : i + self.rows].to(dtype)
                for i in range(0, self.out_features, self.rows)
            ]
            out = torch.cat(parts, dim=-1)
        if self.bias is not None:
            out = out + self.bias.to(dtype)
        return out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def quantize_linears(model: nn.Module, skip: tuple[str, ...] = ("lm_head",)) -> int:
    """Replace every `nn.Linear` under `model` (but those named in `skip`) by an Int8Linear;
    returns how many. The float weights are dropped as each is replaced."""
    targets = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is nn.Linear and name not in skip
    ]
    for parent, name, child in targets:
        setattr(parent, name, Int8Linear(child))
    return len(targets)


def module_bytes(model: nn.Module) -> int:
    """The bytes of the model's weights: its parameters and its Int8Linears' int8 weights,
    scales and biases (each storage counted once: tied embeddings are one)."""
    tensors: list[torch.Tensor] = list(model.parameters())
    for module in model.modules():
        if isinstance(module, Int8Linear):
            tensors.extend(module.buffers(recurse=False))
    seen: set[int] = set()
    total = 0
    for tensor in tensors:
        key = tensor.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += tensor.numel() * tensor.element_size()
    return total
