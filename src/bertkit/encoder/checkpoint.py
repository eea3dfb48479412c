"""Hugging Face–format checkpoints: load any BERT directory, save ours so other tools read it.

A directory holds `config.json` and `model.safetensors` (preferred) or `pytorch_model.bin`
(loaded with `torch.load(weights_only=True)`: no code from a checkpoint ever runs). Tensor names
follow Hugging Face's `modeling_bert.py` on disk; in memory the model uses its own shorter names and
one fused Q/K/V projection, and this module converts between the two:

    disk (Hugging Face)                                   memory (bertkit)
    [bert.]embeddings.LayerNorm.*                          [bert.]embeddings.norm.*
    [bert.]encoder.layer.i.attention.self.{query,key,value}.*  [bert.]layers.i.qkv.*  (concatenated)
    [bert.]encoder.layer.i.attention.output.dense.*        [bert.]layers.i.attn_out.*
    [bert.]encoder.layer.i.attention.output.LayerNorm.*    [bert.]layers.i.attn_norm.*
    [bert.]encoder.layer.i.intermediate.dense.*            [bert.]layers.i.ffn_in.*
    [bert.]encoder.layer.i.output.dense.*                  [bert.]layers.i.ffn_out.*
    [bert.]encoder.layer.i.output.LayerNorm.*              [bert.]layers.i.ffn_norm.*
    [bert.]pooler.dense.*                                  [bert.]pooler.*
    cls.predictions.transform.dense.*                      mlm.transform.*
    cls.predictions.transform.LayerNorm.*                  mlm.norm.*
    cls.predictions.bias (or .decoder.bias)                mlm.bias
    cls.predictions.decoder.weight                         (tied to the word embeddings)
    cls.seq_relationship.*                                 nsp.*

RoBERTa, ALBERT and DistilBERT checkpoints convert through their own tables (each family's `names`
in `bertkit.families`, chosen by config.json's `model_type`) into the same memory names: the encoder
sits under `roberta.`, `albert.` or `distilbert.` on disk; ALBERT's stored layer
`albert_layer_groups.g.albert_layers.j` is `layers.(g × inner_group_num + j)`, its
`encoder.embedding_hidden_mapping_in` is `embed_proj`, its MLM head `predictions.*` and SOP head
`sop_classifier.classifier` is `nsp`; RoBERTa's MLM head is `lm_head.{dense,layer_norm,bias}`;
DistilBERT's layers are `transformer.layer.i.{attention.{q,k,v,out}_lin, sa_layer_norm, ffn.lin1,
ffn.lin2, output_layer_norm}` and its MLM head `vocab_{transform,layer_norm,projector}`. XLM-RoBERTa
and CamemBERT keep RoBERTa's names, ERNIE BERT's under `ernie.` (plus
`embeddings.task_type_embeddings`, the same in memory); ELECTRA sits under `electra.`, its
`embeddings_project` is `embed_proj`, its generator's MLM head `generator_predictions.{dense,
LayerNorm}` + `generator_lm_head.bias`, and its discriminator keeps `discriminator_predictions.*`. MPNet
sits under `mpnet.`: its layers' `attention.attn.{q,k,v,o}` and `attention.LayerNorm` are the fused qkv,
`attn_out` and `attn_norm`, its `encoder.relative_attention_bias` is `relative_bias`, its MLM head
RoBERTa's `lm_head.*`. DeBERTa-v2 sits under `deberta.`: `attention.self.{query,key,value}_proj` are
the fused qkv, `attention.self.pos_{key,query}_proj` the layer's `disentangled.*`, `encoder.rel_embeddings`
and `encoder.LayerNorm` are `relative_bias.{embeddings,norm}`, `encoder.conv` the first layer's `conv`;
its MLM head is BERT's `cls.predictions.*` or, with `legacy` false, `lm_predictions.lm_head.*` (both
load), and the sequence classifier's `pooler.dense` is `context_pooler.dense`. Task heads
keep their names (`classifier.dense`/`out_proj`, `pre_classifier`, `qa_outputs`) in both.
ModernBERT's encoder sits under `model.`: `embeddings.tok_embeddings` is the word table, layer i
is `layers.i.{attn.Wqkv (fused already), attn.Wo, attn_norm, mlp.Wi, mlp.Wo, mlp_norm}`, then
`final_norm`; every head starts with `head.{dense,norm}` (the MLM head's transform and norm, or a
task head's own prediction head), the MLM bias is `decoder.bias`, and the QA head is `classifier`.
One disk name serving two memory names (`head.dense` is `mlm.transform` or a classifier's
`head.dense`; `classifier` is `qa_outputs` under QA) resolves to the one the model has (`aliases`).

Real checkpoints also carry TF-era `gamma`/`beta` LayerNorm names, `position_ids` buffers, no
`bert.` prefix (a bare encoder loaded under a head) or one too many (a pre-training checkpoint
loaded as a bare encoder); all are accepted. Missing and unexpected tensors are reported
(`model.load_report`, and a log warning); a tensor whose shape differs is an error naming it.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, TypeVar

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from bertkit.encoder.config import BertConfig
from bertkit.families import FAMILIES, NameMap
from bertkit.util.fileio import atomic_path, missing_model_dir, model_directory

logger = logging.getLogger(__name__)

SAFETENSORS_NAME = "model.safetensors"
PYTORCH_NAME = "pytorch_model.bin"

class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded as it is; the message names the file and the fix."""


@dataclass
class LoadReport:
    """What loading matched: tensors the model had to initialise, and tensors it did not use."""
    missing: list[str] = field(default_factory=list)  # Hugging Face names, freshly initialised
    unexpected: list[str] = field(default_factory=list)  # Hugging Face names, not used

    def __str__(self) -> str:
        parts = []
        if self.missing:
            parts.append(f"newly initialised (not in checkpoint): {', '.join(self.missing)}")
        if self.unexpected:
            parts.append(f"unused from checkpoint: {', '.join(self.unexpected)}")
        return "; ".join(parts) or "all tensors matched"


# ---------------------------------------------------------------------------------------------
# Name conversion
# ---------------------------------------------------------------------------------------------
_OUR_LAYER = re.compile(r"^layers\.(\d+)\.(.*)$")


def name_map(config: BertConfig | None) -> NameMap:
    """The tensor names of config's family on disk (BERT's without a config); a DeBERTa config with
    `legacy` false writes its MLM head as lm_predictions.lm_head (`NameMap.unlegacy_mlm`)."""
    names = (FAMILIES["bert"] if config is None else config.family).names
    if names.unlegacy_mlm and not config.legacy:
        return replace(names, outer=names.unlegacy_mlm + names.outer)
    return names


def _swap(name: str, pairs: tuple[tuple[str, str], ...], reverse: bool = False) -> str:
    """Replace the first matching prefix; names no pair matches are returned unchanged."""
    for ours, theirs in pairs:
        src, dst = (theirs, ours) if reverse else (ours, theirs)
        if name.startswith(src):
            return dst + name[len(src):]
    return name


def _layer_stem(k: int, config: BertConfig | None) -> str:
    """On-disk stem of stored layer k (ALBERT: group k // inner_group_num, inner layer k % it)."""
    if config is not None and config.family.shares_layers:
        group, inner = divmod(k, config.inner_group_num)
        return f"encoder.albert_layer_groups.{group}.albert_layers.{inner}."
    return name_map(config).layer.replace(r"(\d+)", str(k)).replace("\\", "")


def to_hf_state_dict(state: dict[str, torch.Tensor], config: BertConfig | None = None) -> dict[str, torch.Tensor]:
    """bertkit names → the Hugging Face names of config's family (BERT without a config); the fused
    qkv is split into query, key and value."""
    names = name_map(config)
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        under_head = name.startswith("bert.")
        prefix, rest = (names.prefix, name[5:]) if under_head else ("", name)
        layer = _OUR_LAYER.match(rest)
        if layer and _swap(rest, names.outer) != rest:  # a layer's module stored outside the layers (DeBERTa's conv)
            layer = None
        if layer:
            stem, part = _layer_stem(int(layer.group(1)), config), layer.group(2)
            if part in ("qkv.weight", "qkv.bias") and names.qkv:
                kind = part[4:]
                for proj, chunk in zip(names.qkv, tensor.chunk(3, dim=0)):
                    out[f"{prefix}{stem}{proj}.{kind}"] = chunk.contiguous()
                continue
            out[prefix + stem + _swap(part, names.layer_parts)] = tensor.contiguous()
            continue
        out[prefix + _swap(rest, names.outer)] = tensor.contiguous()
    return out


def _normalise_legacy(name: str, names: NameMap) -> str:
    """TF-era and wrapper spellings → current Hugging Face names."""
    name = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", name)
    name = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name)
    for wrapper in ("model.", "module."):  # DDP / other wrappers that prefix every key
        if wrapper == names.prefix:  # ModernBERT's own encoder prefix
            continue
        if name.startswith(wrapper + names.prefix) or name.startswith(wrapper + "embeddings."):
            name = name[len(wrapper):]
    return name


def from_hf_state_dict(state: dict[str, torch.Tensor], *, has_base_prefix: bool,
                       config: BertConfig | None = None) -> dict[str, torch.Tensor]:
    """Hugging Face names of config's family (any prefix convention) → bertkit names for a model
    with or without `bert.`.

    `has_base_prefix`: the target model keeps its encoder under `bert.` (every head model does;
    a bare BertModel does not). Keys that do not convert keep their Hugging Face name so they show
    up as unexpected.
    """
    names = name_map(config)
    prefix = names.prefix
    state = {_normalise_legacy(k, names): v for k, v in state.items()}
    if has_base_prefix and not any(k.startswith(prefix) for k in state):
        state = {(prefix + k if k.startswith(names.base_roots) else k): v for k, v in state.items()}
    if not has_base_prefix and any(k.startswith(prefix) for k in state):
        state = {(k[len(prefix):] if k.startswith(prefix) else k): v for k, v in state.items()}
    if names.decoder_bias:  # older checkpoints saved the MLM bias only as decoder.bias
        bias, legacy = names.decoder_bias
        if bias not in state and legacy in state:
            state[bias] = state[legacy]
    ignored = re.compile(r"(^|\.)position_ids$|" + names.ignored)
    layer_pattern = re.compile("^" + names.layer + "(.*)$")
    qkv_pattern = re.compile("^(" + "|".join(re.escape(p) for p in names.qkv) + r")\.(weight|bias)$"
                             if names.qkv else r"(?!)")
    inner = config.inner_group_num if config is not None and config.family.shares_layers else None

    out: dict[str, torch.Tensor] = {}
    qkv_parts: dict[tuple[str, int, str], dict[str, torch.Tensor]] = {}
    for name, tensor in state.items():
        if ignored.search(name):
            continue
        under_head = name.startswith(prefix)
        ours_prefix, rest = ("bert.", name[len(prefix):]) if under_head else ("", name)
        layer = layer_pattern.match(rest)
        if layer:
            numbers, part = [int(g) for g in layer.groups()[:-1]], layer.groups()[-1]
            if inner is not None and numbers[1] >= inner:
                out[name] = tensor  # a layer the config does not have: reported unexpected
                continue
            k = numbers[0] * inner + numbers[1] if inner is not None else numbers[0]
            qkv = qkv_pattern.match(part)
            if qkv:
                qkv_parts.setdefault((ours_prefix, k, qkv.group(2)), {})[qkv.group(1)] = tensor
                continue
            out[f"{ours_prefix}layers.{k}." + _swap(part, names.layer_parts, reverse=True)] = tensor
            continue
        out[ours_prefix + _swap(rest, names.outer, reverse=True)] = tensor
    for (ours_prefix, k, kind), parts in qkv_parts.items():
        if len(parts) != 3:
            stem = (prefix if ours_prefix else "") + _layer_stem(k, config)
            for part, tensor in parts.items():  # incomplete: keep under HF names, reported unexpected
                out[f"{stem}{part}.{kind}"] = tensor
            continue
        out[f"{ours_prefix}layers.{k}.qkv.{kind}"] = torch.cat([parts[p] for p in names.qkv])
    return out


# ---------------------------------------------------------------------------------------------
# Reading and writing files
# ---------------------------------------------------------------------------------------------
def read_state_dict(model_dir: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint directory (safetensors preferred; .bin without pickled code)."""
    model_dir = Path(model_dir)
    safetensors_path, bin_path = model_dir / SAFETENSORS_NAME, model_dir / PYTORCH_NAME
    if safetensors_path.is_file():
        _check_readable(safetensors_path)
        try:
            return load_file(str(safetensors_path), device="cpu")
        except (SafetensorError, OSError, ValueError) as err:
            raise CheckpointError(f"{safetensors_path} is truncated or corrupt ({err}); "
                                  "re-save or re-download the checkpoint") from None
    if bin_path.is_file():
        _check_readable(bin_path)
        try:
            state = torch.load(bin_path, map_location="cpu", weights_only=True)
        except Exception as err:  # torch raises several types for bad archives
            raise CheckpointError(f"{bin_path} could not be read as a weights-only checkpoint ({err}); "
                                  "convert it to model.safetensors") from None
        if not isinstance(state, dict):
            raise CheckpointError(f"{bin_path} does not hold a state dict (found {type(state).__name__})")
        return state
    if not model_dir.is_dir():
        raise FileNotFoundError(missing_model_dir(model_dir))
    raise FileNotFoundError(f"no {SAFETENSORS_NAME} or {PYTORCH_NAME} in {model_dir}; the weights "
                            "are missing: copy them there or save the model again")


def check_weights(model_dir: str | os.PathLike, model: torch.nn.Module) -> None:
    """Check a directory's weights without loading them: the file is there, readable and whole,
    and every tensor it shares with `model` (may live on the meta device) has the model's shape.

    safetensors: only the header is read (safe_open checks that the data cover it); a .bin is
    loaded. Raises FileNotFoundError, PermissionError or CheckpointError naming the file and fix.
    """
    from safetensors import safe_open

    model_dir = Path(model_dir)
    path = model_dir / SAFETENSORS_NAME
    if path.is_file():
        _check_readable(path)
        try:
            with safe_open(str(path), framework="pt") as f:
                shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
        except (SafetensorError, OSError, ValueError) as err:
            raise CheckpointError(f"{path} is truncated or corrupt ({err}); re-save or re-download "
                                  "the checkpoint") from None
    else:
        shapes = {name: tuple(t.shape) for name, t in read_state_dict(model_dir).items()}
    converted = from_hf_state_dict({n: torch.empty(s, device="meta") for n, s in shapes.items()},
                                   has_base_prefix=hasattr(model, "bert"), config=model.config)
    own = model.state_dict()
    converted = resolve_aliases(converted, own, model.config)
    for name, tensor in converted.items():
        if name in own and tuple(own[name].shape) != tuple(tensor.shape):
            hf_name = next(iter(to_hf_state_dict({name: own[name]}, model.config)))
            raise CheckpointError(
                f"{model_dir}: tensor {hf_name} has shape {tuple(tensor.shape)} in the checkpoint "
                f"but {tuple(own[name].shape)} in config.json; check config.json (e.g. vocab_size, "
                "num_labels) matches the weights")


def _check_readable(path: Path) -> None:
    """PermissionError naming the file and the fix; the loaders would call it "corrupt"."""
    try:
        with open(path, "rb"):
            pass
    except PermissionError:
        mode = path.stat().st_mode & 0o777
        raise PermissionError(f"cannot read {path}: permission denied (mode {mode:04o}); ask its "
                              f"owner to make it readable (chmod a+r {path}) or copy the model "
                              "directory") from None


def resolve_aliases(converted: dict[str, torch.Tensor], own: dict[str, torch.Tensor],
                    config: BertConfig) -> dict[str, torch.Tensor]:
    """Rename a converted tensor the model lacks to its alias the model has (`NameMap.aliases`)."""
    pairs = name_map(config).aliases
    if not pairs:
        return converted
    out = {}
    for name, tensor in converted.items():
        if name not in own:
            for a, b in pairs + tuple((b, a) for a, b in pairs):
                for head in ("", "bert."):
                    if name.startswith(head + a) and head + b + name[len(head + a):] in own:
                        name = head + b + name[len(head + a):]
                        break
        out[name] = tensor
    return out


def load_into(model: torch.nn.Module, state: dict[str, torch.Tensor], source: str,
              loaded_next: Callable[[str], bool] | None = None) -> LoadReport:
    """Copy Hugging Face–named tensors into `model`; report what was missing or unused.
    loaded_next: names (the model's own) the caller loads from elsewhere next, such as a resumed
    run's LoRA adapters: not reported as missing."""
    has_prefix = hasattr(model, "bert")
    config = model.config
    converted = from_hf_state_dict(state, has_base_prefix=has_prefix, config=config)
    own = model.state_dict()
    converted = resolve_aliases(converted, own, config)
    for name, tensor in converted.items():
        if name in own and own[name].shape != tensor.shape:
            hf_name = next(iter(to_hf_state_dict({name: own[name]}, config)))
            raise CheckpointError(
                f"{source}: tensor {hf_name} has shape {tuple(tensor.shape)} in the checkpoint but "
                f"{tuple(own[name].shape)} in the model; check config.json (e.g. vocab_size, "
                "num_labels) matches the weights")
    result = model.load_state_dict({k: v for k, v in converted.items() if k in own}, strict=False)
    unused = {k: v for k, v in converted.items() if k not in own}
    missing = [n for n in result.missing_keys if loaded_next is None or not loaded_next(n)]
    report = LoadReport(missing=sorted(to_hf_state_dict({n: own[n] for n in missing}, config)),
                        unexpected=sorted(to_hf_state_dict(unused, config)))
    # New weights matter (a head to train); unused ones are routine (a head the task does not need).
    if report.missing:
        logger.warning("loading %s into %s: %s", source, type(model).__name__, report)
    elif report.unexpected:
        logger.info("loading %s into %s: %s", source, type(model).__name__, report)
    return report


def write_checkpoint(model: torch.nn.Module, config: BertConfig, out_dir: str | os.PathLike) -> Path:
    """config.json + model.safetensors (Hugging Face names; tied decoder not stored), atomically."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = to_hf_state_dict({k: v.detach().cpu() for k, v in model.state_dict().items()}, config)
    with atomic_path(out_dir / SAFETENSORS_NAME) as tmp:
        save_file(state, str(tmp), metadata={"format": "pt"})
    config.save(out_dir, architectures=[architecture_name(type(model).__name__, config)])
    return out_dir


def architecture_name(class_name: str, config: BertConfig) -> str:
    """transformers' class for one of ours: BertForSequenceClassification → RobertaFor… for a
    RoBERTa config; BertForPreTraining without a sentence head (RoBERTa, DistilBERT) → …ForMaskedLM;
    a kind the family names otherwise under its own name (BertForReplacedTokenDetection → ElectraForPreTraining)."""
    kind = class_name[len("Bert"):] if class_name.startswith("Bert") else class_name
    if kind == "ForPreTraining" and config.family.sentence_head is None:
        kind = "ForMaskedLM"
    kind = next((theirs for theirs, ours in config.family.head_kinds.items() if ours == kind), kind)
    return config.family.class_prefix + kind


def missing_from(model: torch.nn.Module, report: LoadReport, module: str) -> list[str]:
    """The checkpoint names of `model.<module>`'s tensors that loading had to initialise."""
    own = {k: v for k, v in model.state_dict().items() if k == module or k.startswith(module + ".")}
    names = set(to_hf_state_dict(own, model.config))
    return [n for n in report.missing if n in names]


M = TypeVar("M", bound="PretrainedMixin")


class PretrainedMixin:
    """`from_pretrained(dir)` / `save_pretrained(dir)` for every bertkit model class."""

    config: BertConfig
    load_report: LoadReport | None = None

    @classmethod
    def from_pretrained(cls: type[M], model_dir: str | os.PathLike, **config_overrides) -> M:
        """Load a Hugging Face–format directory (ours or anyone's) of any family in config.py.

        config_overrides replace config.json fields (e.g. num_labels=3, id2label={...}).
        Weights the checkpoint lacks (a new task head, a missing pooler) are initialised as for a
        new model and listed in `model.load_report`.
        """
        model_dir = model_directory(model_dir)
        config = BertConfig.from_json(model_dir / "config.json")
        if config_overrides:
            config = config.replace(**config_overrides)
        state = read_state_dict(model_dir)
        model = cls(config)
        model.load_report = load_into(model, state, str(model_dir))
        model.eval()
        return model

    def save_pretrained(self, out_dir: str | os.PathLike) -> Path:
        """Write config.json and model.safetensors, readable by `transformers`' matching class."""
        return write_checkpoint(self, self.config, out_dir)
