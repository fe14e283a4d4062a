"""The model's linear layers on oneDNN with weights packed once at load.

PyTorch's CPU `F.linear` runs on MKL, which on this project's AMD EPYC machines takes ~1.5x
(one thread) to ~2.5x (decode shapes) longer than oneDNN with a pre-reordered weight: the
matmuls are most of a decode step (bench/results/2026-12-04-llm-engine.md). oneDNN is what
OpenVINO runs on too. The weights are reordered once into oneDNN's blocked layout, so a packed
module keeps no plain `weight`: only its forward may read it. Results differ from MKL's by
float rounding (~1e-6), not more."""

from __future__ import annotations

import logging
from typing import cast

import torch
from torch import nn

log = logging.getLogger("oceanus.backends.llm")


class PackedLinear(nn.Module):
    """`nn.Linear`'s forward on oneDNN (`torch.ops.mkldnn`, the op inductor's CPU freezing
    uses), over a weight packed without a batch-size hint so any number of rows works."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.packed: torch.Tensor
        self.bias: torch.Tensor | None
        with torch.no_grad():
            packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach())
        self.register_buffer("packed", packed, persistent=False)
        bias = linear.bias.detach() if linear.bias is not None else None
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
            x, self.packed, self.bias, "none", [], ""
        )
        return out


class FusedMLP(nn.Module):
    """A gated SiLU MLP (Llama's, Mistral's, Qwen's: `down(silu(gate(x)) * up(x))`) on packed
    linears, its SiLU and product done by oneDNN inside the gate and up matmuls (post-ops):
    two passes over the `[tokens, intermediate]` activations fewer per layer."""

    def __init__(self, gate: PackedLinear, up: PackedLinear, down: PackedLinear) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = gate, up, down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mkldnn = torch.ops.mkldnn
        gate = self.gate_proj
        up = self.up_proj
        act: torch.Tensor = mkldnn._linear_pointwise(x, gate.packed, gate.bias, "swish", [], "")
        both: torch.Tensor = mkldnn._linear_pointwise.binary(x, act, up.packed, up.bias, "mul")
        out: torch.Tensor = self.down_proj(both)
        return out


def _gated_silu(module: nn.Module) -> bool:
    parts = [getattr(module, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
    config = getattr(module, "config", None)
    act = getattr(config, "hidden_act", None) or getattr(config, "hidden_activation", None)
    return all(isinstance(p, PackedLinear) for p in parts) and act in ("silu", "swish")


def _fused(module: nn.Module) -> FusedMLP:
    """`module`'s linears (checked PackedLinear by `_gated_silu`) as one FusedMLP."""
    parts = [cast(PackedLinear, getattr(module, n)) for n in ("gate_proj", "up_proj", "down_proj")]
    return FusedMLP(*parts)


def fuse_mlps(model: nn.Module) -> int:
    """Replace every gated SiLU MLP whose linears are packed by a FusedMLP, after checking
    one against the unfused module; returns how many (0 when the check fails)."""
    targets = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if _gated_silu(child)
    ]
    if not targets:
        return 0
    try:
        with torch.no_grad():
            probe = targets[0][2]
            fused = _fused(probe)
            x = torch.randn(3, fused.gate_proj.in_features, dtype=fused.gate_proj.packed.dtype)
            want, got = probe(x), fused(x)
            tolerance = 1e-4 if x.dtype == torch.float32 else 5e-2
            if not torch.allclose(got, want, atol=tolerance, rtol=tolerance):
                log.warning("oneDNN fused MLP differs from the model's; keeping it unfused")
                return 0
    except RuntimeError as exc:
        log.warning("oneDNN fused MLP unavailable (%s); keeping it unfused", exc)
        return 0
    for parent, name, child in targets:
        setattr(parent, name, _fused(child))
    return len(targets)


def usable(dtype: torch.dtype) -> bool:
    """Whether this PyTorch build can pack linears of `dtype` (a CPU build with oneDNN)."""
    return dtype in (torch.float32, torch.bfloat16) and torch.backends.mkldnn.is_available()


def _packs(linear: nn.Linear) -> bool:
    """Whether oneDNN runs `linear`'s shape and dtype, and agrees with `F.linear` on it. oneDNN
    refuses some shapes in some dtypes ("could not create a primitive descriptor": e.g. a tiny
    bfloat16 head), so each distinct shape is tried once, not only the first layer's."""
    with torch.no_grad():
        x = torch.randn(3, linear.in_features, dtype=linear.weight.dtype)
        want = nn.functional.linear(x, linear.weight, linear.bias)
        got = PackedLinear(linear)(x)
    tolerance = 1e-4 if linear.weight.dtype == torch.float32 else 5e-2
    return bool(torch.allclose(got, want, atol=tolerance, rtol=tolerance))


def pack_linears(model: nn.Module) -> int:
    """Replace every `nn.Linear` under `model` by a PackedLinear where oneDNN runs its shape and
    agrees with `F.linear` (`_packs`, once per distinct shape); the others keep the default
    path. Returns how many were packed."""
    targets = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is nn.Linear
    ]
    verdicts: dict[tuple[int, int, bool, torch.dtype], bool] = {}
    packed = 0
    with torch.no_grad():
        for parent, name, child in targets:
            key = (
                child.in_features,
                child.out_features,
                child.bias is not None,
                child.weight.dtype,
            )
            if key not in verdicts:
                try:
                    verdicts[key] = _packs(child)
                    if not verdicts[key]:
                        log.warning("oneDNN linear %s differs from F.linear; not packed", key[:2])
                except RuntimeError as exc:  # an op missing from this build, or a shape refused
                    log.warning("oneDNN linear %s unavailable (%s); not packed", key[:2], exc)
                    verdicts[key] = False
            if verdicts[key]:
                setattr(parent, name, PackedLinear(child))
                packed += 1
    return packed
