"""`bertkit info`: what a model is made of, as a parameter table per component."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from bertkit import heads
from bertkit.checkpoint import check_weights
from bertkit.config import PRESETS, BertConfig
from bertkit.model import BertForMaskedLM, BertForPreTraining, BertModel

MODEL_CLASSES: dict[str, type[nn.Module]] = {
    cls.__name__: cls for cls in (BertModel, BertForPreTraining, BertForMaskedLM, heads.BertForSequenceClassification,
                                  heads.BertForTokenClassification, heads.BertForQuestionAnswering,
                                  heads.BertForMultipleChoice)
}


def model_class_for(config: BertConfig) -> type[nn.Module]:
    """The class named first in config.json's `architectures` (BertModel when absent or unknown)."""
    for name in config.extra.get("architectures") or []:
        if name in MODEL_CLASSES:
            return MODEL_CLASSES[name]
    return BertModel


def _count(*modules: nn.Module | nn.Parameter | None) -> int:
    total = 0
    for m in modules:
        if isinstance(m, nn.Parameter):
            total += m.numel()
        elif m is not None:
            total += sum(p.numel() for p in m.parameters())
    return total


def parameter_rows(model: nn.Module) -> list[tuple[str, int]]:
    """(component, parameter count) rows; shared tensors (the tied decoder) counted once."""
    encoder: BertModel = model.bert if hasattr(model, "bert") else model
    config = encoder.config
    emb = encoder.embeddings
    hidden = config.hidden_size
    rows = [
        (f"embeddings.token ({config.vocab_size} × {hidden})", _count(emb.word_embeddings)),
        (f"embeddings.position ({config.max_position_embeddings} × {hidden})", _count(emb.position_embeddings)),
        (f"embeddings.segment ({config.type_vocab_size} × {hidden})", _count(emb.token_type_embeddings)),
        ("embeddings.LayerNorm", _count(emb.norm)),
    ]
    for i, layer in enumerate(encoder.layers):
        rows.append((f"layer {i} attention (QKV, output, LayerNorm)",
                     _count(layer.qkv, layer.attn_out, layer.attn_norm)))
        rows.append((f"layer {i} FFN ({hidden} → {config.intermediate_size} → {hidden}, LayerNorm)",
                     _count(layer.ffn_in, layer.ffn_out, layer.ffn_norm)))
    if encoder.pooler is not None:
        rows.append(("pooler", _count(encoder.pooler)))
    task_heads = [(n, m) for n, m in model.named_children() if n != "bert"] if model is not encoder else []
    for name, module in task_heads:
        if _count(module):
            label = {"mlm": "MLM head (decoder tied to token embeddings; own bias)",
                     "nsp": "NSP head"}.get(name, f"{name} head")
            rows.append((label, _count(module)))
    return rows


def build_for_info(spec: str | Path, vocab_size: int | None = None) -> nn.Module:
    """A preset name or model dir → the model, built on the meta device (no memory, no weights).

    A model directory's weights are checked (present, readable, every tensor of config.json's
    shape), so `info` never describes a model that would not load.
    """
    if str(spec) not in PRESETS:
        if vocab_size is not None:
            raise ValueError(f"--vocab-size is for presets ({', '.join(PRESETS)}); {spec} is a "
                             "model and its config.json fixes the vocabulary")
        path = Path(spec)
        if path.is_dir():
            config = BertConfig.from_json(path)
            with torch.device("meta"):
                model = model_class_for(config)(config)
            check_weights(path, model)
            return model
    config = BertConfig.resolve(spec, **({"vocab_size": vocab_size} if vocab_size else {}))
    with torch.device("meta"):
        return model_class_for(config)(config)


def format_parameter_table(spec: str | Path, vocab_size: int | None = None) -> str:
    model = build_for_info(spec, vocab_size)
    config = model.config
    rows = parameter_rows(model)
    total = sum(p.numel() for p in model.parameters())
    width = max(len(name) for name, _ in rows)
    lines = [f"{spec}: {type(model).__name__} — {config.num_hidden_layers} layers, hidden {config.hidden_size}, "
             f"{config.num_attention_heads} heads, FFN {config.intermediate_size}, vocab {config.vocab_size}, "
             f"{config.max_position_embeddings} positions, {config.hidden_act} activation",
             f"{'component':<{width}}  {'parameters':>13}"]
    lines += [f"{name:<{width}}  {count:>13,}" for name, count in rows]
    lines.append(f"{'total':<{width}}  {total:>13,}")
    return "\n".join(lines)
