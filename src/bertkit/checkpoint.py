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

Real checkpoints also carry TF-era `gamma`/`beta` LayerNorm names, `position_ids` buffers, no
`bert.` prefix (a bare encoder loaded under a head) or one too many (a pre-training checkpoint
loaded as a bare encoder); all are accepted. Missing and unexpected tensors are reported
(`model.load_report`, and a log warning); a tensor whose shape differs is an error naming it.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from bertkit.config import BertConfig
from bertkit.fileio import atomic_path, missing_model_dir

logger = logging.getLogger(__name__)

SAFETENSORS_NAME = "model.safetensors"
PYTORCH_NAME = "pytorch_model.bin"

# (bertkit name prefix, Hugging Face name prefix), both without "bert."; {} is a layer number.
_RENAMES: list[tuple[str, str]] = [
    ("embeddings.norm.", "embeddings.LayerNorm."),
    ("layers.{}.attn_out.", "encoder.layer.{}.attention.output.dense."),
    ("layers.{}.attn_norm.", "encoder.layer.{}.attention.output.LayerNorm."),
    ("layers.{}.ffn_in.", "encoder.layer.{}.intermediate.dense."),
    ("layers.{}.ffn_out.", "encoder.layer.{}.output.dense."),
    ("layers.{}.ffn_norm.", "encoder.layer.{}.output.LayerNorm."),
    ("pooler.", "pooler.dense."),
    ("mlm.transform.", "cls.predictions.transform.dense."),
    ("mlm.norm.", "cls.predictions.transform.LayerNorm."),
    ("mlm.bias", "cls.predictions.bias"),
    ("nsp.", "cls.seq_relationship."),
]


def _compile(renames: list[tuple[str, str]]) -> list[tuple[re.Pattern, str]]:
    return [(re.compile("^" + re.escape(src).replace(r"\{\}", r"(\d+)")), dst) for src, dst in renames]


_TO_HF = _compile(_RENAMES)
_FROM_HF = _compile([(hf, ours) for ours, hf in _RENAMES])


def _rename(name: str, rules: list[tuple[re.Pattern, str]]) -> str:
    """Apply the first rule whose prefix matches; names no rule matches are returned unchanged."""
    for pattern, replacement in rules:
        match = pattern.match(name)
        if match:
            return replacement.format(*match.groups()) + name[match.end():]
    return name


_QKV = re.compile(r"^layers\.(\d+)\.qkv\.(weight|bias)$")
_HF_QKV = re.compile(r"^encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)\.(weight|bias)$")
_BASE_PREFIXES = ("embeddings.", "encoder.", "pooler.")
# Tensors that real checkpoints carry but no model needs: buffers and the tied decoder.
_IGNORED = re.compile(r"(^|\.)position_ids$|^cls\.predictions\.decoder\.(weight|bias)$")


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
def _split_prefix(name: str) -> tuple[str, str]:
    return ("bert.", name[5:]) if name.startswith("bert.") else ("", name)


def to_hf_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """bertkit names → Hugging Face names; the fused qkv is split into query, key and value."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        prefix, rest = _split_prefix(name)
        qkv = _QKV.match(rest)
        if qkv:
            layer, kind = qkv.groups()
            for part, chunk in zip(("query", "key", "value"), tensor.chunk(3, dim=0)):
                out[f"{prefix}encoder.layer.{layer}.attention.self.{part}.{kind}"] = chunk.contiguous()
            continue
        out[prefix + _rename(rest, _TO_HF)] = tensor.contiguous()
    return out


def _normalise_legacy(name: str) -> str:
    """TF-era and wrapper spellings → current Hugging Face names."""
    name = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", name)
    name = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name)
    for wrapper in ("model.", "module."):  # DDP / other wrappers that prefix every key
        if name.startswith(wrapper + "bert.") or name.startswith(wrapper + "embeddings."):
            name = name[len(wrapper):]
    return name


def from_hf_state_dict(state: dict[str, torch.Tensor], *, has_base_prefix: bool) -> dict[str, torch.Tensor]:
    """Hugging Face names (any prefix convention) → bertkit names for a model with or without `bert.`.

    `has_base_prefix`: the target model keeps its encoder under `bert.` (every head model does;
    a bare BertModel does not). Keys that do not convert keep their Hugging Face name so they show
    up as unexpected.
    """
    state = {_normalise_legacy(k): v for k, v in state.items()}
    if has_base_prefix and not any(k.startswith("bert.") for k in state):
        state = {("bert." + k if k.startswith(_BASE_PREFIXES) else k): v for k, v in state.items()}
    if not has_base_prefix and any(k.startswith("bert.") for k in state):
        state = {(k[5:] if k.startswith("bert.") else k): v for k, v in state.items()}
    # Older checkpoints saved the MLM bias only as decoder.bias.
    if "cls.predictions.bias" not in state and "cls.predictions.decoder.bias" in state:
        state["cls.predictions.bias"] = state["cls.predictions.decoder.bias"]

    out: dict[str, torch.Tensor] = {}
    qkv_parts: dict[tuple[str, str, str], dict[str, torch.Tensor]] = {}
    for name, tensor in state.items():
        if _IGNORED.search(name):
            continue
        prefix, rest = _split_prefix(name)
        qkv = _HF_QKV.match(rest)
        if qkv:
            layer, part, kind = qkv.groups()
            qkv_parts.setdefault((prefix, layer, kind), {})[part] = tensor
            continue
        out[prefix + _rename(rest, _FROM_HF)] = tensor
    for (prefix, layer, kind), parts in qkv_parts.items():
        if len(parts) != 3:
            for part, tensor in parts.items():  # incomplete: keep under HF names, reported unexpected
                out[f"{prefix}encoder.layer.{layer}.attention.self.{part}.{kind}"] = tensor
            continue
        out[f"{prefix}layers.{layer}.qkv.{kind}"] = torch.cat([parts["query"], parts["key"], parts["value"]])
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
                                   has_base_prefix=hasattr(model, "bert"))
    own = model.state_dict()
    for name, tensor in converted.items():
        if name in own and tuple(own[name].shape) != tuple(tensor.shape):
            hf_name = next(iter(to_hf_state_dict({name: own[name]})))
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


def load_into(model: torch.nn.Module, state: dict[str, torch.Tensor], source: str) -> LoadReport:
    """Copy Hugging Face–named tensors into `model`; report what was missing or unused."""
    has_prefix = hasattr(model, "bert")
    converted = from_hf_state_dict(state, has_base_prefix=has_prefix)
    own = model.state_dict()
    for name, tensor in converted.items():
        if name in own and own[name].shape != tensor.shape:
            hf_name = next(iter(to_hf_state_dict({name: own[name]})))
            raise CheckpointError(
                f"{source}: tensor {hf_name} has shape {tuple(tensor.shape)} in the checkpoint but "
                f"{tuple(own[name].shape)} in the model; check config.json (e.g. vocab_size, "
                "num_labels) matches the weights")
    result = model.load_state_dict({k: v for k, v in converted.items() if k in own}, strict=False)
    unused = {k: v for k, v in converted.items() if k not in own}
    report = LoadReport(missing=sorted(to_hf_state_dict({n: own[n] for n in result.missing_keys})),
                        unexpected=sorted(to_hf_state_dict(unused)))
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
    state = to_hf_state_dict({k: v.detach().cpu() for k, v in model.state_dict().items()})
    with atomic_path(out_dir / SAFETENSORS_NAME) as tmp:
        save_file(state, str(tmp), metadata={"format": "pt"})
    config.save(out_dir, architectures=[type(model).__name__])
    return out_dir


# What each class named in config.json's `architectures` is, for messages that say why a model
# cannot serve a use.
ARCHITECTURE_KINDS = {
    "BertModel": "a bare encoder without a task head",
    "BertForPreTraining": "a pre-trained encoder (MLM and NSP heads, no fine-tuned task head)",
    "BertForMaskedLM": "a masked-language model (no fine-tuned task head)",
    "BertForSequenceClassification": "a sequence classifier",
    "BertForTokenClassification": "a token classifier (tagger)",
    "BertForQuestionAnswering": "an extractive question-answering model",
    "BertForMultipleChoice": "a multiple-choice model",
}


def check_architecture(model_dir: str | os.PathLike, config: BertConfig, wanted: type,
                       fix: str) -> None:
    """ValueError when config.json's `architectures` names a known class other than `wanted`.

    A head the checkpoint lacks would be initialised at random and answer nonsense; a directory
    whose config names no architecture (or an unknown one) is let through.
    fix: what the user should do instead, appended to the message.
    """
    names = [n for n in config.extra.get("architectures") or [] if n in ARCHITECTURE_KINDS]
    if not names or wanted.__name__ in names:
        return
    raise ValueError(f"{model_dir} is {ARCHITECTURE_KINDS[names[0]]} ({names[0]} in config.json), "
                     f"not {ARCHITECTURE_KINDS.get(wanted.__name__, wanted.__name__)}; {fix}")


M = TypeVar("M", bound="PretrainedMixin")


class PretrainedMixin:
    """`from_pretrained(dir)` / `save_pretrained(dir)` for every bertkit model class."""

    config: BertConfig
    load_report: LoadReport | None = None

    @classmethod
    def from_pretrained(cls: type[M], model_dir: str | os.PathLike, **config_overrides) -> M:
        """Load a Hugging Face–format BERT directory (ours or anyone's).

        config_overrides replace config.json fields (e.g. num_labels=3, id2label={...}).
        Weights the checkpoint lacks (a new task head, a missing pooler) are initialised as for a
        new model and listed in `model.load_report`.
        """
        model_dir = Path(model_dir)
        if not model_dir.is_dir():
            raise FileNotFoundError(missing_model_dir(model_dir))
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
