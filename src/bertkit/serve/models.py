"""The models one process serves: each directory loaded once, for every use its head supports.

A directory's head, the use it serves and the routes that adds are read from the task table
(`bertkit.encoder.tasks`: `use_of`, `USES[use].routes`). One Engine per directory, for its head; every model
also embeds (the encoder under any head) and tokenizes, so a classifier's sentence vectors are one
route away without loading it twice (v1/embeddings is the embed route in OpenAI's shape).
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertkit.data.tokenizer import BertTokenizer
from bertkit.encoder import tasks
from bertkit.encoder.m3 import M3_ROUTES
from bertkit.encoder.sentence_transformers import SpladePooling, sentence_transformers_settings
from bertkit.inference import Engine
from bertkit.util.fileio import model_directory


@dataclass
class ServedModel:
    """One model of the service: its name, engine, the routes it answers and its own tokenizer.

    `tokenizer` and `loop_tokenizer` are copies of the engine's, one used only by the tokenizing
    thread and one only by the event loop (short inputs, where a thread hop costs more than the
    tokenizing): a `tokenizers` object keeps its truncation settings as state, so two threads
    must never share one.
    """
    name: str
    engine: Engine
    tokenizer: BertTokenizer
    uses: tuple[str, ...]
    loop_tokenizer: BertTokenizer | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # sentence-transformers' config_sentence_transformers.json: named prompts put before a text,
    # the one used when a request names none, and `truncate_dim` (a Matryoshka model's own
    # output size): declaring it is what allows a request's `dimensions`.
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    truncate_dim: int | None = None
    # a LoRA adapter (serve/adapters.py): the served model it adapts, and what it is
    base: str | None = None
    adapter: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.loop_tokenizer is None:
            self.loop_tokenizer = copy.deepcopy(self.tokenizer)

    @property
    def max_length(self) -> int:
        return int(self.engine.max_length)

    @property
    def splade(self) -> SpladePooling:
        """How /embed_sparse pools the MLM logits: a SparseEncoder directory's own settings, else
        SPLADE v2's (read once)."""
        if "splade" not in self.extra:
            self.extra["splade"] = SpladePooling.read(self.engine.model_dir)
        return self.extra["splade"]

    def describe(self) -> dict[str, Any]:
        """TEI's /info fields for this model, plus the uses it serves."""
        config = self.engine.config
        if "predict" in self.uses:
            labels = dict(enumerate(tasks.label_names(config)))
            kind = "reranker" if "rerank" in self.uses else "classifier"
            model_type = {kind: {"id2label": {str(k): v for k, v in labels.items()},
                                 "label2id": {v: k for k, v in labels.items()}}}
        else:
            embedding: dict[str, Any] = {"pooling": self.engine.pooling.mode if self.engine.pooling else "mean"}
            if self.engine.m3 is not None:  # BGE-M3: lexical weights and ColBERT vectors of its own heads
                embedding["m3"] = {"colbert_dim": self.engine.m3.colbert_dim}
            elif "embed_sparse" in self.uses:  # TEI says "splade" for a SPLADE model; the settings are ours
                if self.splade.declared:
                    embedding["pooling"] = "splade"
                embedding["splade"] = {"pooling_strategy": self.splade.pooling_strategy,
                                       "activation_function": self.splade.activation_function}
            model_type = {"embedding": embedding}
        return {"name": self.name, "model_id": str(self.engine.model_dir), "model_sha": None,
                "model_dtype": {"fp32": "float32", "bf16": "bfloat16", "int8": "int8",
                                "int8-static": "int8"}[self.engine.precision],
                "precision": self.engine.precision, "device": str(self.engine.device),
                "model_type": model_type, "uses": list(self.uses), "max_input_length": self.max_length,
                "hidden_size": config.hidden_size, "prompts": dict(self.prompts),
                "default_prompt_name": self.default_prompt_name, "truncate_dim": self.truncate_dim,
                **({"base": self.base, "adapter": self.adapter} if self.base is not None else {})}


def load_model(name: str, model_dir: str | os.PathLike, **engine_options: Any) -> ServedModel:
    """Load `model_dir` for its head (see the module docstring); errors name the directory."""
    path = model_directory(model_dir)
    use = tasks.use_of(path)
    engine = Engine.load(path, use=use, **engine_options)
    routes = [*tasks.COMMON_ROUTES, *tasks.USES[use].routes]
    if use == "classify" and tasks.is_cross_encoder(engine.config):
        routes += tasks.USES["rerank"].routes
    if engine.m3 is not None:  # BGE-M3's heads: lexical weights and ColBERT vectors beside the encoder
        routes += [r for r in M3_ROUTES if r not in routes]
    settings = sentence_transformers_settings(path)  # prompts, default_prompt_name, truncate_dim
    return ServedModel(name, engine, BertTokenizer.from_pretrained(path), tuple(routes), **settings)


def parse_served_names(specs: list[str], models: list[str]) -> dict[str, str]:
    """--served-model-name values → {alias: model}. "ALIAS[,ALIAS...]" names the first model;
    "MODEL=ALIAS[,ALIAS...]" the model named MODEL. Every name, model or alias, is unique."""
    aliases: dict[str, str] = {}
    for spec in specs:
        target, sep, names = spec.rpartition("=")
        target = target if sep else models[0]
        if target not in models:
            raise ValueError(f"--served-model-name {spec!r}: no model is named {target!r}; models: "
                             f"{', '.join(map(repr, models))}")
        for alias in names.split(","):
            alias = alias.strip()
            if not alias:
                raise ValueError(f"--served-model-name {spec!r} has an empty name")
            if alias in models or alias in aliases:
                raise ValueError(f"--served-model-name: the name {alias!r} is taken (by "
                                 f"{'a model' if alias in models else 'model ' + repr(aliases[alias])}); "
                                 "model names and aliases must be unique")
            aliases[alias] = target
    return aliases


def parse_named_dirs(specs: list[str], *, what: str, plural: str, form: str,
                     flag: str = "") -> list[tuple[str, str]]:
    """["DIR", "NAME=DIR", ...] → [(name, dir)]; a bare DIR (or one that exists with a "=" in its
    path) is named after its last part. Names are unique; the errors name `what` and show `form`."""
    out: list[tuple[str, str]] = []
    for spec in specs:
        name, sep, directory = spec.partition("=")
        if not sep or not name or os.path.exists(spec):
            name, directory = Path(spec.rstrip("/")).name or spec, spec
        if not directory:
            raise ValueError(f"{what} {spec!r} has an empty directory; write {form}")
        if any(name == seen for seen, _ in out):
            raise ValueError(f"two {plural} are named {name!r}; name them apart with {flag}{form}")
        out.append((name, directory))
    return out


def parse_model_args(specs: list[str]) -> list[tuple[str, str]]:
    """["DIR", "NAME=DIR", ...] → [(name, dir)]; a bare DIR is named after its last part."""
    out = parse_named_dirs(specs, what="model", plural="models", form="NAME=MODEL_DIR")
    if not out:
        raise ValueError("bertkit serve needs at least one MODEL_DIR")
    return out
