"""LoRA adapters made with peft on the generator's tiny model (cached per test session), and
transformers + peft's greedy output for each, the reference the engine must equal."""

from __future__ import annotations

from pathlib import Path

import torch

from oceanus.examples.llm import cached_llm

# name -> (rank, alpha, targets, use_rslora): different ranks and targets, one rslora, one
# touching only the MLP's gate and up (the engine's fused MLP runs unfused for its rows).
ADAPTERS: dict[str, tuple[int, int, list[str], bool]] = {
    "attn": (4, 8, ["q_proj", "k_proj", "v_proj", "o_proj"], False),
    "mlp": (8, 16, ["gate_proj", "up_proj"], True),
    "all": (16, 32, ["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"], False),
}


def make_adapter(
    folder: Path, rank: int, alpha: int, targets: list[str], rslora: bool, seed: int
) -> Path:
    """peft's folder for an adapter with random non-zero A and B (peft's default leaves B zero,
    an adapter that changes nothing)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(cached_llm("tiny"), dtype=torch.float32)
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules=targets,
        use_rslora=rslora,
        init_lora_weights=False,  # random A and B
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(base, config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:  # large enough that greedy output changes
                param.normal_(0.0, 0.3)
    model.save_pretrained(folder)
    return folder


def make_adapters(root: Path) -> dict[str, Path]:
    return {
        name: make_adapter(root / name, *spec, seed=index)
        for index, (name, spec) in enumerate(ADAPTERS.items())
    }


def peft_greedy(adapter: Path | None, prompt: list[int], length: int) -> list[int]:
    """transformers + peft's greedy tokens for `prompt` (the base model's when no adapter)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(cached_llm("tiny"), dtype=torch.float32)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    # A plain loop, not `generate`: its min_new_tokens would mask EOS, which the engine's
    # ignore_eos lets through (these adapters do pick EOS at times).
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(length):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]
