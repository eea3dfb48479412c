"""A LoRA adapter directory read, checked against a base encoder, and its side file.

An adapter directory is PEFT's (`adapter_config.json` + `adapter_model.safetensors`), as
`bertkit finetune --lora ... --lora-save adapters` or `peft` writes it for a BERT-family base.
bertkit adds a side file that PEFT ignores, `bertkit_adapter.json`:

    {"format": 1, "use": "classify", "labels": ["business", ...], "problem_type": null,
     "max_length": 128, "pooling": null,
     "base": {"fingerprint": "sha256:…", "path": "/models/minilm", "model_type": "bert",
              "hidden_size": 384, "num_hidden_layers": 6}}

`base.fingerprint` is a digest of the encoder's own weights (embeddings and layers; no pooler, no
head, no adapter), so it names the weights an adapter was trained on, wherever they lie and
whatever the file's name; `adapter_config.json`'s `base_model_name_or_path` is only a path.
An adapter with a side file is refused on another base, naming both; one without (made by
`peft`) is checked by shape: every adapted module must exist in the base with the sizes of its
lora_A (r, in) and lora_B (out, r), and the rank must be the config's.

Where a model is asked for, an adapter directory is one too (`resolve`): its base is the local
directory adapter_config.json's `base_model_name_or_path` names, or `--base DIR` where that is a
hub id or a path of another machine; `--model BASE --adapter DIR` says both.

What bertkit does not read (refused with the field named): DoRA, rank_pattern / alpha_pattern,
layers_to_transform, trained biases (`bias` other than "none"), LoRA on embeddings.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from bertkit.encoder import tasks
from bertkit.encoder.checkpoint import from_hf_state_dict, name_map, to_hf_state_dict
from bertkit.encoder.config import BertConfig
from bertkit.encoder.model import BertModel
from bertkit.util.fileio import atomic_write_json, model_directory

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
SIDE_FILE = "bertkit_adapter.json"
PEFT_PREFIX = "base_model.model."
MODULES = ("qkv", "attn_out", "ffn_in", "ffn_out")  # the Linear layers of an encoder layer
ENCODER_ROOTS = ("embeddings.", "embed_proj.", "layers.", "final_norm.")  # what the fingerprint covers
# PEFT's task_type → the engine use of an adapter that has no side file
PEFT_USES = {"SEQ_CLS": "classify", "TOKEN_CLS": "ner", "QUESTION_ANS": "qa", "FEATURE_EXTRACTION": "embed",
             None: "embed"}


class AdapterError(ValueError):
    """An adapter directory that cannot be used on this base; the message says what differs."""


def fingerprint(encoder: nn.Module) -> str:
    """sha256 of an encoder's own weights (ENCODER_ROOTS, fp32 bytes, in name order): equal for
    the same weights in any file or precision they were loaded from."""
    digest = hashlib.sha256()
    state = encoder.state_dict()
    for name in sorted(state):
        if not name.startswith(ENCODER_ROOTS) or ".lora_" in name:
            continue
        tensor = state[name].detach().float().cpu().contiguous()
        digest.update(f"{name}{tuple(tensor.shape)}".encode())
        digest.update(tensor.numpy())  # the buffer itself, not a copy of it
    return "sha256:" + digest.hexdigest()


def short(fp: str | None) -> str:
    return "unknown" if not fp else fp.split(":", 1)[-1][:12]


def base_record(config: BertConfig, fp: str, path: str | None) -> dict[str, Any]:
    return {"fingerprint": fp, "path": path, "model_type": config.model_type,
            "hidden_size": config.hidden_size, "num_hidden_layers": config.num_hidden_layers}


def write_side_file(out_dir: str | Path, *, use: str, base: dict[str, Any], labels: list[str] | None = None,
                    problem_type: str | None = None, max_length: int | None = None,
                    pooling: str | None = None) -> Path:
    """bertkit_adapter.json (see the module docstring), written atomically."""
    if use not in tasks.USES:
        raise ValueError(f"unknown use {use!r}; choose one of {', '.join(tasks.USES)}")
    path = Path(out_dir) / SIDE_FILE
    atomic_write_json(path, {"format": 1, "use": use, "labels": labels, "problem_type": problem_type,
                             "max_length": max_length, "pooling": pooling, "base": base})
    return path


@dataclass
class LowRank:
    """One adapted slice of a Linear's outputs: y[:, lo:hi] += (x Aᵀ) Bᵀ, with B holding the scale."""
    lo: int
    hi: int
    a: torch.Tensor  # (r, in)
    b: torch.Tensor  # (hi - lo, r), times alpha / r (PEFT's scaling)


@dataclass
class AdapterFiles:
    """An adapter read and checked against a base config (`read_adapter`)."""
    directory: Path
    use: str
    r: int
    alpha: float
    deltas: dict[str, list[LowRank]]  # encoder module ("layers.0.qkv", "pooler") → its low-rank terms
    head: dict[str, torch.Tensor]  # the task model's own tensors under bertkit names (classifier.*, bert.pooler.*)
    labels: list[str] | None = None
    problem_type: str | None = None
    max_length: int | None = None
    pooling: str | None = None
    base: dict[str, Any] | None = None  # the side file's record of its base; None: a peft-made adapter
    targets: list[str] = field(default_factory=list)  # transformers' names of the adapted modules

    @property
    def parameters(self) -> int:
        return (sum(d.a.numel() + d.b.numel() for ds in self.deltas.values() for d in ds)
                + sum(t.numel() for t in self.head.values()))


def module_table(config: BertConfig, encoder: nn.Module | None = None
                 ) -> tuple[dict[str, tuple[str, int, int]], dict[str, int]]:
    """transformers' module names of the base's Linear layers (with and without the family's
    prefix) → (bertkit module, first and last output row it covers), and each bertkit module's
    in_features. Q, K and V are thirds of bertkit's fused qkv. encoder: the base's (its sizes are
    read); default: one made on the meta device from `config`."""
    if encoder is None:
        with torch.device("meta"):
            encoder = BertModel(config)
    prefix = name_map(config).prefix
    table: dict[str, tuple[str, int, int]] = {}
    inputs: dict[str, int] = {}
    linears = [(f"layers.{k}.{m}", getattr(layer, m)) for k, layer in enumerate(encoder.layers) for m in MODULES]
    if encoder.pooler is not None:
        linears.append(("pooler", encoder.pooler))
    for ours, linear in linears:
        inputs[ours] = linear.in_features
        names = [n[: -len(".weight")] for n in to_hf_state_dict({f"bert.{ours}.weight": torch.zeros(3, 1)}, config)]
        step = linear.out_features // len(names)
        for i, name in enumerate(names):
            span = (ours, i * step, (i + 1) * step)
            table[name] = span
            if name.startswith(prefix):
                table[name[len(prefix):]] = span
    return table, inputs


def _read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise AdapterError(f"{path} cannot be read as JSON ({err}); the adapter directory is incomplete "
                           f"or damaged: write it again ({what})") from None
    if not isinstance(value, dict):
        raise AdapterError(f"{path} holds {type(value).__name__}, not the JSON object of {what}")
    return value


def read_config(directory: str | Path) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(adapter_config.json, bertkit_adapter.json or None), with PEFT's options bertkit cannot
    honour refused."""
    directory = Path(directory)
    if not directory.is_dir():
        raise AdapterError(f"adapter directory {directory} does not exist (or is not a directory)")
    config_path = directory / ADAPTER_CONFIG
    if not config_path.is_file():
        raise AdapterError(f"{directory} is not a LoRA adapter directory: {ADAPTER_CONFIG} is missing "
                           f"(a half-written adapter, or a full model: serve that as a model)")
    config = _read_json(config_path, "PEFT's adapter settings")
    problems = []
    if config.get("peft_type", "LORA") != "LORA":
        problems.append(f"peft_type is {config.get('peft_type')!r}, not LORA")
    if config.get("use_dora"):
        problems.append("use_dora is true (DoRA is not LoRA's sum)")
    if config.get("bias", "none") != "none":
        problems.append(f"bias is {config.get('bias')!r} (trained biases are not read; use bias none)")
    if config.get("fan_in_fan_out"):
        problems.append("fan_in_fan_out is true (GPT-2 style Conv1D layers, not BERT's Linear)")
    for key in ("rank_pattern", "alpha_pattern"):
        if config.get(key):
            problems.append(f"{key} is set (one rank and alpha for every module is what bertkit reads)")
    if config.get("layers_to_transform") is not None:
        problems.append("layers_to_transform is set")
    for key in ("r", "lora_alpha"):
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            problems.append(f"{key} must be a positive number, got {value!r}")
    if problems:
        raise AdapterError(f"{config_path}: " + "; ".join(problems))
    side_path = directory / SIDE_FILE
    side = _read_json(side_path, "bertkit's adapter record") if side_path.is_file() else None
    if side is not None and side.get("format") != 1:
        raise AdapterError(f"{side_path}: format {side.get('format')!r} is not one this bertkit reads (1)")
    return config, side


def check_base(directory: Path, side: dict[str, Any] | None, config: BertConfig, base_fp: str | None,
               base_name: str) -> None:
    """An adapter with a side file fits only the base it names (by fingerprint, then by shape)."""
    if side is None:
        return
    base = side.get("base") or {}
    for key in ("model_type", "hidden_size", "num_hidden_layers"):
        theirs, ours = base.get(key), getattr(config, key)
        if theirs is not None and theirs != ours:
            raise AdapterError(f"adapter {directory} was made for a base with {key} {theirs} ({base.get('path')}), "
                               f"but {base_name} has {key} {ours}; load it over the base it was trained on")
    theirs = base.get("fingerprint")
    if theirs and base_fp and theirs != base_fp:
        raise AdapterError(f"adapter {directory} was made for the base {base.get('path')} (weights "
                           f"{short(theirs)}), not {base_name} (weights {short(base_fp)}); load it over "
                           "the base it was trained on, or train it again on this one")


def read_adapter(directory: str | Path, config: BertConfig, *, base_fp: str | None = None,
                 base_name: str = "this base", encoder: nn.Module | None = None) -> AdapterFiles:
    """Read and check an adapter directory for a base of `config` (fingerprint `base_fp`; its
    `encoder` when at hand, see `module_table`).

    Raises AdapterError naming what does not fit: a missing or half-written file, another base,
    a module the base lacks, a rank or size that differs.
    """
    directory = Path(directory)
    peft, side = read_config(directory)
    check_base(directory, side, config, base_fp, base_name)
    if config.family.shares_layers:
        raise AdapterError("adapters over ALBERT are not supported (its layers are shared across the depth)")
    weights = directory / ADAPTER_WEIGHTS
    if not weights.is_file():
        raise AdapterError(f"{directory} has {ADAPTER_CONFIG} but no {ADAPTER_WEIGHTS}: a half-written "
                           "adapter; write it again")
    try:
        saved = load_file(str(weights))
    except (SafetensorError, OSError, ValueError) as err:
        raise AdapterError(f"{weights} is truncated or damaged ({err}); write the adapter again") from None
    r, alpha = int(peft["r"]), float(peft["lora_alpha"])
    scale = alpha / math.sqrt(r) if peft.get("use_rslora") else alpha / r
    table, inputs = module_table(config, encoder)
    pieces: dict[str, dict[str, torch.Tensor]] = {}
    head_hf: dict[str, torch.Tensor] = {}
    for key, tensor in saved.items():
        if not key.startswith(PEFT_PREFIX):
            raise AdapterError(f"{weights}: tensor {key!r} is not under PEFT's {PEFT_PREFIX!r}; is this a "
                               "PEFT adapter?")
        name = re.sub(r"\.modules_to_save\.[^.]+\.", ".", key[len(PEFT_PREFIX):])
        if ".lora_embedding_" in name or ".lora_magnitude" in name:
            raise AdapterError(f"{weights}: {key} adapts an embedding or is DoRA's; bertkit reads LoRA on "
                               "Linear layers only")
        found = re.match(r"^(.*)\.lora_([AB])(?:\.[^.]+)?\.weight$", name)
        if found is None:
            head_hf[name] = tensor
            continue
        module, which = found.groups()
        if module not in table:
            known = sorted({n for n in table if "layer.0." in n or n.startswith("0.")})[:8]
            raise AdapterError(f"{weights}: {key} adapts {module!r}, a module this base ({base_name}, "
                               f"{config.model_type}) does not have; its adaptable modules are named like "
                               f"{', '.join(known)}")
        pieces.setdefault(module, {})[which] = tensor
    deltas: dict[str, list[LowRank]] = {}
    for module, pair in sorted(pieces.items()):
        if set(pair) != {"A", "B"}:
            raise AdapterError(f"{weights}: {module} has lora_{''.join(pair)} without its pair; a half-written adapter")
        ours, lo, hi = table[module]
        a, b = pair["A"].float(), pair["B"].float()
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != r or b.shape[1] != r:
            raise AdapterError(f"{weights}: {module} has rank {a.shape[0]} (lora_A {tuple(a.shape)}, lora_B "
                               f"{tuple(b.shape)}), but {ADAPTER_CONFIG} says r={r}")
        if a.shape[1] != inputs[ours] or b.shape[0] != hi - lo:
            raise AdapterError(f"{weights}: {module} is sized for a Linear {a.shape[1]} → {b.shape[0]}, but "
                               f"{base_name}'s is {inputs[ours]} → {hi - lo}; the adapter belongs to another base")
        deltas.setdefault(ours, []).append(LowRank(lo, hi, a.contiguous(), (b * scale).contiguous()))
    if not deltas:
        raise AdapterError(f"{weights} holds no lora_A / lora_B tensors: not a LoRA adapter")
    head = from_hf_state_dict(head_hf, has_base_prefix=True, config=config) if head_hf else {}
    use = (side or {}).get("use") or PEFT_USES.get(peft.get("task_type"))
    if use not in tasks.USES or use == "fill-mask":
        raise AdapterError(f"{directory}: task {peft.get('task_type') if side is None else use!r} is not one "
                           "adapters serve (classify, rerank, ner, qa, embed)")
    side = side or {}
    return AdapterFiles(directory, use, r, alpha, deltas, head, labels=side.get("labels"),
                        problem_type=side.get("problem_type"), max_length=side.get("max_length"),
                        pooling=side.get("pooling"), base=side.get("base"), targets=sorted(pieces))


# ---------------------------------------------------------------------------------------------
# an adapter directory where a model is asked for
# ---------------------------------------------------------------------------------------------
def is_adapter_dir(path: str | os.PathLike) -> bool:
    """Whether `path` is a LoRA adapter directory (adapter_config.json) rather than a model (a
    directory with config.json is a model, whatever else it holds)."""
    path = Path(path)
    return path.is_dir() and (path / ADAPTER_CONFIG).is_file() and not (path / "config.json").is_file()


def base_of(adapter_dir: str | os.PathLike, base: str | os.PathLike | None = None) -> Path:
    """The model directory an adapter runs over: `base` when given (`--base`), else the local
    directory adapter_config.json's `base_model_name_or_path` names. A name that is not a local
    model directory (a hub id, a path of another machine) is an AdapterError naming it and `--base`:
    nothing is downloaded."""
    if base is not None:
        return model_directory(base, "--base")
    config, _ = read_config(adapter_dir)
    named = config.get("base_model_name_or_path")
    if isinstance(named, str) and named and (Path(named) / "config.json").is_file():
        return Path(named)
    raise AdapterError(f"adapter {adapter_dir}: its base, adapter_config.json's base_model_name_or_path "
                       f"{named!r}, is not a model directory here; pass --base DIR, the base model it was "
                       "trained on")


def resolve(model: str | os.PathLike, adapter: str | os.PathLike | None = None,
            base: str | os.PathLike | None = None) -> tuple[Path, Path | None]:
    """(base model directory, adapter directory or None) of what a user named as the model.

    model: a model directory, or an adapter directory (its base from `base_of`).
    adapter: an adapter directory run over `model`, its base (`--model BASE --adapter DIR`).
    base: the base of an adapter given as `model`, when adapter_config.json's is not here.
    Every entry point (the use commands, predict, eval, serve, `bertkit.load`) resolves here.
    """
    if adapter is not None:
        if is_adapter_dir(model):
            raise AdapterError(f"{model} is a LoRA adapter directory, so it cannot be the base of --adapter "
                               f"{adapter}; pass the base model directory, or the adapter alone")
        if base is not None:
            raise AdapterError("--base names the base of an adapter given as the model; with --adapter, "
                               "the model is the base: leave out --base")
        read_config(adapter)  # an adapter directory, or an error saying what it is instead
        return model_directory(model), Path(adapter)
    if is_adapter_dir(model):
        return base_of(model, base), Path(model)
    if base is not None:
        raise AdapterError(f"--base goes with a LoRA adapter directory as the model; {model} has no "
                           f"{ADAPTER_CONFIG}: leave out --base")
    return model_directory(model), None


__all__ = ["AdapterError", "AdapterFiles", "LowRank", "read_adapter", "read_config", "write_side_file",
           "fingerprint", "base_record", "module_table", "SIDE_FILE", "ADAPTER_CONFIG", "ADAPTER_WEIGHTS",
           "is_adapter_dir", "base_of", "resolve"]
