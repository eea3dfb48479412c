"""LoRA adapters over a tiny base, saved as PEFT adapter files and merged into a plain model (its
twin, the oracle), shared by the adapter and service tests (a helper module, not collected)."""

from __future__ import annotations

from pathlib import Path

import torch

from bertkit.data.tokenizer import BertTokenizer
from bertkit.train import lora

ALL = ("query", "key", "value", "attention.output", "intermediate", "output")


def make_adapter(base_dir: Path, out: Path, model_class, *, seed: int, targets=ALL, labels=None, use=None,
                 r: int = 4) -> tuple[Path, Path]:
    """A LoRA model over `base_dir` with random (non-zero) adapters and head, saved twice: PEFT
    adapter files in out/adapter, merged into a plain checkpoint in out/merged."""
    overrides = ({"id2label": dict(enumerate(labels)), "label2id": {n: i for i, n in enumerate(labels)}}
                 if labels else {})
    model = model_class.from_pretrained(base_dir, **overrides)
    torch.manual_seed(seed)
    lora.apply_lora(model, lora.LoraSpec(r=r, alpha=2.0 * r, dropout=0.0, targets=targets))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name or (hasattr(model, "bert") and not name.startswith("bert.")):
                param.copy_(torch.randn(param.shape) * 0.3)
    model.eval()
    lora.save_adapters(model, out / "adapter", base_model=str(base_dir), use=use)
    lora.save_lora(model, out / "merged", "merged", str(base_dir))
    BertTokenizer.from_pretrained(base_dir).save_pretrained(out / "merged")
    return out / "adapter", out / "merged"
