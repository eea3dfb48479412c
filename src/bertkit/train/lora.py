"""LoRA: low-rank adapters on a frozen encoder (Hu et al. 2021), saved merged or in PEFT's format.

An adapted projection computes y = x Wᵀ + b + (dropout(x) Aᵀ Bᵀ) · alpha / r, with A (r, in)
drawn as PEFT draws it (Kaiming-uniform, a = √5) and B (out, r) zero, so training starts from the
pre-trained function. Only the adapters and the task head (PEFT's `modules_to_save`) train.

bertkit's layers hold Q, K and V as one fused `qkv` projection (3H outputs); a target among
query / key / value gets its own A, B pair whose delta lands on that third of the outputs, so the
fused matrix multiply stays one call and each slice equals what PEFT computes on transformers'
separate `query` / `key` / `value` Linear.

Targets are named as PEFT names BERT's modules:

    target            transformers module (per layer)       bertkit
    query|key|value   attention.self.{query,key,value}      qkv, rows [0:H] | [H:2H] | [2H:3H]
    attention.output  attention.output.dense                attn_out
    intermediate      intermediate.dense                    ffn_in
    output            output.dense                          ffn_out

ModernBERT's targets are its own module names, as PEFT names them (its Q/K/V are fused already);
each family's targets are its record's (`Family.lora_targets` in `bertkit.families`):

    Wqkv              attn.Wqkv                             qkv (whole)
    Wo                attn.Wo and mlp.Wo                    attn_out and ffn_out
    Wi                mlp.Wi                                ffn_in

Two ways to save (`save_lora`):
  merged    B·A·scale added into each adapted weight (slice): a plain Hugging Face checkpoint,
            no inference cost, loaded by every bertkit and transformers tool;
  adapters  PEFT's files: adapter_config.json (peft_type LORA, r, lora_alpha, lora_dropout,
            target_modules, base_model_name_or_path, task_type, modules_to_save) and
            adapter_model.safetensors under PEFT's names, e.g.
            base_model.model.bert.encoder.layer.0.attention.self.query.lora_A.weight and
            base_model.model.classifier.weight, which `peft.PeftModel.from_pretrained` loads onto
            transformers' BertFor… with the same outputs.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from bertkit.adapters.files import base_record, fingerprint, write_side_file
from bertkit.constants import label_name
from bertkit.encoder.checkpoint import (
    architecture_name,
    from_hf_state_dict,
    load_into,
    name_map,
    read_state_dict,
    to_hf_state_dict,
)
from bertkit.encoder.config import BertConfig
from bertkit.encoder.model import encoder_of
from bertkit.families import FAMILIES
from bertkit.util.fileio import atomic_path, atomic_write_json

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# Adapters of a training state (bertkit names), next to the frozen base weights in model.safetensors.
STATE_WEIGHTS = "lora_state.safetensors"
SAVE_MODES = ("merged", "adapters")
# target → (bertkit module in a layer, index of its third of the fused qkv, or None for the whole):
# every family's targets (`Family.lora_targets`), each by its first module.
TARGETS: dict[str, tuple[str, int | None]] = {
    target: modules[0] for family in FAMILIES.values() for target, modules in family.lora_targets.items()}


def modules_of(target: str, config: BertConfig) -> tuple[tuple[str, int | None], ...]:
    """(bertkit module in a layer, third of the fused qkv or None) pairs a target adapts in a model
    of `config`'s family; ValueError when the target names no module of that family."""
    own = config.family.lora_targets
    if target not in own:
        raise ValueError(f"LoRA target {target!r} is not a module of a {config.model_type} model; choose among "
                         f"{', '.join(own)}")
    return own[target]
PEFT_TASK_TYPES = {"BertForSequenceClassification": "SEQ_CLS", "BertForTokenClassification": "TOKEN_CLS",
                   "BertForQuestionAnswering": "QUESTION_ANS", "BertModel": "FEATURE_EXTRACTION"}
PEFT_PREFIX = "base_model.model."


@dataclass
class LoraSpec:
    """What `--lora r=8,alpha=16,dropout=0.05,targets=query,value` asks for."""

    r: int = 8
    alpha: float = 16.0
    dropout: float = 0.05
    targets: tuple[str, ...] = ("query", "value")

    def __post_init__(self) -> None:
        self.targets = tuple(self.targets)
        problems = []
        if not isinstance(self.r, int) or self.r < 1:
            problems.append(f"r must be a positive integer, got {self.r!r}")
        if not self.alpha > 0:
            problems.append(f"alpha must be > 0, got {self.alpha!r}")
        if not 0 <= self.dropout < 1:
            problems.append(f"dropout must be in [0, 1), got {self.dropout!r}")
        unknown = [t for t in self.targets if t not in TARGETS]
        if unknown or not self.targets:
            problems.append(f"targets {', '.join(unknown) or '(none)'} unknown; choose among "
                            f"{', '.join(TARGETS)}")
        if len(set(self.targets)) != len(self.targets):
            problems.append(f"targets {', '.join(self.targets)} repeat a name")
        if problems:
            raise ValueError("invalid --lora: " + "; ".join(problems))

    @property
    def scale(self) -> float:
        return self.alpha / self.r

    @classmethod
    def parse(cls, text: str) -> "LoraSpec":
        """"r=8,alpha=16,dropout=0.05,targets=query,value" → LoraSpec. Items after `targets=` that
        hold no `=` are further targets (the list is comma-separated like the rest)."""
        values: dict[str, Any] = {}
        targets: list[str] = []
        current = None
        for item in (part.strip() for part in str(text).split(",")):
            if not item:
                continue
            if "=" in item:
                key, value = (s.strip() for s in item.split("=", 1))
                current = key
                try:
                    if key == "r":
                        values["r"] = int(value)
                    elif key in ("alpha", "dropout"):
                        values[key] = float(value)
                    elif key == "targets":
                        targets = [value] if value else []
                    else:
                        raise ValueError(f"invalid --lora {text!r}: unknown key {key!r}; use r, alpha, "
                                         "dropout, targets (e.g. r=8,alpha=16,dropout=0.05,targets=query,value)")
                except ValueError as err:
                    if "unknown key" in str(err):
                        raise
                    raise ValueError(f"invalid --lora {text!r}: {key}={value!r} is not a number") from None
            elif current == "targets":
                targets.append(item)
            else:
                raise ValueError(f"invalid --lora {text!r}: {item!r} has no '='; write key=value pairs "
                                 "(r=8,alpha=16,dropout=0.05,targets=query,value)")
        if targets:
            values["targets"] = tuple(targets)
        return cls(**values)

    def to_text(self) -> str:
        return f"r={self.r},alpha={self.alpha:g},dropout={self.dropout:g},targets={','.join(self.targets)}"


class LoRALinear(nn.Linear):
    """An nn.Linear (same `weight` / `bias`, so checkpoint names do not change) plus low-rank deltas
    on row slices of its output: one per target, e.g. the query third of a fused qkv."""

    def __init__(self, linear: nn.Linear, slices: dict[str, tuple[int, int]], spec: LoraSpec):
        nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias  # the same (frozen) tensors
        # parameter names cannot hold dots: attention.output → attention_output
        self.slices = {target.replace(".", "_"): span for target, span in slices.items()}
        self.targets = {target.replace(".", "_"): target for target in slices}
        self.scale = spec.scale
        self.lora_A = nn.ParameterDict()
        self.lora_B = nn.ParameterDict()
        device = linear.weight.device
        for name, (lo, hi) in self.slices.items():
            a = torch.empty(spec.r, self.in_features, device=device)
            nn.init.kaiming_uniform_(a, a=math.sqrt(5))  # PEFT's init of lora_A
            self.lora_A[name] = nn.Parameter(a)  # (r, in)
            self.lora_B[name] = nn.Parameter(torch.zeros(hi - lo, spec.r, device=device))  # (out_slice, r)
        # one dropout per target, as PEFT has one per adapted module
        self.lora_dropout = nn.ModuleDict({name: nn.Dropout(spec.dropout) for name in self.slices})
        self.train(linear.training)  # new modules start in training mode; keep the model's mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)  # (N, out)
        for name, (lo, hi) in self.slices.items():
            a, b = self.lora_A[name], self.lora_B[name]
            delta = F.linear(F.linear(self.lora_dropout[name](x), a), b) * self.scale  # (N, r) → (N, hi - lo)
            # in place on the slice: linear's backward needs x and W, not y, so this is safe for autograd
            y[..., lo:hi] += delta.to(y.dtype)
        return y

    def merged_weight(self) -> torch.Tensor:
        """(out, in) W with every slice's B·A·scale added: the layer's function as one matrix."""
        weight = self.weight.detach().clone()
        for name, (lo, hi) in self.slices.items():
            weight[lo:hi] += (self.lora_B[name] @ self.lora_A[name]).detach() * self.scale
        return weight


@dataclass
class LoraReport:
    """What `apply_lora` did: the trainable share is the headline number of parameter-efficiency."""

    spec: str
    trainable: int
    total: int
    adapter_parameters: int
    modules_to_save: list[str] = field(default_factory=list)

    @property
    def share(self) -> float:
        return self.trainable / self.total

    def to_dict(self) -> dict[str, Any]:
        return {"spec": self.spec, "trainable_parameters": self.trainable, "total_parameters": self.total,
                "adapter_parameters": self.adapter_parameters, "trainable_share": round(self.share, 6),
                "modules_to_save": self.modules_to_save}

    def summary(self) -> str:
        return (f"LoRA {self.spec}: {self.trainable:,} trainable of {self.total:,} parameters "
                f"({100 * self.share:.3f}%; adapters {self.adapter_parameters:,}, head "
                f"{', '.join(self.modules_to_save)})")


def head_modules(model: nn.Module) -> list[str]:
    """Names of the task head's modules (every child with parameters but the encoder), plus the
    pooler when the checkpoint had none (it was initialised afresh, so it is part of the head)."""
    if not hasattr(model, "bert"):  # a bare encoder (embeddings): no head
        return []
    names = [name for name, child in model.named_children()
             if name != "bert" and any(True for _ in child.parameters())]
    report = getattr(model, "load_report", None)
    pooler = getattr(model.bert, "pooler", None)
    if pooler is not None and report is not None and any("pooler" in n for n in report.missing):
        names.append("bert.pooler")
    return names


def apply_lora(model: nn.Module, spec: LoraSpec) -> LoraReport:
    """Freeze `model` and add adapters (in place); the head stays trainable. Returns the counts."""
    if getattr(model, "lora_spec", None) is not None:
        raise ValueError("the model already has LoRA adapters; apply them once")
    if not hasattr(model, "bert") and not hasattr(model, "layers"):
        raise ValueError(f"LoRA needs an encoder or a task model with one under .bert, got {type(model).__name__}")
    config = model.config
    if config.family.shares_layers:
        raise ValueError("LoRA is not supported for ALBERT (its layers are shared across the depth); "
                         "use full fine-tuning or --freeze-encoder")
    hidden = config.hidden_size
    total = sum(p.numel() for p in model.parameters())
    for target in spec.targets:
        modules_of(target, config)
    for param in model.parameters():
        param.requires_grad_(False)
    for layer in encoder_of(model).layers:
        wanted: dict[str, dict[str, tuple[int, int]]] = {}
        for target in spec.targets:
            for module, third in modules_of(target, config):
                out = getattr(layer, module).out_features
                wanted.setdefault(module, {})[target] = ((third * hidden, (third + 1) * hidden)
                                                         if third is not None else (0, out))
        for module, slices in wanted.items():
            setattr(layer, module, LoRALinear(getattr(layer, module), slices, spec))
    heads = head_modules(model)
    for name in heads:
        for param in model.get_submodule(name).parameters():
            param.requires_grad_(True)
    model.lora_spec = spec
    model.lora_modules_to_save = heads
    adapters = sum(p.numel() for n, p in model.named_parameters() if ".lora_" in n)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return LoraReport(spec.to_text(), trainable, total + adapters, adapters, heads)


def _lora_modules(model: nn.Module):
    for k, layer in enumerate(encoder_of(model).layers):
        for module_name in ("qkv", "attn_out", "ffn_in", "ffn_out"):
            module = getattr(layer, module_name)
            if isinstance(module, LoRALinear):
                yield k, module_name, module


def plain_state_dict(model: nn.Module, *, merge: bool) -> dict[str, torch.Tensor]:
    """The model's state under bertkit names without adapter tensors; with `merge`, each adapted
    weight holds W + B·A·scale (so the plain model computes what the adapted one does)."""
    state = {k: v.detach() for k, v in model.state_dict().items() if ".lora_" not in k}
    if merge:
        stem = "bert." if hasattr(model, "bert") else ""
        for k, name, module in _lora_modules(model):
            state[f"{stem}layers.{k}.{name}.weight"] = module.merged_weight()
    return state


def _write_plain(model: nn.Module, state: dict[str, torch.Tensor], out_dir: Path) -> None:
    """config.json + model.safetensors from a bertkit-named state (as checkpoint.write_checkpoint)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    hf = to_hf_state_dict({k: v.cpu() for k, v in state.items()}, model.config)
    with atomic_path(out_dir / "model.safetensors") as tmp:
        save_file(hf, str(tmp), metadata={"format": "pt"})
    model.config.save(out_dir, architectures=[architecture_name(type(model).__name__, model.config)])


def _hf_module_name(model: nn.Module, k: int, module_name: str, target: str) -> str:
    """transformers' module path of layer k's projection for `target`, e.g.
    bert.encoder.layer.0.attention.self.query (from the family's checkpoint name table); a bare
    encoder's (an embedding model's) without the family prefix, as PEFT names them on BertModel."""
    config = model.config
    if module_name == "qkv" and TARGETS[target][1] is not None:
        hf_qkv = to_hf_state_dict({f"bert.layers.{k}.qkv.weight": torch.zeros(3, 1)}, config)
        name = list(hf_qkv)[TARGETS[target][1]][: -len(".weight")]
    else:
        name = next(iter(to_hf_state_dict({f"bert.layers.{k}.{module_name}.weight": torch.zeros(1)}, config)))
        name = name[: -len(".weight")]
    prefix = name_map(config).prefix
    return name if hasattr(model, "bert") or not name.startswith(prefix) else name[len(prefix):]


def adapter_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """PEFT's adapter_model.safetensors content: lora_A / lora_B of every adapted module and the
    head's tensors (modules_to_save), under base_model.model.<transformers name>."""
    out: dict[str, torch.Tensor] = {}
    for k, module_name, module in _lora_modules(model):
        for key, target in module.targets.items():
            stem = PEFT_PREFIX + _hf_module_name(model, k, module_name, target)
            out[f"{stem}.lora_A.weight"] = module.lora_A[key].detach().cpu().contiguous()
            out[f"{stem}.lora_B.weight"] = module.lora_B[key].detach().cpu().contiguous()
    own = model.state_dict()
    head = {n: v.detach().cpu() for n, v in own.items()
            if any(n.startswith(m + ".") for m in model.lora_modules_to_save)}
    for name, tensor in to_hf_state_dict(head, model.config).items():
        out[PEFT_PREFIX + name] = tensor.contiguous()
    return out


def peft_target_modules(model: nn.Module) -> list[str] | str:
    """target_modules for adapter_config.json: PEFT's last-name list when it is unambiguous (the
    q/k/v names), else a regex (PEFT full-matches a string) that names the exact module paths,
    since a suffix `output.dense` would also match `attention.output.dense`."""
    names = sorted({_hf_module_name(model, 0, module, t) for t in model.lora_spec.targets
                    for module, _ in modules_of(t, model.config)})
    if all(TARGETS[t][1] is not None for t in model.lora_spec.targets):
        return sorted(n.rsplit(".", 1)[1] for n in names)
    stem = re.escape(_hf_module_name(model, 0, "attn_out", "attention.output").split(".0.", 1)[0])
    inner = "|".join(re.escape(n.split(".0.", 1)[1]) for n in names)
    return rf"^{stem}\.\d+\.(?:{inner})$"


def save_adapters(model: nn.Module, out_dir: str | Path, base_model: str, *, use: str | None = None,
                  max_length: int | None = None, pooling: str | None = None) -> Path:
    """adapter_config.json + adapter_model.safetensors (PEFT's format) and bertkit_adapter.json
    (the base's fingerprint, the use, the labels: `bertkit.adapters.files`), atomically per file;
    adapter_config.json last, so a directory that has it is whole.
    use: the engine use that runs it (default: the model's head: classify, ner, qa or embed)."""
    spec: LoraSpec = model.lora_spec
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    task_type = PEFT_TASK_TYPES.get(type(model).__name__)
    with atomic_path(out / ADAPTER_WEIGHTS) as tmp:
        save_file(adapter_tensors(model), str(tmp), metadata={"format": "pt"})
    use = use or {"SEQ_CLS": "classify", "TOKEN_CLS": "ner", "QUESTION_ANS": "qa"}.get(task_type, "embed")
    config = model.config
    labels = ([config.id2label.get(i, label_name(i)) for i in range(config.num_labels)]
              if use in ("classify", "rerank", "ner") and config.id2label else None)
    write_side_file(out, use=use, labels=labels, problem_type=config.problem_type, max_length=max_length,
                    pooling=pooling, base=base_record(config, fingerprint(encoder_of(model)), str(base_model)))
    atomic_write_json(out / ADAPTER_CONFIG, {
        "peft_type": "LORA", "task_type": task_type, "base_model_name_or_path": str(base_model),
        "r": spec.r, "lora_alpha": spec.alpha, "lora_dropout": spec.dropout,
        "target_modules": peft_target_modules(model), "modules_to_save": list(model.lora_modules_to_save),
        "bias": "none", "fan_in_fan_out": False, "inference_mode": True, "init_lora_weights": True,
        "use_rslora": False, "use_dora": False, "revision": None})
    return out


def load_adapters(model: nn.Module, adapter_dir: str | Path) -> None:
    """Copy an adapter_model.safetensors written by `save_adapters` into a model that `apply_lora`
    prepared with the same spec (the inverse of `adapter_tensors`)."""
    path = Path(adapter_dir) / ADAPTER_WEIGHTS
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: {adapter_dir} is not a LoRA adapter directory "
                                f"(expected {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS})")
    saved = load_file(str(path))
    wanted = adapter_tensors(model)
    missing = sorted(set(wanted) - set(saved))
    if missing:
        raise ValueError(f"{path} lacks {len(missing)} tensors the adapters need (first: {missing[0]}); "
                         "was it saved with another --lora targets or model?")
    with torch.no_grad():
        for k, module_name, module in _lora_modules(model):
            for key, target in module.targets.items():
                stem = PEFT_PREFIX + _hf_module_name(model, k, module_name, target)
                module.lora_A[key].copy_(saved[f"{stem}.lora_A.weight"])
                module.lora_B[key].copy_(saved[f"{stem}.lora_B.weight"])
    head = {k[len(PEFT_PREFIX):]: v for k, v in saved.items() if ".lora_" not in k}
    # The head alone (load_into would report every encoder tensor as missing from this file)
    converted = from_hf_state_dict(head, has_base_prefix=hasattr(model, "bert"), config=model.config)
    result = model.load_state_dict(converted, strict=False)
    if result.unexpected_keys:
        raise ValueError(f"{path} holds tensors the model does not have ({result.unexpected_keys[0]}, ...); "
                         "was it saved for another task or model?")


def save_lora(model: nn.Module, out_dir: str | Path, mode: str, base_model: str, **side: Any) -> None:
    """The fine-tuned model as `mode`: merged (plain checkpoint) or adapters (PEFT files; `side`:
    save_adapters' use, max_length, pooling)."""
    if mode not in SAVE_MODES:
        raise ValueError(f"--lora-save must be one of {', '.join(SAVE_MODES)}, got {mode!r}")
    if mode == "merged":
        _write_plain(model, plain_state_dict(model, merge=True), Path(out_dir))
    else:
        save_adapters(model, out_dir, base_model, **side)


def save_weights(model: nn.Module, out_dir: Path) -> None:
    """The weights of a training state: a plain model saves itself; an adapted one writes its
    frozen base (unmerged) plus its adapters in bertkit names, which `load_weights` reads back."""
    if getattr(model, "lora_spec", None) is None:
        model.save_pretrained(out_dir)
        return
    _write_plain(model, plain_state_dict(model, merge=False), out_dir)
    adapters = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items() if ".lora_" in k}
    with atomic_path(out_dir / STATE_WEIGHTS) as tmp:
        save_file(adapters, str(tmp), metadata={"format": "pt"})


def load_weights(model: nn.Module, directory: Path) -> None:
    """Inverse of `save_weights`."""
    state = read_state_dict(directory)
    if getattr(model, "lora_spec", None) is None:
        load_into(model, state, str(directory))
        return
    load_into(model, state, str(directory), loaded_next=lambda name: ".lora_" in name)
    adapters = load_file(str(directory / STATE_WEIGHTS))
    result = model.load_state_dict(adapters, strict=False)
    absent = [k for k in result.missing_keys if ".lora_" in k]
    if absent or result.unexpected_keys:
        raise ValueError(f"{directory / STATE_WEIGHTS} does not fit the model's adapters (missing "
                         f"{absent[:2]}, unexpected {result.unexpected_keys[:2]}); resume with the "
                         "original --lora settings")


def read_adapter_config(adapter_dir: str | Path) -> dict[str, Any]:
    path = Path(adapter_dir) / ADAPTER_CONFIG
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: {adapter_dir} is not a LoRA adapter directory")
    return json.loads(path.read_text(encoding="utf-8"))


def spec_of(adapter_config: dict[str, Any], targets: tuple[str, ...]) -> LoraSpec:
    return LoraSpec(r=int(adapter_config["r"]), alpha=float(adapter_config["lora_alpha"]),
                    dropout=float(adapter_config["lora_dropout"]), targets=targets)


__all__ = ["LoraSpec", "LoRALinear", "LoraReport", "apply_lora", "save_lora", "save_adapters",
           "load_adapters", "save_weights", "load_weights", "plain_state_dict", "adapter_tensors",
           "TARGETS", "SAVE_MODES"]
