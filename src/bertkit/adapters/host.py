"""One base encoder in memory, any number of named LoRA adapters over it, loaded and dropped at
run time, their rows batched together.

    host = AdapterHost(Engine.load("minilm", use="embed"), "minilm")
    topics = host.add("topics", "runs/topics-lora")        # an Adapter; .engine is its view
    classify(topics.engine, ["Shares fell sharply"])       # every use works on the view
    host.remove("topics")

Attaching wraps each Linear of the encoder's layers (and its pooler) in a `RoutedLinear`; the base
weights stay where they are, prepared once in the engine's precision. An adapter adds its
low-rank terms to those layers under a slot number, and its task head (the classifier, tagger,
QA or pooler tensors it trained) as a small task model whose `.bert` *is* the shared encoder.
`Adapter.engine` is the base engine seen through that model (`Engine.view`): classify, ner, qa,
rerank and embed run on it as on a merged model, and equal the adapter merged into a full copy of
the base (fp32: within 1e-5).

Mixed batches: `mixed_logits` and `mixed_embeddings` run sequences of several adapters (and the
base) in one engine run — the base's matmuls once over every row, each adapter's terms and head on
its own rows (`routed.Routing`). The service uses them to batch requests for different adapters
together.

int8: the base's Linear layers stay int8 and the adapters' terms and heads run in fp32 beside
them; the engine's fused int8 feed-forward (`Int8EncoderLayer`) gives way to the plain layer
order, since the terms must be added between its steps.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from torch import nn

from bertkit.adapters.files import MODULES, AdapterError, AdapterFiles, fingerprint, read_adapter, resolve
from bertkit.adapters.routed import RoutedLinear, Routing
from bertkit.constants import label_name
from bertkit.encoder import tasks
from bertkit.encoder.heads import use_class
from bertkit.encoder.model import BertModel, EncoderLayer, encoder_of
from bertkit.inference.embed import pool
from bertkit.inference.engine import Engine, Pooling


@dataclass
class Adapter:
    """A loaded adapter: its name, slot, what was read, and the engine that runs it."""
    name: str
    slot: int
    files: AdapterFiles
    engine: Engine

    @property
    def use(self) -> str:
        return self.files.use

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "dir": str(self.files.directory), "use": self.use, "r": self.files.r,
                "lora_alpha": self.files.alpha, "parameters": self.files.parameters,
                "labels": self.files.labels, "targets": len(self.files.targets)}


class AdapterHost:
    """A base engine and the adapters over its encoder (see the module docstring)."""

    def __init__(self, engine: Engine, base_dir: str | os.PathLike | None = None, name: str | None = None):
        if engine.routing is not None:
            raise ValueError("this engine has adapters attached already; make one AdapterHost per base")
        if engine.config.family.shares_layers:
            raise AdapterError("adapters over ALBERT are not supported (its layers are shared across the depth)")
        self.engine = engine
        self.encoder: BertModel = encoder_of(engine.model)
        base_dir = base_dir if base_dir is not None else engine.model_dir
        self.base_dir = Path(base_dir) if base_dir is not None else None
        self.name = name or (self.base_dir.name if self.base_dir else "base")
        self.fingerprint = self._fingerprint()
        self.routing = Routing()
        self.adapters: dict[str, Adapter] = {}
        self._slots = 0
        self._lock = threading.Lock()
        self._wrap()
        engine.routing, engine.adapter_slot = self.routing, None

    def _fingerprint(self) -> str | None:
        """The base weights' digest (`files.fingerprint`), from the engine's own fp32 weights, or
        read again from the base directory when the engine holds them in bf16 or int8."""
        if self.engine.precision == "fp32":
            return fingerprint(self.encoder)
        if self.base_dir is not None:
            return fingerprint(BertModel.from_pretrained(self.base_dir))
        return None

    def _wrap(self) -> None:
        for layer in self.encoder.layers:
            if isinstance(layer, EncoderLayer) and type(layer) is not EncoderLayer:
                layer.__class__ = EncoderLayer  # int8's fused feed-forward has no place for the terms
            for module in MODULES:
                setattr(layer, module, RoutedLinear(getattr(layer, module), self.routing))
        if self.encoder.pooler is not None:
            self.encoder.pooler = RoutedLinear(self.encoder.pooler, self.routing)

    def routed(self) -> list[RoutedLinear]:
        return [m for m in self.encoder.modules() if isinstance(m, RoutedLinear)]

    # -- loading and dropping --------------------------------------------------------------------
    def add(self, name: str, directory: str | os.PathLike, *, max_length: int | None = None) -> Adapter:
        """Read, check and install the adapter in `directory` as `name`; AdapterError when it does
        not fit this base (nothing is installed then)."""
        if name in self.adapters:
            raise ValueError(f"an adapter named {name!r} is loaded already; drop it first or choose another name")
        if self.engine.precision == "int8-static":
            # The fixed input scales were measured on the base alone; an adapter's terms move every
            # later layer's inputs off them (a tiny classifier's logits measured 0.078 off fp32
            # against int8's 0.0013), so the pair is refused rather than run that far off.
            raise AdapterError(f"{directory}: int8-static's scales were calibrated on the base alone and an adapter "
                               "changes the activations they fit; run the adapter at --precision int8, or save it "
                               "merged (finetune --lora-save merged) and calibrate the merged model")
        where = str(self.base_dir) if self.base_dir is not None else "in memory"
        base_name = where if self.base_dir is not None and self.base_dir.name == self.name else f"{self.name} ({where})"
        files = read_adapter(directory, self.engine.config, base_fp=self.fingerprint, base_name=base_name,
                             encoder=self.encoder)
        model = self._task_model(files)
        dtype, device = self.engine.float_dtype, self.engine.device
        own_pooler = {k[len("bert.pooler."):]: v for k, v in files.head.items() if k.startswith("bert.pooler.")}
        if own_pooler and self.encoder.pooler is None:
            raise AdapterError(f"{directory} brings its own pooler, but the base {self.name} has none")
        with self._lock:
            slot = self._slots
            self._slots += 1
            with self.routing.lock:
                for module, terms in files.deltas.items():
                    self.encoder.get_submodule(module).add_slot(slot, [
                        (t.lo, t.hi, t.a.to(device, dtype), t.b.to(device, dtype)) for t in terms])
                if own_pooler:
                    self.encoder.pooler.add_slot(slot, dense=(own_pooler["weight"].to(device, dtype),
                                                              own_pooler["bias"].to(device, dtype)))
        if files.use == "embed":
            length = max_length or files.max_length or self.engine.max_length
        elif files.use == "rerank":
            length = max_length or files.max_length
        else:
            length = max_length
        pooling = self.engine.pooling
        if files.pooling:
            pooling = Pooling(files.pooling, pooling.normalize if pooling else True, files.max_length)
        view = self.engine.view(model, files.use, adapter_slot=slot, max_length=length, pooling=pooling)
        adapter = Adapter(name, slot, files, view)
        self.adapters[name] = adapter
        return adapter

    def remove(self, name: str) -> Adapter:
        """Drop an adapter: its terms leave the layers between two batches (under the routing's lock)."""
        if name not in self.adapters:
            raise KeyError(f"no adapter {name!r} is loaded; loaded: {', '.join(map(repr, self.adapters)) or 'none'}")
        adapter = self.adapters.pop(name)
        with self.routing.lock:
            for module in self.routed():
                module.drop_slot(adapter.slot)
        return adapter

    def _task_model(self, files: AdapterFiles) -> nn.Module:
        """The adapter's task model: its own head over the shared encoder (no copy of the base)."""
        head = {k: v for k, v in files.head.items() if not k.startswith("bert.")}
        stray = [k for k in files.head if k.startswith("bert.") and not k.startswith("bert.pooler.")]
        if stray:
            raise AdapterError(f"{files.directory}: the adapter replaces encoder tensors ({stray[0]}, ...) "
                               "beyond its LoRA terms; merge it into a model instead")
        if files.use == "embed":
            if head:
                raise AdapterError(f"{files.directory}: an embedding adapter with head tensors "
                                   f"({', '.join(sorted(head)[:3])}); save it with --task embed")
            return self.encoder
        config = self.engine.config
        if files.use in ("classify", "rerank", "ner"):
            weight = head.get("classifier.weight", head.get("classifier.out_proj.weight"))
            count = len(files.labels) if files.labels else (weight.shape[0] if weight is not None else 0)
            if count < 1:
                raise AdapterError(f"{files.directory}: a {files.use} adapter without a classifier "
                                   "(classifier.weight) or labels")
            names = files.labels or [label_name(i) for i in range(count)]
            config = config.replace(id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)},
                                    problem_type=files.problem_type)
        # Built over a one-layer stand-in encoder (a few kB; the meta device would do, but its first
        # use imports ~70 MB of torch's decompositions), whose place the shared encoder then takes.
        stand_in = config.replace(vocab_size=8, num_hidden_layers=1, intermediate_size=8,
                                  max_position_embeddings=8)
        model = use_class(files.use)(stand_in).to(self.engine.device)
        model.bert, model.config = self.encoder, config
        own = {k: v for k, v in model.state_dict().items() if not k.startswith("bert.")}
        missing = sorted(set(own) - set(head))
        unexpected = sorted(set(head) - set(own))
        wrong = [f"{k} {tuple(head[k].shape)} (the head needs {tuple(own[k].shape)})"
                 for k in own if k in head and head[k].shape != own[k].shape]
        if missing or unexpected or wrong:
            raise AdapterError(f"{files.directory}: its head does not fit a {files.use} model of this base: "
                               + "; ".join(p for p in (f"missing {', '.join(missing)}" if missing else "",
                                                       f"unexpected {', '.join(unexpected)}" if unexpected else "",
                                                       f"sized {', '.join(wrong)}" if wrong else "") if p))
        model.load_state_dict(head, strict=False)
        model.eval()
        for child_name, child in model.named_children():
            if child_name == "bert":
                continue
            if self.engine.precision == "bf16":
                child.to(torch.bfloat16)
            elif self.engine.precision == "int8":
                from bertkit.backend.int8 import quantize_linears

                quantize_linears(child)
        return model


# ---------------------------------------------------------------------------------------------
# mixed batches
# ---------------------------------------------------------------------------------------------
def _by_slot(slots: Sequence[int | None]) -> dict[int | None, list[int]]:
    groups: dict[int | None, list[int]] = {}
    for row, slot in enumerate(slots):
        groups.setdefault(slot, []).append(row)
    return groups


def mixed_logits(engine: Engine, ids: Sequence[Sequence[int]], type_ids: Sequence[Sequence[int]] | None,
                 adapters: Sequence[int | None], models: Mapping[int | None, nn.Module]) -> list[torch.Tensor]:
    """(K_s,) float32 logits of each sequence by its adapter's classifier (`models[slot]`, a
    sequence classifier over the engine's encoder), sequences of any adapters in the same batches."""
    if any(getattr(m, "mean_pooling", False) for m in models.values()):
        raise ValueError("mixed batches read the first token; a mean-pooling classifier runs alone")
    encoder = encoder_of(engine.model)

    def head(_model, batch) -> list[torch.Tensor]:
        found = encoder.forward_packed(batch.input_ids, batch.token_type_ids, batch.packed, first_only=True)
        rows: list[Any] = [None] * len(batch.index)
        for slot, members in _by_slot(batch.adapters).items():
            index = torch.tensor(members, device=found.hidden.device)
            pooled = None if found.pooler_output is None else found.pooler_output[index]  # (n, H)
            logits = models[slot].sentence_logits(found.hidden[index], pooled).float().cpu()  # (n, K_s)
            for row, value in zip(members, logits):
                rows[row] = value
        return rows

    return engine.run_ordered(ids, type_ids, head, adapters=adapters)


def mixed_embeddings(engine: Engine, ids: Sequence[Sequence[int]], type_ids: Sequence[Sequence[int]] | None,
                     adapters: Sequence[int | None], mode: str) -> list[torch.Tensor]:
    """(H,) float32 pooled vector of each sequence through its adapter's terms (not normalized)."""
    encoder = encoder_of(engine.model)

    def head(_model, batch) -> torch.Tensor:
        hidden = encoder.forward_packed(batch.input_ids, batch.token_type_ids, batch.packed).hidden  # (N, H)
        return pool(hidden, batch, mode).cpu()  # (B, H)

    return engine.run_ordered(ids, type_ids, head, adapters=adapters)


def load_engine(base: str | os.PathLike, adapter: str | os.PathLike, *, name: str = "adapter",
                **options: Any) -> Engine:
    """The engine of one adapter over its base (what `bertkit classify BASE --adapter DIR` runs):
    the base loaded once, the adapter's terms and head over it. options: `Engine.load`'s."""
    max_length = options.get("max_length")
    host = AdapterHost(Engine.load(base, use="embed", **options), base)
    return host.add(name, adapter, max_length=max_length).engine


def open_engine(model: str | os.PathLike, *, adapter: str | os.PathLike | None = None,
                base: str | os.PathLike | None = None, use: str | None = None, **options: Any) -> Engine:
    """The engine of what a user named as the model (`files.resolve`): a model directory loaded for
    `use` (default: its head's, `tasks.use_of`), or an adapter over its base (`load_engine`; its
    use is the adapter's own, and the caller checks it fits). options: `Engine.load`'s."""
    base_dir, adapter_dir = resolve(model, adapter, base)
    if adapter_dir is None:
        return Engine.load(base_dir, use=use or tasks.use_of(base_dir), **options)
    return load_engine(base_dir, adapter_dir, **options)


__all__ = ["AdapterHost", "Adapter", "mixed_logits", "mixed_embeddings", "load_engine", "open_engine"]
