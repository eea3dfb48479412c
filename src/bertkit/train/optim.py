"""Optimizer and learning-rate schedule for BERT training.

AdamW with BERT's settings (Devlin et al. 2019, appendix A.2: β = (0.9, 0.999), weight decay 0.01;
ε = 1e-6 as the reference `optimization.py`), where biases and LayerNorm parameters are not decayed:
decaying a LayerNorm gain toward 0 or a bias toward 0 has no regularising meaning, and the reference
excludes them too. The schedule is a linear warmup to the peak rate, then a linear (or cosine) decay
to 0 at `total_steps`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

SCHEDULES = ("linear", "cosine", "constant")


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Split trainable parameters into a decayed group and a non-decayed one (biases, LayerNorm).

    Returns `[{"params": [...], "weight_decay": weight_decay}, {"params": [...], "weight_decay": 0.0}]`
    in `model.named_parameters()` order, so the optimizer's state lines up when it is reloaded.
    Tied parameters (the MLM decoder shares the word embeddings) appear once.
    """
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
    # Decide by the owning module's type rather than by name, so LayerNorms named "ln", "norm" or
    # "LayerNorm" are all found; biases are found by their attribute name.
    no_decay_ids = set()
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if isinstance(module, nn.LayerNorm) or name == "bias":
                no_decay_ids.add(id(param))
    decay, no_decay = [], []
    for _, param in model.named_parameters():  # deduplicates tied parameters
        if not param.requires_grad:
            continue
        (no_decay if id(param) in no_decay_ids else decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(model: nn.Module, lr: float, *, weight_decay: float = 0.01,
                    betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-6) -> torch.optim.AdamW:
    """AdamW over `param_groups(model, weight_decay)`.

    The fused kernel is used whenever every parameter sits on a device that has it (CPU and CUDA
    in recent PyTorch): on CPU it is several times faster than the per-tensor loop for BERT-base,
    which matters when an optimizer step is a sizeable part of a training step.
    """
    if not lr > 0:
        raise ValueError(f"learning rate must be > 0, got {lr}")
    groups = param_groups(model, weight_decay)
    devices = {p.device.type for group in groups for p in group["params"]}
    fused = devices <= {"cpu", "cuda"} and all(
        p.dtype in (torch.float32, torch.float16, torch.bfloat16) for g in groups for p in g["params"])
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fused or None)


def lr_lambda(warmup_steps: int, total_steps: int, kind: str = "linear"):
    """The multiplier of the peak rate at optimizer step `s` (0-based: the rate used by step s+1).

    Warmup: (s + 1) / warmup_steps, so the very first update already moves (a zero-rate first step
    would waste a batch). After warmup: linear or cosine decay reaching 0 at `total_steps`;
    "constant" keeps 1.0.
    """
    if kind not in SCHEDULES:
        raise ValueError(f"unknown schedule {kind!r}; choose one of {', '.join(SCHEDULES)}")
    if total_steps <= 0:
        raise ValueError(f"total_steps must be > 0, got {total_steps}")
    if not 0 <= warmup_steps <= total_steps:
        raise ValueError(f"warmup_steps {warmup_steps} must be between 0 and total_steps {total_steps}")

    def multiplier(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        if kind == "constant":
            return 1.0
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        progress = min(1.0, progress)
        if kind == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return multiplier


def lr_schedule(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int,
                kind: str = "linear") -> torch.optim.lr_scheduler.LambdaLR:
    """Warmup then decay, as a LambdaLR; call `.step()` once per optimizer step.

    Its `state_dict()` holds only numbers (the multiplier is a closure, which LambdaLR leaves out),
    so it saves and loads with `torch.load(weights_only=True)`; rebuild it with the same arguments
    before `load_state_dict`.
    """
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(warmup_steps, total_steps, kind))


def default_lr(hidden_size: int) -> float:
    """The peak fine-tuning learning rate for an encoder of `hidden_size`.

    Base and wider (768+): 3e-5, inside the 2e-5 … 5e-5 that BERT's authors searched (Devlin et
    al. 2019, appendix A.3). The compact models need more: BERT-tiny pre-trained briefly by the
    quickstart (600 steps), one epoch of the built-in sets (dev): zh-sentiment accuracy 0.529 at
    3e-5 (the majority class), 0.799 at 1e-3; zh-ner entity F1 0.011 at 3e-5, 0.452 at 1e-3.
    Widths in between (small, medium: 512) take 1e-4, the highest rate Turc et al. 2019 searched
    for their compact BERTs. Fine-tuning and SPLADE training (`train.sparse`) start from it.
    """
    if hidden_size >= 768:
        return 3e-5
    if hidden_size >= 512:
        return 1e-4
    return 1e-3
