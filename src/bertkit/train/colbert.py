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
Resumable as SPLADE's runs are (`train.state`: a training state every `save_every` steps; each
epoch's order and draws come from the seed and the epoch). OUT_DIR is a PyLate directory
(modules.json: Transformer + Dense, config_sentence_transformers.json with the query and document
settings): `pylate.models.ColBERT(OUT_DIR)` gives the vectors `Model.encode_query` gives here.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from bertkit.constants import FINETUNE_CONFIG
from bertkit.train import health
from bertkit.train import state as train_state
from bertkit.train.colbert_model import ColbertNet, build_colbert
from bertkit.train.optim import default_lr
from bertkit.train.retrieval.common import BUILTIN_PREFIX, Pair, evaluation_set, optimizer_step, read_pairs
from bertkit.train.retrieval.common import config_from_options as common_config_from_options
from bertkit.train.sparse import mine_negatives
from bertkit.util.fileio import atomic_write_json, atomic_write_text, model_directory

log = logging.getLogger(__name__)

OUTPUTS = ("config.json", "model.safetensors", FINETUNE_CONFIG, "eval.json", "steps.jsonl", "modules.json",
           train_state.CHECKPOINTS)
# Settings a resumed run may change: they do not alter the sequence of updates.
RESUMABLE_CHANGES = {"resume", "overwrite", "progress", "device", "save_every", "eval"}
# Options of `bertkit finetune` that only --task colbert takes (--temperature it shares with
# embed's kl loss).
COLBERT_OPTIONS = ("distill_from", "query_length", "embedding_size")


@dataclass
class ColbertTrainConfig:
    """Every setting of a ColBERT run; written to OUT_DIR/finetune_config.json."""

    model: str  # any BERT-family directory, or a ColBERT one (PyLate's layout) to train further
    train: str  # JSONL {query, positive, negatives?} / TSV, or builtin:NAME[:SPLIT]
    out_dir: str
    task: str = "colbert"
    eval: str | None = None  # MRR@10 / nDCG@10 at the end (default: a builtin's dev split)
    epochs: int = 1
    batch_size: int = 16  # in-batch negatives grow with it
    lr: float | None = None  # None: by the model's width (`optim.default_lr`)
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    max_grad_norm: float = 1.0
    # Document pieces, PyLate's document_length (None: a ColBERT directory's own, else PyLate's 180)
    max_length: int | None = None
    query_length: int | None = None  # None: a ColBERT directory's own, else PyLate's 32
    embedding_size: int = 128  # the projection's width, for a model that has none yet (PyLate's default)
    temperature: float = 1.0  # MaxSim / temperature = logit (PyLate's Contrastive default)
    max_train_examples: int | None = None
    seed: int = 42
    hard_negatives: int = 1  # negatives per row among the candidates: its own, then mined
    mine: str = "bm25"  # bm25 | none: where a row without its own negatives gets one
    mine_depth: int = 30  # mined negatives are drawn from this many top BM25 passages
    distill_from: str | None = None  # a cross-encoder directory: KL to its scores instead of contrastive
    device: str = "cpu"
    progress: bool = True
    overwrite: bool = False
    resume: bool = False
    save_every: int = 200

    def __post_init__(self) -> None:
        for name in ("model", "train", "out_dir", "eval", "distill_from"):
            if getattr(self, name) is not None:
                setattr(self, name, str(getattr(self, name)))
        problems = []
        for name in ("epochs", "batch_size", "mine_depth", "save_every", "embedding_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.append(f"{name} must be a positive integer, got {value!r}")
        for name in ("max_length", "query_length"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 3):
                problems.append(f"{name} must be an integer of at least 3 ([CLS], the prefix, [SEP]), got {value!r}")
        if self.batch_size < 2 and self.distill_from is None:
            problems.append("colbert needs batch_size ≥ 2: the other rows of a batch are the negatives")
        if not isinstance(self.hard_negatives, int) or self.hard_negatives < 0:
            problems.append(f"hard_negatives must be an integer ≥ 0, got {self.hard_negatives!r}")
        if self.distill_from is not None and self.hard_negatives < 1:
            problems.append("distill_from needs hard_negatives ≥ 1: the teacher ranks each query's positive "
                            "against its negatives")
        if not self.temperature > 0:
            problems.append(f"temperature must be > 0, got {self.temperature!r}")
        if self.mine not in ("bm25", "none"):
            problems.append(f"colbert mines with bm25 or none, got {self.mine!r}")
        if self.lr is not None and not self.lr > 0:
            problems.append(f"lr must be > 0, got {self.lr!r}")
        if self.resume and self.overwrite:
            problems.append("resume and overwrite exclude each other; pass one")
        if problems:
            raise ValueError("invalid colbert training settings: " + "; ".join(problems))


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
    from tqdm.auto import tqdm

    from bertkit.encoder.config import BertConfig
    from bertkit.train import optim

    started = time.time()
    out = train_state.check_run_outputs(config.out_dir, OUTPUTS, overwrite=config.overwrite, resume=config.resume)
    directory = model_directory(config.model, "--model")
    teacher = _teacher(config.distill_from) if config.distill_from else None
    pairs, report = read_pairs(config.train)
    if config.max_train_examples:
        pairs = pairs[:config.max_train_examples]
    if len(pairs) < 2 and teacher is None:
        raise ValueError(f"{config.train}: {len(pairs)} training pair; in-batch negatives need at least 2")
    if config.eval is None and config.train.startswith(BUILTIN_PREFIX):
        config.eval = BUILTIN_PREFIX + config.train[len(BUILTIN_PREFIX):].split(":")[0] + ":dev"
    config.lr = config.lr or default_lr(BertConfig.from_json(directory).hidden_size)
    resume_from = None
    if config.resume:
        resume_from = train_state.resume_checkpoint(out, dataclasses.asdict(config), out / FINETUNE_CONFIG,
                                                    RESUMABLE_CHANGES)
    elif config.overwrite:
        for name in OUTPUTS:
            path = out / name
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    device = torch.device(config.device)
    torch.manual_seed(config.seed)
    model = build_colbert(directory, config).to(device)
    mined = mine_negatives(pairs, config)
    steps_per_epoch = math.ceil(len(pairs) / config.batch_size)
    total = steps_per_epoch * config.epochs
    optimizer = optim.build_optimizer(model, config.lr, weight_decay=config.weight_decay)
    schedule = optim.lr_schedule(optimizer, round(config.warmup_ratio * total), total, "linear")
    out.mkdir(parents=True, exist_ok=True)
    steps: list[dict[str, Any]] = []
    step = 0
    if resume_from is not None:
        saved = train_state.load_trainer_state(resume_from)
        model.load_state_dict(build_colbert(resume_from, config).state_dict())
        optimizer.load_state_dict(saved["optimizer"])
        schedule.load_state_dict(saved["scheduler"])
        train_state.restore_rng_state(saved["rng"])
        step, steps = int(saved["step"]), list(saved["steps"])
        log.info("resuming from %s (step %d of %d)", resume_from, step, total)
    else:
        atomic_write_json(out / FINETUNE_CONFIG, dataclasses.asdict(config))
    model.train()
    for epoch in range(1, config.epochs + 1):
        rng = random.Random(f"{config.seed}:{epoch}")  # the epoch's order and draws, the same on resume
        order = list(range(len(pairs)))
        rng.shuffle(order)
        negatives = [_negatives(p, m, config.hard_negatives, rng) for p, m in zip(pairs, mined)]
        batches = [order[i:i + config.batch_size] for i in range(0, len(order), config.batch_size)]
        done = max(0, step - (epoch - 1) * steps_per_epoch)
        for batch in tqdm(batches[done:], desc=f"epoch {epoch}/{config.epochs}", disable=not config.progress):
            rows, row_negatives = [pairs[i] for i in batch], [negatives[i] for i in batch]
            loss = batch_loss(model, rows, row_negatives, config, teacher)
            optimizer_step(loss, model, optimizer, schedule, config.max_grad_norm, step)
            step += 1
            steps.append({"step": step, "epoch": epoch, "loss": loss.item(), "lr": schedule.get_last_lr()[0]})
            if step % config.save_every == 0 and step < total:
                train_state.save_checkpoint(out, step, model, None, {
                    "optimizer": optimizer.state_dict(), "scheduler": schedule.state_dict(),
                    "rng": train_state.capture_rng_state(), "step": step, "steps": steps}, keep=1, publish=False)
    model.eval()
    model.save_pretrained(out)
    atomic_write_text(out / "steps.jsonl", "".join(json.dumps(s) + "\n" for s in steps))
    shutil.rmtree(out / train_state.CHECKPOINTS, ignore_errors=True)
    losses = [s["loss"] for s in steps]
    summary: dict[str, Any] = {
        "status": "done", "task": "colbert", "model": config.model, "steps": step,
        "loss": "distillation" if teacher is not None else "contrastive",
        "first_loss": losses[0] if losses else None,
        "last_loss": float(np.mean(losses[-max(1, len(losses) // 10):])) if losses else None,
        "train": report.to_dict(), "train_examples": len(pairs)}
    if config.eval:
        summary["eval"] = evaluate_colbert(out, config.eval)
    summary["warnings"] = health.collect(
        health.step_warning(step, examples=len(pairs), batch_size=config.batch_size, epochs=config.epochs),
        health.loss_warning(summary["last_loss"], chance_loss(config)))
    for warning in summary["warnings"]:
        log.warning("warning: %s", warning)
    summary["seconds"] = round(time.time() - started, 2)
    atomic_write_json(out / "eval.json", summary)
    return summary


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


def _teacher(directory: str):
    """The cross-encoder whose scores a distillation run learns, on the engine (fp32, CPU)."""
    from bertkit.encoder import tasks
    from bertkit.encoder.config import BertConfig
    from bertkit.inference.engine import Engine

    path = model_directory(directory, "--distill-from")
    if not tasks.is_cross_encoder(BertConfig.from_json(path)) or tasks.use_of(path) != "classify":
        raise ValueError(f"--distill-from {directory} is not a cross-encoder; it needs "
                         f"{tasks.USES['rerank'].needs} (made by `bertkit finetune --task rerank`)")
    return Engine.load(path, use="rerank")


def _negatives(pair: Pair, mined: list[str], k: int, rng: random.Random) -> list[str]:
    """Up to k hard negatives: the row's own first (drawn when it has more), then drawn from the
    mined ones (the very top BM25 hits are most often unlabelled positives, so drawn, not taken)."""
    own = list(pair.negatives) if len(pair.negatives) <= k else rng.sample(pair.negatives, k)
    return own + rng.sample(mined, min(k - len(own), len(mined)))


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

