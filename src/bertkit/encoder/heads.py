"""Task heads for fine-tuning: a small layer on the pre-trained encoder, trained end to end.

Each head owns its loss, computed as the reference computes it (labels of -100 are ignored), and
returns one dataclass. Tensor names on disk match Hugging Face's `BertFor…` classes (`classifier`,
`qa_outputs`), so a fine-tuned directory loads there with identical predictions.

Every family (`config.model_type`) uses these classes; the sequence classifier is the one head
whose layers differ, each as its family's `…ForSequenceClassification` (same tensor names; the
family record's `sequence_classifier` says which):
  bert, albert: pooler (tanh dense on [CLS]) → dropout → classifier
  roberta:      [CLS] state → dropout → classifier.dense → tanh → dropout → classifier.out_proj
  electra:      the same with GELU in tanh's place
  distilbert:   [CLS] state → pre_classifier → ReLU → dropout → classifier
ELECTRA's discriminator (`BertForReplacedTokenDetection`, transformers' ElectraForPreTraining)
scores each token as replaced or original: dense → hidden_act → dense_prediction (one logit).
DistilBERT's QA head has a dropout before qa_outputs (`qa_dropout`); the others have none.
ModernBERT puts its prediction head (`modern.PredictionHead`: dense → act → LayerNorm) and a
dropout before every classifier, and its sequence classifier reads the first token or the mean of
all tokens (`classifier_pooling`):
  modernbert:   [CLS] state or mean → head → dropout → classifier
  deberta-v2:   [CLS] state → context pooler (dropout at pooler_dropout → dense → pooler_hidden_act)
                → dropout (cls_dropout, else hidden_dropout_prob) → classifier

Shape letters: B batch, C choices, T sequence length, H hidden size, K labels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bertkit.constants import IGNORE_INDEX
from bertkit.encoder import disentangled, modern, ops, tasks
from bertkit.encoder.checkpoint import PretrainedMixin
from bertkit.encoder.config import BertConfig
from bertkit.encoder.model import BertForMaskedLM, BertForPreTraining, BertModel
from bertkit.encoder.packing import Packed, mean_pool


@dataclass
class ClassifierOutput:
    loss: torch.Tensor | None  # ()
    logits: torch.Tensor  # (B, K) sequence / multiple choice (K = C), or (B, T, K) per token


@dataclass
class SpanOutput:
    loss: torch.Tensor | None  # () mean of the start and end cross-entropies
    start_logits: torch.Tensor  # (B, T)
    end_logits: torch.Tensor  # (B, T)


def _classifier_dropout(config: BertConfig) -> nn.Dropout:
    rate = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
    return nn.Dropout(rate)


class DenseClassificationHead(nn.Module):
    """RoBERTa's and ELECTRA's sentence head: the [CLS] state → dropout → dense → activation (tanh,
    or ELECTRA's GELU) → dropout → out_proj."""

    def __init__(self, config: BertConfig, activation: str):
        super().__init__()
        self.activation = activation  # "tanh" | "gelu"
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = torch.tanh if activation == "tanh" else ops.activation(activation)
        self.dropout = _classifier_dropout(config)
        self.out_proj = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, first: torch.Tensor) -> torch.Tensor:
        """first: (B, H) hidden state of each sequence's first token → logits (B, K)."""
        x = self.act(self.dense(self.dropout(first)))  # (B, H)
        return self.out_proj(self.dropout(x))  # (B, K)


class ContextPooler(nn.Module):
    """DeBERTa's pooler, at the head (`pooler.dense` on disk): the [CLS] state → dropout → dense → activation."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dropout = nn.Dropout(config.pooler_dropout)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = disentangled.activation(config.pooler_hidden_act)

    def forward(self, first: torch.Tensor) -> torch.Tensor:
        """first: (B, H) → (B, H)."""
        return self.act(self.dense(self.dropout(first)))


# The sentence heads of DenseClassificationHead, by the record's `sequence_classifier`.
_DENSE_HEADS = {"dense_tanh": "tanh", "dense_gelu": "gelu"}


def _problem_type(config: BertConfig, labels: torch.Tensor) -> str:
    """The reference's rule: one label → regression; integer labels → single-label; else multi-label."""
    if config.problem_type is not None:
        return config.problem_type
    if config.num_labels == 1:
        return "regression"
    if labels.dtype in (torch.long, torch.int):
        return "single_label_classification"
    return "multi_label_classification"


class BertForSequenceClassification(PretrainedMixin, nn.Module):
    """Pooled [CLS] → dropout → linear: single sentences and sentence pairs; regression when K = 1.

    RoBERTa and DistilBERT read the [CLS] state through their own layers (module docstring).
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        reads = config.family.sequence_classifier  # what the classifier reads [CLS] through
        self.bert = BertModel(config, add_pooling_layer=reads == "pooler")
        self.dropout = _classifier_dropout(config)
        self.pre_classifier = (nn.Linear(config.hidden_size, config.hidden_size) if reads == "pre_classifier"
                               else None)
        self.head = modern.PredictionHead(config) if reads == "prediction_head" else None
        self.context_pooler = ContextPooler(config) if reads == "context_pooler" else None
        if reads in _DENSE_HEADS:
            self.classifier = DenseClassificationHead(config, _DENSE_HEADS[reads])
        else:
            self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        for module in (self.classifier, self.pre_classifier, self.head, self.context_pooler):
            if module is not None:
                module.apply(self.bert._init_weights)

    @property
    def mean_pooling(self) -> bool:
        """ModernBERT's classifier_pooling "mean": the head reads the mean of every token's state."""
        return self.config.is_modernbert and self.config.classifier_pooling == "mean"

    def sentence_logits(self, first: torch.Tensor, pooled: torch.Tensor | None) -> torch.Tensor:
        """first: (B, H) state of each sequence's first token; pooled: (B, H) pooler output or None
        → logits (B, K), through the family's head."""
        if isinstance(self.classifier, DenseClassificationHead):  # RoBERTa, ELECTRA
            return self.classifier(first)
        if self.head is not None:  # ModernBERT
            return self.classifier(self.dropout(self.head(first)))
        if self.context_pooler is not None:  # DeBERTa
            return self.classifier(self.dropout(self.context_pooler(first)))
        if self.pre_classifier is not None:  # DistilBERT
            return self.classifier(self.dropout(F.relu(self.pre_classifier(first))))
        return self.classifier(self.dropout(pooled))

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> ClassifierOutput:
        """labels: (B,) long class ids; (B,) float targets for regression; (B, K) float multi-label."""
        out = self.bert(input_ids, token_type_ids, attention_mask, first_only=not self.mean_pooling)
        if self.mean_pooling:
            mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask  # (B, T)
            first = mean_pool(out.last_hidden_state, mask)  # (B, H)
        else:
            first = out.last_hidden_state[:, 0]  # the head reads [CLS] only
        logits = self.sentence_logits(first, out.pooler_output)  # (B, K)
        loss = None
        if labels is not None:
            kind = _problem_type(self.config, labels)
            if kind == "regression":
                loss = F.mse_loss(logits.squeeze(-1).float(), labels.float().view(-1))
            elif kind == "single_label_classification":
                loss = F.cross_entropy(logits.float(), labels.view(-1), ignore_index=IGNORE_INDEX)
            else:
                loss = F.binary_cross_entropy_with_logits(logits.float(), labels.float())
        return ClassifierOutput(loss=loss, logits=logits)

    def forward_packed(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                       packed: Packed) -> ClassifierOutput:
        """Inference over packed sequences (see `BertModel.forward_packed`): logits (B, K)."""
        out = self.bert.forward_packed(input_ids, token_type_ids, packed, first_only=not self.mean_pooling)
        first = out.hidden  # (B, H), or (N, H) to average
        if self.mean_pooling:
            first = mean_pool(first, packed)  # (B, H)
        logits = self.sentence_logits(first, out.pooler_output)  # (B, K)
        return ClassifierOutput(loss=None, logits=logits)


class BertForTokenClassification(PretrainedMixin, nn.Module):
    """Every token's hidden state → dropout → linear: NER and other tagging."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=False)
        # DistilBERT's tagger drops out at its general `dropout`, not seq_classif_dropout; DeBERTa's
        # at hidden_dropout_prob, not cls_dropout.
        self.dropout = (nn.Dropout(config.hidden_dropout_prob) if config.model_type in ("distilbert", "deberta-v2")
                        else _classifier_dropout(config))
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.head = modern.PredictionHead(config) if config.is_modernbert else nn.Identity()
        for module in (self.classifier, self.head):
            module.apply(self.bert._init_weights)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> ClassifierOutput:
        """labels: (B, T) long tag ids, -100 on sub-word continuations, special tokens and padding."""
        hidden = self.bert(input_ids, token_type_ids, attention_mask).last_hidden_state  # (B, T, H)
        logits = self.classifier(self.dropout(self.head(hidden)))  # (B, T, K)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)
        return ClassifierOutput(loss=loss, logits=logits)

    def forward_packed(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                       packed: Packed) -> ClassifierOutput:
        """Inference over packed sequences: logits (N, K), one row per token in packed order."""
        hidden = self.bert.forward_packed(input_ids, token_type_ids, packed).hidden  # (N, H)
        return ClassifierOutput(loss=None, logits=self.classifier(self.dropout(self.head(hidden))))


class BertForQuestionAnswering(PretrainedMixin, nn.Module):
    """Every token's hidden state → linear → (start, end) logits: extractive QA."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=False)
        # DistilBERT's QA head drops out its input (qa_dropout); BERT's does not.
        rate = float(config.extra.get("qa_dropout", 0.1)) if config.model_type == "distilbert" else 0.0
        if config.is_modernbert:  # ModernBERT: head → dropout → classifier (qa_outputs here)
            rate = config.classifier_dropout or 0.0
        self.dropout = nn.Dropout(rate)
        self.head = modern.PredictionHead(config) if config.is_modernbert else nn.Identity()
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        for module in (self.qa_outputs, self.head):
            module.apply(self.bert._init_weights)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, start_positions: torch.Tensor | None = None,
                end_positions: torch.Tensor | None = None) -> SpanOutput:
        """start_positions / end_positions: (B,) long token indices; 0 ([CLS]) = no answer in this window."""
        hidden = self.bert(input_ids, token_type_ids, attention_mask).last_hidden_state  # (B, T, H)
        start_logits, end_logits = self.qa_outputs(self.dropout(self.head(hidden))).unbind(-1)  # (B, T) each
        loss = None
        if start_positions is not None and end_positions is not None:
            # As the reference: positions outside the sequence are clamped to T and ignored.
            length = start_logits.shape[1]
            start = start_positions.view(-1).clamp(0, length)
            end = end_positions.view(-1).clamp(0, length)
            loss = (F.cross_entropy(start_logits.float(), start, ignore_index=length)
                    + F.cross_entropy(end_logits.float(), end, ignore_index=length)) / 2
        return SpanOutput(loss=loss, start_logits=start_logits, end_logits=end_logits)

    def forward_packed(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                       packed: Packed) -> SpanOutput:
        """Inference over packed sequences: start and end logits (N,) in packed order."""
        hidden = self.bert.forward_packed(input_ids, token_type_ids, packed).hidden  # (N, H)
        start_logits, end_logits = self.qa_outputs(self.dropout(self.head(hidden))).unbind(-1)  # (N,) each
        return SpanOutput(loss=None, start_logits=start_logits, end_logits=end_logits)


class BertForMultipleChoice(PretrainedMixin, nn.Module):
    """Each (context, choice) pair → pooled [CLS] → linear score; softmax over the C choices."""

    def __init__(self, config: BertConfig):
        super().__init__()
        if not config.has_pooler:
            raise ValueError(f"multiple choice reads the pooler, which model_type {config.model_type!r} "
                             "does not have; use a bert, roberta or albert model")
        self.config = config
        self.bert = BertModel(config)
        self.dropout = _classifier_dropout(config)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.classifier.apply(self.bert._init_weights)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> ClassifierOutput:
        """input_ids, token_type_ids, attention_mask: (B, C, T); labels: (B,) index of the right choice."""
        if input_ids.dim() != 3:
            raise ValueError(f"multiple choice takes input_ids of shape (batch, choices, sequence), "
                             f"got {tuple(input_ids.shape)}")
        batch, choices, length = input_ids.shape
        flat = lambda x: None if x is None else x.reshape(batch * choices, length)  # noqa: E731
        pooled = self.bert(flat(input_ids), flat(token_type_ids), flat(attention_mask)).pooler_output  # (B*C, H)
        logits = self.classifier(self.dropout(pooled)).view(batch, choices)  # (B, C)
        loss = F.cross_entropy(logits.float(), labels) if labels is not None else None
        return ClassifierOutput(loss=loss, logits=logits)


class DiscriminatorPredictions(nn.Module):
    """ELECTRA's replaced-token head: dense → hidden_act → dense_prediction, one logit per token."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = ops.activation(config.hidden_act)
        self.dense_prediction = nn.Linear(config.hidden_size, 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: (..., H) → logits (...): > 0 says replaced."""
        return self.dense_prediction(self.act(self.dense(hidden))).squeeze(-1)


class BertForReplacedTokenDetection(PretrainedMixin, nn.Module):
    """ELECTRA's discriminator (Clark et al. 2020): each token's state → one replaced-or-original logit."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=False)
        self.discriminator_predictions = DiscriminatorPredictions(config)
        self.discriminator_predictions.apply(self.bert._init_weights)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None) -> ClassifierOutput:
        """labels: (B, T) 1 = replaced, 0 = original; the loss is the binary cross-entropy over the
        real tokens (attention_mask 1), as transformers computes it. logits: (B, T)."""
        hidden = self.bert(input_ids, token_type_ids, attention_mask).last_hidden_state  # (B, T, H)
        logits = self.discriminator_predictions(hidden)  # (B, T)
        loss = None
        if labels is not None:
            real = torch.ones_like(labels, dtype=torch.bool) if attention_mask is None else attention_mask == 1
            loss = F.binary_cross_entropy_with_logits(logits.float()[real], labels[real].float())
        return ClassifierOutput(loss=loss, logits=logits)

    def forward_packed(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                       packed: Packed) -> ClassifierOutput:
        """Inference over packed sequences: logits (N,), one per token in packed order."""
        hidden = self.bert.forward_packed(input_ids, token_type_ids, packed).hidden  # (N, H)
        return ClassifierOutput(loss=None, logits=self.discriminator_predictions(hidden))


# Every model class by its name, so that a kind of `tasks.HEADS` finds its class.
_CLASSES: dict[str, type[nn.Module]] = {cls.__name__: cls for cls in (
    BertModel, BertForPreTraining, BertForMaskedLM, BertForSequenceClassification,
    BertForTokenClassification, BertForQuestionAnswering, BertForMultipleChoice, BertForReplacedTokenDetection)}


def model_class(kind: str) -> type[nn.Module]:
    """The bertkit class of a head kind ("ForTokenClassification" → BertForTokenClassification),
    for every family (the family is configuration)."""
    if kind not in tasks.HEADS:
        raise ValueError(f"unknown head kind {kind!r}; bertkit implements {', '.join(tasks.HEADS)}")
    return _CLASSES[tasks.HEADS[kind].class_name]


def task_class(task: str) -> type[nn.Module]:
    """The class `bertkit finetune --task TASK` trains (classify and pair: the sequence classifier)."""
    if task not in tasks.FINETUNE_TASKS:
        raise ValueError(f"unknown task {task!r}; choose one of {', '.join(tasks.FINETUNE_TASKS)}")
    return model_class(tasks.FINETUNE_TASKS[task].kind)


def use_class(use: str) -> type[nn.Module]:
    """The class the inference engine loads for `use` (embed: the bare encoder)."""
    if use not in tasks.USES:
        raise ValueError(f"unknown use {use!r}; choose one of {', '.join(tasks.USES)}")
    return model_class(tasks.USES[use].kind)
