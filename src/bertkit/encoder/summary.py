"""`bertkit info`: what a model is made of, as a parameter table per component.

Every family prints its own table: ALBERT's factorised embeddings (V × E, then the E → H
projection) and its shared layers, each stored layer listed once with the depths that run it;
DistilBERT without segment table or pooler; RoBERTa's classifier as dense + out_proj;
ModernBERT without position table (rotary), with its GeGLU width (Wi: H → 2I), each layer's
attention kind and window, and the final LayerNorm; DeBERTa with its relative embeddings, each
layer's position projections (without share_att_key) and v2's convolution. The total counts the tied decoder once, as
transformers' `num_parameters()` does.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from bertkit.encoder.checkpoint import architecture_name, check_weights
from bertkit.encoder.config import PRESETS, BertConfig
from bertkit.encoder.heads import model_class
from bertkit.encoder.model import BertModel, encoder_of
from bertkit.encoder.tasks import architecture_kinds


def model_class_for(config: BertConfig) -> type[nn.Module]:
    """The class named first in config.json's `architectures`, of any family (RobertaForMaskedLM
    → BertForMaskedLM); BertModel when absent or unknown."""
    kinds = architecture_kinds(config)
    return model_class(kinds[0]) if kinds else BertModel


def _depths(depths: list[int]) -> str:
    """[0, 1, 2, 5] → "0-2, 5"."""
    spans: list[list[int]] = []
    for d in depths:
        if spans and d == spans[-1][1] + 1:
            spans[-1][1] = d
        else:
            spans.append([d, d])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)


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
    encoder = encoder_of(model)
    config = encoder.config
    emb = encoder.embeddings
    hidden, dim = config.hidden_size, config.embedding_dim
    rows = [(f"embeddings.token ({config.vocab_size} × {dim})", _count(emb.word_embeddings))]
    if getattr(emb, "position_embeddings", None) is not None:
        rows.append((f"embeddings.position ({config.max_position_embeddings} × {dim})",
                     _count(emb.position_embeddings)))
    if getattr(emb, "token_type_embeddings", None) is not None:
        rows.append((f"embeddings.segment ({config.type_vocab_size} × {dim})", _count(emb.token_type_embeddings)))
    if getattr(emb, "task_type_embeddings", None) is not None:
        rows.append((f"embeddings.task type ({config.task_type_vocab_size} × {dim})", _count(emb.task_type_embeddings)))
    rows.append(("embeddings.LayerNorm", _count(emb.norm)))
    projection = encoder.embed_proj if encoder.embed_proj is not None else getattr(emb, "embed_proj", None)
    if projection is not None:
        rows.append((f"embedding projection ({dim} → {hidden})", _count(projection)))
    bias = encoder.relative_bias
    if isinstance(bias, nn.Embedding):  # MPNet: one table that every layer's attention reads
        rows.append((f"relative position bias ({bias.num_embeddings} × {bias.embedding_dim}, all layers)",
                     _count(bias)))
    elif bias is not None and _count(bias):  # DeBERTa: relative embeddings that every layer projects
        table = bias.embeddings
        size = "none" if table is None else f"{table.num_embeddings} × {table.embedding_dim}"
        rows.append((f"relative position embeddings ({size}{', LayerNorm' if bias.norm is not None else ''}, "
                     "all layers)", _count(bias)))
    depths: dict[int, list[int]] = {}
    for depth, k in enumerate(encoder.schedule):
        depths.setdefault(k, []).append(depth)
    for i, layer in enumerate(encoder.layers):
        runs = depths.get(i, [])
        shared = f", shared by depths {_depths(runs)}, counted once" if len(runs) > 1 else ""
        if config.is_modernbert:
            kind = ("global" if layer.half_window is None
                    else f"local, ±{layer.half_window} tokens") + (", LayerNorm" if i else "")
            rows.append((f"layer {i} attention (Wqkv, Wo, {kind})", _count(layer.qkv, layer.attn_out, layer.attn_norm)))
            rows.append((f"layer {i} GeGLU ({hidden} → 2 × {config.intermediate_size}, {config.intermediate_size} "
                         f"→ {hidden}, LayerNorm)", _count(layer.ffn_in, layer.ffn_out, layer.ffn_norm)))
            continue
        disentangled = getattr(layer, "disentangled", None)
        extra = ", position projections" if disentangled is not None and _count(disentangled) else ""
        rows.append((f"layer {i} attention (QKV{extra}, output, LayerNorm){shared}",
                     _count(layer.qkv, layer.attn_out, layer.attn_norm, disentangled)))
        if getattr(layer, "conv", None) is not None:
            rows.append((f"layer {i} convolution (kernel {config.conv_kernel_size}, LayerNorm)", _count(layer.conv)))
        rows.append((f"layer {i} FFN ({hidden} → {config.intermediate_size} → {hidden}, LayerNorm){shared}",
                     _count(layer.ffn_in, layer.ffn_out, layer.ffn_norm)))
    if encoder.final_norm is not None:
        rows.append(("final LayerNorm", _count(encoder.final_norm)))
    if encoder.pooler is not None:
        rows.append(("pooler", _count(encoder.pooler)))
    task_heads = [(n, m) for n, m in model.named_children() if n != "bert"] if model is not encoder else []
    for name, module in task_heads:
        if _count(module):
            label = {"mlm": "MLM head (decoder tied to token embeddings; own bias)",
                     "nsp": f"{config.family.sentence_head} head"}.get(name, f"{name} head")
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
    family = ""
    if config.family.shares_layers:
        family = (f"; ALBERT: embeddings {config.embedding_dim} wide, {len(encoder_of(model).schedule)} "
                  f"depths run {config.num_layer_weights} stored layer(s)")
    elif config.is_modernbert:
        family = (f"; modernbert: rotary positions, {config.layer_types.count('full_attention')} global + "
                  f"{config.layer_types.count('sliding_attention')} local layers (window {config.local_attention})")
    elif config.family.layers == "disentangled":
        reach = config.max_relative_positions if config.max_relative_positions >= 1 else config.max_position_embeddings
        buckets = (f"{config.position_buckets} log buckets" if config.position_buckets > 0
                   else f"distances clipped at ±{reach}")
        family = (f"; {config.model_type}: disentangled attention ({'+'.join(config.pos_att_type or []) or 'content'}, "
                  f"{buckets}{', shared Q/K' if config.share_att_key else ''}"
                  f"{', absolute positions' if config.position_biased_input else ''})")
    elif config.model_type != "bert":
        family = f"; {config.model_type}"
    lines = [f"{spec}: {architecture_name(type(model).__name__, config)} — {config.num_hidden_layers} layers, "
             f"hidden {config.hidden_size}, {config.num_attention_heads} heads, FFN {config.intermediate_size}, "
             f"vocab {config.vocab_size}, {config.max_position_embeddings} positions, {config.hidden_act} "
             f"activation{family}",
             f"{'component':<{width}}  {'parameters':>13}"]
    lines += [f"{name:<{width}}  {count:>13,}" for name, count in rows]
    lines.append(f"{'total':<{width}}  {total:>13,}")
    return "\n".join(lines)
