"""A sentence-transformers checkpoint's own files, read: what turns token states into a sentence
vector, at which length, with which prompts.

A directory that sentence-transformers saved holds, beside config.json and the weights:

  modules.json                       the module list: Transformer, then Pooling (and Normalize),
                                     or MLMTransformer + SpladePooling for a SparseEncoder
  1_Pooling/config.json              the dense pooling mode (`Pooling`)
  1_SpladePooling/config.json        SPLADE's pooling and activation (`SpladePooling`)
  sentence_bert_config.json          max_seq_length, the length it was trained at
  config_sentence_transformers.json  named prompts, the default one, truncate_dim; a ColBERT
                                     model's query / document settings (`ColbertSettings`)
  1_Dense/config.json, model.safetensors  a ColBERT model's projection (`DenseLayer`, `dense_weights`)

Reading them is a checkpoint-format concern, so it sits with the encoder room; the engine, the
uses, the service and export ask here. Plain files in, small records out: no torch, but for
the Dense weights, which `dense_weights` loads as tensors (torch imported there, on demand).
"""

from __future__ import annotations

import dataclasses
import json
import os
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertkit.constants import POOLINGS, SPARSE_POOLINGS

# SPLADE's activations: log1p∘ReLU, and a second log1p on top (OpenSearch's models).
SPLADE_ACTIVATIONS = ("relu", "log1p_relu")


def sentence_transformers_modules(model_dir: str | os.PathLike) -> dict[str, str]:
    """A sentence-transformers directory's modules.json as {module class name: its folder}
    ({} without one); ValueError naming the file when it is not a modules list."""
    modules_file = Path(model_dir) / "modules.json"
    if not modules_file.is_file():
        return {}
    try:
        modules = json.loads(modules_file.read_text(encoding="utf-8"))
        return {m["type"].rsplit(".", 1)[-1]: m.get("path", "") for m in modules}
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{modules_file} is not a sentence-transformers modules list ({err}); "
                         "fix or remove it") from None


@dataclass
class Pooling:
    """How a sentence-transformers model turns token states into one vector (its own files)."""
    mode: str  # "mean" | "cls" | "max"
    normalize: bool
    max_seq_length: int | None = None
    include_prompt: bool = True  # False: a prompt's tokens are left out of the pooling (not implemented here)

    @classmethod
    def read(cls, model_dir: str | os.PathLike) -> "Pooling | None":
        """From modules.json + 1_Pooling/config.json (+ sentence_bert_config.json); None when absent."""
        root = Path(model_dir)
        kinds = sentence_transformers_modules(root)
        if "Pooling" not in kinds:
            return None
        pooling_file = root / kinds["Pooling"] / "config.json"
        try:
            settings = json.loads(pooling_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ValueError(f"cannot read the pooling settings {pooling_file}: {err}") from None
        if "pooling_mode" in settings:  # sentence-transformers 6: one key, a mode or a list of them
            modes = settings["pooling_mode"]
            modes = [modes] if isinstance(modes, str) else list(modes or [])
            chosen = [m for m in modes if m in POOLINGS]
            other = [m for m in modes if m not in POOLINGS]
        else:  # before: one boolean key per mode
            chosen = [name for key, name in (("pooling_mode_mean_tokens", "mean"),
                                             ("pooling_mode_cls_token", "cls"),
                                             ("pooling_mode_max_tokens", "max")) if settings.get(key)]
            other = [key for key in ("pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens",
                                     "pooling_mode_lasttoken") if settings.get(key)]
        if other or len(chosen) != 1:
            raise ValueError(f"{pooling_file}: pooling {other or chosen or 'none'} is not supported; "
                             "bertkit pools with exactly one of mean, cls or max (pass --pooling to "
                             "override)")
        length = None
        st_config = root / "sentence_bert_config.json"
        if st_config.is_file():
            length = json.loads(st_config.read_text(encoding="utf-8")).get("max_seq_length")
        return cls(mode=chosen[0], normalize="Normalize" in kinds, max_seq_length=length,
                   include_prompt=bool(settings.get("include_prompt", True)))


def sparse_encoder_length(model_dir: str | os.PathLike) -> int | None:
    """A sentence-transformers SparseEncoder directory's max_seq_length (modules.json names a
    SpladePooling; sentence_bert_config.json holds the length); None for any other directory."""
    root = Path(model_dir)
    modules, st_config = root / "modules.json", root / "sentence_bert_config.json"
    if not modules.is_file() or not st_config.is_file() or "SpladePooling" not in modules.read_text(encoding="utf-8"):
        return None
    try:
        length = json.loads(st_config.read_text(encoding="utf-8")).get("max_seq_length")
    except ValueError as err:
        raise ValueError(f"{st_config}: not valid JSON ({err}); fix or remove it") from None
    return length if isinstance(length, int) and length > 2 else None


def sentence_transformers_settings(model_dir: str | os.PathLike) -> dict[str, Any]:
    """prompts, default_prompt_name and truncate_dim from config_sentence_transformers.json (if any)."""
    file = Path(model_dir) / "config_sentence_transformers.json"
    if not file.is_file():
        return {}
    try:
        found = json.loads(file.read_text(encoding="utf-8"))
    except ValueError as err:
        raise ValueError(f"{file}: not valid JSON ({err}); fix or remove it") from None
    prompts = found.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise ValueError(f"{file}: `prompts` must map names to texts, got {prompts!r}")
    default = found.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise ValueError(f"{file}: default_prompt_name {default!r} is not one of its prompts "
                         f"({', '.join(map(repr, prompts)) or 'none'})")
    dim = found.get("truncate_dim")
    if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int) or dim < 1):
        raise ValueError(f"{file}: truncate_dim must be a positive integer, got {dim!r}")
    return {"prompts": dict(prompts), "default_prompt_name": default, "truncate_dim": dim}


@dataclass(frozen=True)
class SpladePooling:
    """How token logits become term weights, as sentence-transformers' SpladePooling module."""
    pooling_strategy: str = "max"  # SPLADE v2 and later; "sum" is the first SPLADE's
    activation_function: str = "relu"  # log1p∘ReLU; "log1p_relu" adds a second log1p (OpenSearch models)
    declared: bool = field(default=False, compare=False)  # read from a SparseEncoder directory's own files

    def __post_init__(self) -> None:
        if self.pooling_strategy not in SPARSE_POOLINGS:
            raise ValueError(f"unknown SPLADE pooling_strategy {self.pooling_strategy!r}; use one of "
                             f"{', '.join(SPARSE_POOLINGS)}")
        if self.activation_function not in SPLADE_ACTIVATIONS:
            raise ValueError(f"unknown SPLADE activation_function {self.activation_function!r}; use one "
                             f"of {', '.join(SPLADE_ACTIVATIONS)}")

    @classmethod
    def read(cls, model_dir: str | os.PathLike | None) -> "SpladePooling":
        """A SparseEncoder directory's own settings (modules.json → its SpladePooling config.json);
        the SPLADE v2 defaults for any other masked-LM directory."""
        if model_dir is None:
            return cls()
        paths = sentence_transformers_modules(model_dir)
        if "SpladePooling" not in paths:
            return cls()
        file = Path(model_dir) / paths["SpladePooling"] / "config.json"
        try:
            found = json.loads(file.read_text(encoding="utf-8")) if file.is_file() else {}
        except ValueError as err:
            raise ValueError(f"{file}: not valid JSON ({err}); fix or remove it") from None
        return cls(found.get("pooling_strategy", "max"), found.get("activation_function", "relu"), declared=True)


# ---------------------------------------------------------------------------------------------
# ColBERT (PyLate's layout, which sentence-transformers v6 absorbed)
# ---------------------------------------------------------------------------------------------
# The Dense activations a ColBERT projection may have: PyLate's Dense is a plain linear map.
IDENTITY_ACTIVATIONS = ("torch.nn.modules.linear.Identity", "torch.nn.Identity", "Identity")


@dataclass(frozen=True)
class DenseLayer:
    """One sentence-transformers Dense module of a ColBERT directory: its folder and config.json."""
    path: str  # folder inside the model directory ("1_Dense")
    in_features: int
    out_features: int
    bias: bool
    use_residual: bool = False  # PyLate's option: output + input (through `residual.weight` when sizes differ)

    @property
    def tensors(self) -> tuple[str, ...]:
        """The names of its weights in its folder's model.safetensors (PyLate's Dense state dict)."""
        return (("linear.weight",) + (("linear.bias",) if self.bias else ())
                + (("residual.weight",) if self.use_residual and self.in_features != self.out_features else ()))


@dataclass(frozen=True)
class ColbertSettings:
    """How a ColBERT model (PyLate's `models.ColBERT`) reads queries and documents, from its
    config_sentence_transformers.json, with PyLate's defaults for the keys it leaves out.

    A query is [CLS] q_prefix tokens [SEP], padded with [MASK] to `query_length` ("query
    augmentation", Khattab & Zaharia 2020, §3.2) and kept whole; a document is [CLS] d_prefix
    tokens [SEP] cut at `document_length`, its punctuation tokens (`skiplist_words`) dropped
    after encoding. The prefixes are added tokens of the tokenizer, inserted by id after [CLS].
    """
    dense: tuple[DenseLayer, ...]  # the projection, hidden size → out_features of the last
    query_prefix: str = "[Q] "
    document_prefix: str = "[D] "
    query_length: int = 32  # PyLate's default; ColBERTv2 uses 32 too
    document_length: int = 180  # PyLate's default
    do_query_expansion: bool = True  # pad queries with [MASK] to query_length and keep those vectors
    # False (ColBERT's own code): the expansion tokens read the query but no token reads them
    attend_to_expansion_tokens: bool = False
    skiplist_words: tuple[str, ...] = tuple(string.punctuation)

    @property
    def dimension(self) -> int:
        """The size of a token vector (the last Dense layer's out_features)."""
        return self.dense[-1].out_features

    @classmethod
    def read(cls, model_dir: str | os.PathLike) -> "ColbertSettings | None":
        """A ColBERT directory's settings; None for any other directory (no Dense module, or a
        Pooling one: a dense sentence model). ValueError naming the file for what is malformed."""
        root = Path(model_dir)
        modules = _module_list(root)
        kinds = [kind for kind, _ in modules]
        if "Dense" not in kinds or "Pooling" in kinds or "SpladePooling" in kinds:
            return None
        file = root / "config_sentence_transformers.json"
        try:
            found = json.loads(file.read_text(encoding="utf-8")) if file.is_file() else {}
        except ValueError as err:
            raise ValueError(f"{file}: not valid JSON ({err}); fix or remove it") from None
        if found.get("model_type") not in (None, "ColBERT") and "query_prefix" not in found:
            return None
        dense = tuple(_dense_layer(root, path) for kind, path in modules if kind == "Dense")
        values = {key: found[key] for key in ("query_prefix", "document_prefix", "query_length",
                                              "document_length", "do_query_expansion",
                                              "attend_to_expansion_tokens") if found.get(key) is not None}
        if found.get("skiplist_words") is not None:
            values["skiplist_words"] = tuple(found["skiplist_words"])
        settings = cls(dense=dense, **values)
        for name in ("query_length", "document_length"):
            value = getattr(settings, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 3:
                raise ValueError(f"{file}: {name} must be an integer of at least 3, got {value!r}")
        for before, after in zip(dense, dense[1:]):
            if before.out_features != after.in_features:
                raise ValueError(f"{root / after.path}: in_features {after.in_features} does not match "
                                 f"the previous Dense layer's out_features {before.out_features}")
        if not settings.do_query_expansion and settings.attend_to_expansion_tokens:
            # PyLate: without expansion there is nothing to attend to
            settings = dataclasses.replace(settings, attend_to_expansion_tokens=False)
        return settings

    def to_json(self) -> dict[str, Any]:
        """The keys PyLate writes into config_sentence_transformers.json."""
        return {"model_type": "ColBERT", "query_prefix": self.query_prefix, "document_prefix": self.document_prefix,
                "query_length": self.query_length, "document_length": self.document_length,
                "attend_to_expansion_tokens": self.attend_to_expansion_tokens,
                "skiplist_words": list(self.skiplist_words), "do_query_expansion": self.do_query_expansion,
                "similarity_fn_name": "MaxSim"}


def dense_weights(model_dir: str | os.PathLike, layer: DenseLayer) -> dict[str, Any]:
    """A Dense module's tensors, {"linear.weight": (out, in), "linear.bias": (out,) if it has one,
    "residual.weight": (out, in) for a residual across sizes}, from its folder's model.safetensors,
    or pytorch_model.bin read with weights_only (no code runs)."""
    import torch
    from safetensors.torch import load_file

    folder = Path(model_dir) / layer.path
    if (folder / "model.safetensors").is_file():
        state = load_file(str(folder / "model.safetensors"))
    elif (folder / "pytorch_model.bin").is_file():
        state = torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise ValueError(f"{folder} has no model.safetensors or pytorch_model.bin: the Dense layer's "
                         "weights are missing; copy them from the original model")
    weight = state.get("linear.weight")
    if weight is None or tuple(weight.shape) != (layer.out_features, layer.in_features):
        got = "none" if weight is None else tuple(weight.shape)
        raise ValueError(f"{folder}: linear.weight should be ({layer.out_features}, {layer.in_features}) "
                         f"as its config.json says, got {got}")
    missing = [name for name in layer.tensors if name not in state]
    if missing:
        raise ValueError(f"{folder}: {missing[0]} is missing, which its config.json (bias, use_residual) "
                         "calls for; copy the weights from the original model")
    return {key: state[key] for key in layer.tensors}


def _module_list(root: Path) -> list[tuple[str, str]]:
    """modules.json in order as (module class name, folder); [] without one."""
    file = root / "modules.json"
    if not file.is_file():
        return []
    sentence_transformers_modules(root)  # the same checks and message for a malformed file
    modules = json.loads(file.read_text(encoding="utf-8"))
    return [(m["type"].rsplit(".", 1)[-1], m.get("path", "")) for m in sorted(modules, key=lambda m: m.get("idx", 0))]


def _dense_layer(root: Path, path: str) -> DenseLayer:
    file = root / path / "config.json"
    try:
        found = json.loads(file.read_text(encoding="utf-8"))
        layer = DenseLayer(path, int(found["in_features"]), int(found["out_features"]), bool(found.get("bias", True)),
                           bool(found.get("use_residual", False)))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"cannot read the Dense layer settings {file}: {err}") from None
    activation = found.get("activation_function") or "torch.nn.modules.linear.Identity"
    if activation not in IDENTITY_ACTIVATIONS:
        raise ValueError(f"{file}: activation {activation!r} is not supported; bertkit reads ColBERT "
                         "projections without an activation (Identity), as PyLate makes them")
    return layer
