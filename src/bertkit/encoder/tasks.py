"""Which head does which task: the one table every part of bertkit reads.

A model directory names its head in config.json's `architectures`: a family prefix (`Bert`,
`Roberta`, `Albert`, `DistilBert`; each family's `class_prefix` in `bertkit.families`), then the head's *kind*
(`ForSequenceClassification`, ...). Three vocabularies meet here, as transformers' `models/auto/`
tables join model types, classes and pipelines:

    kind (checkpoint)          bertkit class (Bert…)        engine use  service routes      fine-tune tasks
    Model                      BertModel                    embed       embed, tokenize     embed, colbert
    ForPreTraining             …ForPreTraining              fill-mask   + fill-mask,        (pretrain)
                                                                          embed_sparse
    ForMaskedLM                …ForMaskedLM                 fill-mask   + fill-mask,        (pretrain), sparse
                                                                          embed_sparse
    ForSequenceClassification  …ForSequenceClassification   classify    + predict (rerank)  classify, pair, rerank
    ForTokenClassification     …ForTokenClassification      ner         + ner               ner
    ForQuestionAnswering       …ForQuestionAnswering        qa          + qa                qa
    ForMultipleChoice          …ForMultipleChoice           —           —                   —
    ForReplacedTokenDetection  …ForReplacedTokenDetection   —           —                   —
      (ELECTRA's discriminator, ElectraForPreTraining on disk: a family's `head_kinds` renames a kind)

Every model also embeds (the encoder under any head) and tokenizes. A sequence classifier with one
label that is not a regression is a cross-encoder: its use is `rerank` as well (`is_cross_encoder`).

Readers: the inference engine (the class a use loads and the weights it cannot do without),
serve (the routes of a model), finetune and predict (the head a task trains, the task that suits
a checkpoint), checkpoint (messages naming the wrong kind), explore (what a task model shows) and
`bertkit info`. The classes themselves live in `heads.py` (`heads.model_class(kind)`); this module
holds names only, so that everything down to the checkpoint layer can read it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from bertkit.constants import LABELLED_TASKS, label_name
from bertkit.encoder.config import BertConfig
from bertkit.families import FAMILIES


@dataclass(frozen=True)
class Head:
    """One kind of checkpoint head."""

    kind: str  # the architecture name after the family prefix: "ForSequenceClassification"
    description: str  # for messages: "a sequence classifier"
    class_name: str  # bertkit's class: "BertForSequenceClassification" (heads.model_class)
    weights: str  # bertkit's module holding the head's own tensors ("" = nothing beyond the encoder)
    use: str | None  # the engine use a checkpoint of this kind serves; None: no use runs it


HEADS: dict[str, Head] = {h.kind: h for h in (
    Head("Model", "a bare encoder without a task head", "BertModel", "", "embed"),
    Head("ForPreTraining", "a pre-trained encoder (MLM and NSP/SOP heads, no fine-tuned task head)",
         "BertForPreTraining", "mlm", "fill-mask"),
    Head("ForMaskedLM", "a masked-language model (no fine-tuned task head)", "BertForMaskedLM", "mlm",
         "fill-mask"),
    Head("ForSequenceClassification", "a sequence classifier", "BertForSequenceClassification",
         "classifier", "classify"),
    Head("ForTokenClassification", "a token classifier (tagger)", "BertForTokenClassification",
         "classifier", "ner"),
    Head("ForQuestionAnswering", "an extractive question-answering model", "BertForQuestionAnswering",
         "qa_outputs", "qa"),
    Head("ForMultipleChoice", "a multiple-choice model", "BertForMultipleChoice", "classifier", None),
    # ELECTRA's discriminator (ElectraForPreTraining on disk: the family's `head_kinds`); served
    # as an encoder, as no use reads its per-token replaced logits.
    Head("ForReplacedTokenDetection", "a replaced-token detector (ELECTRA's discriminator, no fine-tuned "
         "task head)", "BertForReplacedTokenDetection", "discriminator_predictions", None),
)}


@dataclass(frozen=True)
class Use:
    """One use of the inference engine."""

    name: str  # "classify"
    kind: str  # the head it loads (HEADS); its `weights` must be in the checkpoint
    needs: str  # what a checkpoint must be for this use, for messages
    routes: tuple[str, ...]  # the service routes it adds to embed and tokenize


USES: dict[str, Use] = {u.name: u for u in (
    Use("embed", "Model", "any BERT-family checkpoint", ()),
    Use("fill-mask", "ForMaskedLM", "a masked-LM head (made by `bertkit pretrain`, or a Hugging Face "
        "…ForMaskedLM checkpoint, or a …ForPreTraining one of a family with a sentence head: BERT, ERNIE, "
        "ALBERT; ELECTRA's …ForPreTraining is its discriminator, its generator the …ForMaskedLM)",
        ("fill-mask", "embed_sparse")),  # embed_sparse: SPLADE term weights from the MLM logits
    Use("classify", "ForSequenceClassification", "a sequence-classification head (made by `bertkit "
        "finetune --task classify|pair`)", ("predict",)),
    Use("rerank", "ForSequenceClassification", "a cross-encoder: a sequence-classification head with "
        "one label", ("rerank",)),
    Use("ner", "ForTokenClassification", "a token-classification head (made by `bertkit finetune "
        "--task ner`)", ("ner",)),
    Use("qa", "ForQuestionAnswering", "a question-answering head (made by `bertkit finetune --task qa`)",
        ("qa",)),
)}
# Routes every served model answers, whatever its head: the encoder under any head embeds.
COMMON_ROUTES = ("embed", "tokenize")


@dataclass(frozen=True)
class FinetuneTask:
    """One task of `bertkit finetune`."""

    name: str  # "pair"
    kind: str  # the head it trains (HEADS)
    use: str  # the engine use that runs the result (predict, evaluation)


FINETUNE_TASKS: dict[str, FinetuneTask] = {t.name: t for t in (
    FinetuneTask("classify", "ForSequenceClassification", "classify"),
    FinetuneTask("pair", "ForSequenceClassification", "classify"),
    FinetuneTask("ner", "ForTokenClassification", "ner"),
    FinetuneTask("qa", "ForQuestionAnswering", "qa"),
    FinetuneTask("embed", "Model", "embed"),
    FinetuneTask("rerank", "ForSequenceClassification", "rerank"),
    FinetuneTask("sparse", "ForMaskedLM", "fill-mask"),  # SPLADE (bertkit.train.sparse)
    FinetuneTask("colbert", "Model", "embed"),  # late interaction (bertkit.train.colbert)
)}
# The fine-tune tasks that `bertkit predict` runs over a file: the labelled ones (the retrieval
# models have their own commands: `bertkit embed`, `index`, `rerank`).
PREDICT_TASKS = LABELLED_TASKS


def kind_of(class_name: str) -> str | None:
    """"RobertaForMaskedLM" → "ForMaskedLM", "ElectraForPreTraining" → "ForReplacedTokenDetection";
    None for a class of no family or kind bertkit implements."""
    for family in FAMILIES.values():
        if class_name.startswith(family.class_prefix):
            theirs = class_name[len(family.class_prefix):]
            kind = family.head_kinds.get(theirs, theirs)
            if kind in HEADS:
                return kind
    return None


def architecture_kinds(config: BertConfig) -> list[str]:
    """The known kinds named in config.json's `architectures`, in its order."""
    return [kind for kind in map(kind_of, config.extra.get("architectures") or []) if kind]


def is_cross_encoder(config: BertConfig) -> bool:
    """A classification head with one relevance logit (not a regression): it reranks."""
    return config.num_labels == 1 and config.problem_type != "regression"


def label_names(config: BertConfig) -> list[str]:
    """The names of a classification head's outputs, in logit order (LABEL_i where config.json
    names none, as transformers does)."""
    id2label = config.id2label or {}
    return [id2label.get(i, label_name(i)) for i in range(config.num_labels)]


def use_of(model_dir: str | os.PathLike) -> str:
    """The engine use a directory's head serves: qa, ner, classify, fill-mask or embed.

    From config.json's `architectures` (its first name; a named architecture without a use,
    BertModel or an unknown class, is served as an encoder); without any, from the weights: an
    MLM head where `cls.predictions.*` exist, else the bare encoder.
    """
    config = BertConfig.from_json(Path(model_dir) / "config.json")
    names = config.extra.get("architectures") or []
    if names:
        kind = kind_of(names[0]) or _suffix_kind(names[0])
        use = HEADS[kind].use if kind else None
        return use if use is not None else "embed"
    return "fill-mask" if _has_tensors(Path(model_dir), "cls.predictions") else "embed"


def finetune_task_of(config: BertConfig) -> str | None:
    """The `bertkit finetune --task` whose head config.json's `architectures` names, if any
    (classify for a sequence classifier: pair models are classifiers too)."""
    for kind in architecture_kinds(config):
        for task in PREDICT_TASKS:
            if FINETUNE_TASKS[task].kind == kind:
                return task
    return None


def check_architecture(model_dir: str | os.PathLike, config: BertConfig, wanted: str, fix: str) -> None:
    """ValueError when config.json's `architectures` names a known kind other than `wanted`.

    wanted: a kind of `HEADS` ("ForTokenClassification"). A head the checkpoint lacks would be
    initialised at random and answer nonsense; a directory whose config names no architecture
    (or an unknown one) is let through. fix: what the user should do instead, ending the message.
    """
    kinds = architecture_kinds(config)
    if not kinds or wanted in kinds:
        return
    named = next(n for n in config.extra["architectures"] if kind_of(n) == kinds[0])
    raise ValueError(f"{model_dir} is {HEADS[kinds[0]].description} ({named} in config.json), not "
                     f"{HEADS[wanted].description}; {fix}")


def check_labels(model_dir: str | os.PathLike, config: BertConfig, task: str) -> None:
    """ValueError when a directory's labels cannot serve a fine-tuned `task`: a classifier needs
    id2label (unless it is a regression or one-score head), a tagger BIO / BIOES tags."""
    fix = f"fine-tune it first with `bertkit finetune --task {task}`"
    if task in ("classify", "pair"):
        regression = config.problem_type == "regression" or config.num_labels == 1
        if not regression and config.id2label is None:
            raise ValueError(f"{model_dir} has no labels (no id2label in config.json): it is not a "
                             f"fine-tuned classifier; {fix}")
    elif task == "ner":
        if config.id2label is None:
            raise ValueError(f"{model_dir} has no tags (no id2label in config.json): it is not a "
                             f"fine-tuned tagger; {fix}")
        names = label_names(config)
        not_tags = [n for n in names if n != "O" and n[:2] not in ("B-", "I-", "E-", "S-")]
        if not_tags:
            raise ValueError(f"{model_dir}'s labels ({', '.join(map(repr, not_tags[:5]))}) are not BIO / "
                             "BIOES tags: it is a sequence classifier, not a tagger; pass --task "
                             "classify, or a model fine-tuned with `bertkit finetune --task ner`")


def check_head(model_dir: str | os.PathLike, config: BertConfig, task: str) -> None:
    """A fine-tuned directory can run `task` (its head's kind and its labels), or a ValueError
    saying which task it suits instead."""
    suited = finetune_task_of(config)
    check_architecture(model_dir, config, FINETUNE_TASKS[task].kind,
                       (f"pass --task {suited}, or " if suited else "")
                       + f"fine-tune it first with `bertkit finetune --task {task}`")
    check_labels(model_dir, config, task)


def _suffix_kind(class_name: str) -> str | None:
    """The kind a class name ends with, of any family (checkpoints of families bertkit does not
    implement are refused later, when their config is read)."""
    for kind in sorted(HEADS, key=len, reverse=True):
        if kind != "Model" and class_name.endswith(kind):
            return kind
    return None


def _has_tensors(model_dir: Path, prefix: str) -> bool:
    weights = model_dir / "model.safetensors"
    if not weights.is_file():
        return False
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(weights), "pt") as f:
            return any(k.startswith(prefix) for k in f.keys())
    except (SafetensorError, OSError, ValueError):  # damaged weights: Engine.load reports them
        return False
