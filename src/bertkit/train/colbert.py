"""Training a ColBERT model (`bertkit finetune --task colbert`): a late-interaction retriever, as
PyLate trains one, saved in PyLate's layout.

The model is the encoder plus a linear projection without bias (PyLate's Dense, hidden → 128 by
default), each token vector scaled to unit length; a query and a document are scored by MaxSim
(`inference.multivector`). Queries and documents are read as `inference.colbert` reads them
([Q] / [D] prefix tokens, [MASK] expansion of queries, the punctuation skiplist of documents),
so training sees what inference computes.

Two losses, PyLate's:
- contrastive (PyLate's `losses.Contrastive`, the default): for B queries the candidates are
  the B positives plus each row's hard negatives (its own, then one mined by BM25 from the
  training passages, drawn afresh each epoch), the logits are MaxSim scores / `temperature`
  (1, PyLate's) and the target of query i is its own positive. PyLate lays a batch out row by
  row (positive, negatives, next row); here the positives come first, then the negatives: the
  same candidates, so the same loss.
- distillation (`distill_from`, a cross-encoder directory; PyLate's `losses.Distillation`): each
  query's own candidates (its positive and hard negatives) are scored by the teacher; the
  student's MaxSim scores of them, min-max normalised per query as PyLate does, are pulled to
  the teacher's by KL(teacher ‖ student) over log-softmaxes, averaged over queries. The teacher
  scores the batch as it is drawn, so a resumed run sees the same targets.

In training, document tokens left out (padding, skiplist) score 0 against every query token
instead of being dropped, as PyLate's `colbert_scores` masks them (inference drops them).

Starting from any BERT-family directory, the prefixes become added tokens of the tokenizer (their
embedding rows start at the mean of the others) and the projection is initialised as
`nn.Linear` is; from a ColBERT directory, its own settings, tokenizer and projection are used.
The run is `train.retrieval.resumable`'s, which every retrieval trainer shares (this module gives
it ColBERT's parts): resumable exactly (a training state every `save_every` steps; each epoch's
order and draws come from the seed and the epoch), one process (the MaxSim loss gathers nothing
across torchrun ranks), no model card. OUT_DIR is a PyLate directory
(modules.json: Transformer + Dense, config_sentence_transformers.json with the query and document
settings): `pylate.models.ColBERT(OUT_DIR)` gives the vectors `Model.encode_query` gives here.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from bertkit.train import health
from bertkit.train.colbert_model import ColbertNet, build_colbert
from bertkit.train.retrieval import resumable
from bertkit.train.retrieval.common import Pair, evaluation_set
from bertkit.train.retrieval.common import config_from_options as common_config_from_options
from bertkit.util.fileio import model_directory

# Options of `bertkit finetune` that only --task colbert takes (--temperature it shares with
# embed's kl loss).
COLBERT_OPTIONS = ("distill_from", "query_length", "embedding_size")


@dataclass
class ColbertTrainConfig(resumable.ResumableTrainConfig):
    """Every setting of a ColBERT run: the shared run's and ColBERT's own; written to
    OUT_DIR/finetune_config.json. model: any BERT-family directory, or a ColBERT one (PyLate's
    layout) to train further."""

    task: str = "colbert"
    # Document pieces, PyLate's document_length (None: a ColBERT directory's own, else PyLate's 180)
    max_length: int | None = None
    query_length: int | None = None  # None: a ColBERT directory's own, else PyLate's 32
    embedding_size: int = 128  # the projection's width, for a model that has none yet (PyLate's default)
    temperature: float = 1.0  # MaxSim / temperature = logit (PyLate's Contrastive default)
    distill_from: str | None = None  # a cross-encoder directory: KL to its scores instead of contrastive

    def __post_init__(self) -> None:
        sizes = [f"{name} must be an integer of at least 3 ([CLS], the prefix, [SEP]), got {value!r}"
                 for name, value in (("max_length", self.max_length), ("query_length", self.query_length))
                 if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 3)]
        more = []
        if self.distill_from is not None and self.hard_negatives < 1:
            more.append("distill_from needs hard_negatives ≥ 1: the teacher ranks each query's positive "
                        "against its negatives")
        if not self.temperature > 0:
            more.append(f"temperature must be > 0, got {self.temperature!r}")
        resumable.check_settings(self, "colbert", paths=("model", "train", "out_dir", "eval", "distill_from"),
                                 positive=("epochs", "batch_size", "mine_depth", "save_every", "embedding_size"),
                                 in_batch=self.distill_from is None, sizes=sizes, more=more)


def config_from_options(options: dict[str, Any]) -> ColbertTrainConfig:
    """A ColbertTrainConfig from `bertkit finetune`'s options (`retrieval.common.config_from_options`)."""
    return common_config_from_options(ColbertTrainConfig, options, "colbert")


# ---------------------------------------------------------------------------------------------
# scores and losses
# ---------------------------------------------------------------------------------------------
def maxsim_matrix(queries: torch.Tensor, query_mask: torch.Tensor | None, documents: torch.Tensor,
                  document_mask: torch.Tensor) -> torch.Tensor:
    """(B, C) MaxSim of every query against every document, differentiable, as PyLate's
    `colbert_scores`: queries (B, Q, D), documents (C, T, D); masks (B, Q) / (C, T) bool, a
    masked document token scoring 0 (not -inf) and a masked query token adding nothing."""
    similarity = torch.einsum("bqd,ctd->bcqt", queries, documents)  # (B, C, Q, T)
    similarity = similarity * document_mask[None, :, None, :]
    best = similarity.max(dim=-1).values  # (B, C, Q)
    if query_mask is not None:
        best = best * query_mask[:, None, :]
    return best.sum(dim=-1)  # (B, C)


def contrastive_loss(scores: torch.Tensor, temperature: float) -> torch.Tensor:
    """scores (B, C), candidate i the positive of query i → mean cross-entropy of scores / temperature."""
    return F.cross_entropy(scores / temperature, torch.arange(len(scores), device=scores.device))


def distillation_loss(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """student, teacher (K,) scores of one query's candidates → KL(teacher ‖ student) of their
    softmaxes, the student's scores min-max normalised first (PyLate's `Distillation`)."""
    student = (student - student.min()) / (student.max() - student.min() + 1e-8)
    return F.kl_div(F.log_softmax(student, dim=-1), F.log_softmax(teacher, dim=-1), reduction="sum",
                    log_target=True)


def chance_loss(config: ColbertTrainConfig, model_config=None) -> float | None:
    """ln(batch × (1 + hard negatives)): a uniform guess among the batch's candidates; None for
    distillation (its loss has no chance level)."""
    if config.distill_from is not None:
        return None
    return health.uniform_guess(config.batch_size * (1 + config.hard_negatives))


# No trivial predictor is scored beside a ColBERT model's search.
baseline = health.no_baseline


# ---------------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------------
def finetune_colbert(**settings: Any) -> dict[str, Any]:
    """`ColbertTrainConfig(**settings)` trained; returns eval.json's content."""
    return run(ColbertTrainConfig(**settings))


def run(config: ColbertTrainConfig) -> dict[str, Any]:
    """Train as `config` says (`train.retrieval.resumable`, with ColBERT's parts); returns eval.json's content."""
    return resumable.run(config, PARTS)


def _step_loss(engine, teacher, step: resumable.Step, config: ColbertTrainConfig,
               device) -> tuple[torch.Tensor, dict[str, Any]]:
    """One batch's `batch_loss`; the step's record holds nothing more."""
    rows, negatives = [pair for pair, _ in step.rows], [own for _, own in step.rows]
    return engine(partial(batch_loss, rows=rows, negatives=negatives, config=config, teacher=teacher)), {}


def _save(model: ColbertNet, teacher, out: Path, config: ColbertTrainConfig) -> None:
    model.save_pretrained(out)  # PyLate's layout, the tokenizer with its prefixes included


def batch_loss(model: ColbertNet, rows: list[Pair], negatives: list[list[str]], config: ColbertTrainConfig,
               teacher) -> torch.Tensor:
    """One batch's loss: contrastive over every candidate of the batch, or (with a teacher) the
    mean distillation loss over each query's own candidates."""
    queries, query_mask = model.queries([r.query for r in rows])  # (B, Q, D)
    if teacher is None:
        documents, document_mask = model.documents([r.positive for r in rows] + [n for ns in negatives for n in ns])
        return contrastive_loss(maxsim_matrix(queries, query_mask, documents, document_mask), config.temperature)
    from bertkit.inference.classify import logits

    losses = []
    for i, (row, own) in enumerate(zip(rows, negatives)):
        candidates = [row.positive, *own]
        documents, document_mask = model.documents(candidates)  # (K, T, D)
        student = maxsim_matrix(queries[i:i + 1], None if query_mask is None else query_mask[i:i + 1],
                                documents, document_mask)[0]  # (K,)
        target = logits(teacher, [row.query] * len(candidates), candidates)[:, 0].to(student.device)  # (K,)
        losses.append(distillation_loss(student, target))
    return torch.stack(losses).mean()


def _teacher(directory: Path, config: ColbertTrainConfig):
    """The cross-encoder whose scores a distillation run learns (`distill_from`), on the engine
    (fp32, CPU); None for a contrastive run. `directory`, the model's, needs no check: any
    BERT-family encoder becomes a ColBERT."""
    if config.distill_from is None:
        return None
    from bertkit.encoder import tasks
    from bertkit.encoder.config import BertConfig
    from bertkit.inference.engine import Engine

    path = model_directory(config.distill_from, "--distill-from")
    if not tasks.is_cross_encoder(BertConfig.from_json(path)) or tasks.use_of(path) != "classify":
        raise ValueError(f"--distill-from {config.distill_from} is not a cross-encoder; it needs "
                         f"{tasks.USES['rerank'].needs} (made by `bertkit finetune --task rerank`)")
    return Engine.load(path, use="rerank")


# ---------------------------------------------------------------------------------------------
# evaluation
# ---------------------------------------------------------------------------------------------
def evaluate_colbert(model_dir: str | Path, spec: str) -> dict[str, Any]:
    """MRR@10 / Recall@k / nDCG@10 of a ColBERT model on `spec`'s queries, each scored by MaxSim
    against the whole corpus (a builtin set's, else every passage of the file)."""
    from bertkit.inference.colbert import Colbert
    from bertkit.inference.multivector import maxsim_scores
    from bertkit.retrieval.metrics import evaluate_run

    pairs, corpus, qrels = evaluation_set(spec)
    colbert = Colbert.load(model_dir)
    documents = colbert.encode_document(corpus)
    queries = colbert.encode_query([p.query for p in pairs])
    run_ = {}
    for i, query in enumerate(queries):
        scores = maxsim_scores(query, documents).numpy()
        run_[str(i)] = [str(j) for j in sorted(np.argsort(-scores)[:100].tolist(), key=lambda j: (-scores[j], j))]
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in evaluate_run(run_, qrels).items()}


PARTS = resumable.Parts(
    "colbert", load=_teacher, build=build_colbert, epochs=resumable.pair_epochs, loss=_step_loss, save=_save,
    evaluate=lambda out, spec, config: evaluate_colbert(out, spec), chance_loss=chance_loss,
    in_batch=lambda config: config.distill_from is None,
    describe=lambda config: {"loss": "contrastive" if config.distill_from is None else "distillation"},
    # One process wherever it starts: the MaxSim loss gathers no rows from other ranks.
    torchrun=False, card=False)
