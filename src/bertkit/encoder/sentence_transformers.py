"""A sentence-transformers checkpoint's own files, read: what turns token states into a sentence
vector, at which length, with which prompts.

A directory that sentence-transformers saved holds, beside config.json and the weights:

  modules.json                       the module list: Transformer, then Pooling (and Normalize),
                                     or MLMTransformer + SpladePooling for a SparseEncoder
  1_Pooling/config.json              the dense pooling mode (`Pooling`)
  1_SpladePooling/config.json        SPLADE's pooling and activation (`SpladePooling`)
  sentence_bert_config.json          max_seq_length, the length it was trained at
  config_sentence_transformers.json  named prompts, the default one, truncate_dim

Reading them is a checkpoint-format concern, so it sits with the encoder room; the engine, the
uses, the service and export ask here. Plain files in, small records out: no torch.
"""

from __future__ import annotations

import json
import os
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
