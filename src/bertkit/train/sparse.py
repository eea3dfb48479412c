"""Training a SPLADE sparse retriever from any masked-LM checkpoint (`bertkit finetune --task sparse`).

A query and a passage each become w_t = max over positions of log(1 + ReLU(MLM logit_t))
(`inference.sparse`), scored by their dot product. The loss is SPLADE's (Formal et al. 2021,
SPLADE v2, arXiv:2109.10086): a contrastive cross-entropy over in-batch negatives — for B
queries the candidates are the B positives plus each row's hard negatives (its own, then one
mined by BM25 from the training passages, drawn afresh each epoch) — plus the FLOPS
regulariser (Paria et al. 2020) on queries and on documents separately:

    loss = CE(q · dᵀ) + λ_q · Σ_t (mean_i w_q,i,t)² + λ_d · Σ_t (mean_j w_d,j,t)²

Defaults from SPLADE v2's "splade_max" configuration (naver/splade conf/config_splade++_max.yaml
and conf/train/config/splade.yaml): λ_q = 3e-4, λ_d = 1e-4, both λ raised
quadratically from 0 (there over the first 50,000 of 150,000 steps; here over `flops_warmup_ratio`
of the run, a third, as sentence-transformers' SpladeRegularizerWeightSchedulerCallback).
The scores are raw dot products (scale 1), as SPLADE's in-batch pairwise NLL and
sentence-transformers' SparseMultipleNegativesRankingLoss.

The MLM head projects real tokens only (padding rows never reach the vocabulary). The run is
`train.retrieval.resumable`'s, which every retrieval trainer shares (this module gives it SPLADE's
parts: the model, the loss, the files, the scores): resumable exactly, a training state every
`save_every` steps, `resume=True` continuing with the same batches and negatives. OUT_DIR is a
masked-LM directory and a sentence-transformers `SparseEncoder` directory (modules.json:
MLMTransformer + SpladePooling): `SparseEncoder(OUT_DIR)` gives the weights `bertkit embed
OUT_DIR --sparse` gives.

Under torchrun (`train.parallel`) each rank encodes its slice of every batch and the SPLADE
vectors of all ranks are gathered with their gradients, so the in-batch negatives and the FLOPS
means are the global batch's, as in one process.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bertkit.train import health, parallel
from bertkit.train.retrieval import resumable
from bertkit.train.retrieval.common import Pair, evaluation_set
from bertkit.train.retrieval.common import config_from_options as common_config_from_options
from bertkit.util.distributed import DistInfo
from bertkit.util.fileio import atomic_write_json

# Options of `bertkit finetune` that only --task sparse takes.
SPARSE_OPTIONS = ("flops_query_weight", "flops_doc_weight", "flops_warmup_ratio")


@dataclass
class SparseTrainConfig(resumable.ResumableTrainConfig):
    """Every setting of a sparse run: the shared run's and SPLADE's own; written to
    OUT_DIR/finetune_config.json. model: a directory with a masked-LM head (any family bertkit loads)."""

    task: str = "sparse"
    max_length: int = 128  # pieces per text (SPLADE v2: 256)
    flops_query_weight: float = 3e-4  # λ_q (SPLADE v2)
    flops_doc_weight: float = 1e-4  # λ_d (SPLADE v2)
    flops_warmup_ratio: float = 1 / 3  # share of the steps over which λ rises quadratically from 0

    def __post_init__(self) -> None:
        more = [f"{name} must be ≥ 0, got {getattr(self, name)!r}"
                for name in ("flops_query_weight", "flops_doc_weight") if not getattr(self, name) >= 0]
        if not 0 <= self.flops_warmup_ratio <= 1:
            more.append(f"flops_warmup_ratio must be in [0, 1], got {self.flops_warmup_ratio!r}")
        resumable.check_settings(self, "sparse", paths=("model", "train", "out_dir", "eval"),
                                 positive=("epochs", "batch_size", "max_length", "mine_depth", "save_every"),
                                 in_batch=True, more=more)


def config_from_options(options: dict[str, Any]) -> SparseTrainConfig:
    """A SparseTrainConfig from `bertkit finetune`'s options (`retrieval.common.config_from_options`)."""
    return common_config_from_options(SparseTrainConfig, options, "sparse")


# ---------------------------------------------------------------------------------------------
# the model's side: SPLADE weights with gradients, the losses
# ---------------------------------------------------------------------------------------------
def splade_vectors(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """(B, V) SPLADE weights of a padded batch, differentiable; the MLM head runs on real tokens only."""
    mask = batch["attention_mask"].bool()  # (B, T)
    hidden = model.bert(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]).last_hidden_state
    rows = hidden[mask]  # (N, H) real tokens, row-major
    logits = model.mlm(rows, model.bert.embeddings.word_embeddings.weight)  # (N, V)
    weights = torch.log1p(torch.relu(logits))  # (N, V)
    return torch.segment_reduce(weights, "max", lengths=mask.sum(1), axis=0)  # (B, V)


def flops(weights: torch.Tensor) -> torch.Tensor:
    """FLOPS regulariser (Paria et al. 2020): Σ_t (mean over the batch of w_t)², () float."""
    return weights.mean(0).pow(2).sum()


def flops_weight(step: int, total: int, ratio: float) -> float:
    """The share of λ applied at `step` (0-based): (step / warmup)² during the warm-up, then 1."""
    warmup = max(1, int(total * ratio))
    return 1.0 if ratio == 0 or step >= warmup else (step / warmup) ** 2


def chance_loss(config: SparseTrainConfig, model_config=None) -> float | None:
    """ln(batch × (1 + hard negatives)): a uniform guess among the batch's candidates."""
    return health.uniform_guess(config.batch_size * (1 + config.hard_negatives))


# No trivial predictor is scored beside a sparse model's search.
baseline = health.no_baseline


def contrastive_loss(queries: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """queries (B, V), candidates (C, V), candidate i the positive of query i → mean cross-entropy
    of the dot products (in-batch negatives: every other candidate)."""
    logits = queries @ candidates.T  # (B, C)
    return F.cross_entropy(logits, torch.arange(len(queries), device=logits.device))


# ---------------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------------
def finetune_sparse(**settings: Any) -> dict[str, Any]:
    """`SparseTrainConfig(**settings)` trained; returns eval.json's content."""
    return run(SparseTrainConfig(**settings))


def run(config: SparseTrainConfig) -> dict[str, Any]:
    """Train as `config` says (`train.retrieval.resumable`, with SPLADE's parts); returns eval.json's content."""
    return resumable.run(config, PARTS)


def _load(directory: Path, config: SparseTrainConfig):
    """The tokenizer the loss reads texts with, once `directory` is found to have a masked-LM head."""
    from bertkit.data.tokenizer import BertTokenizer
    from bertkit.encoder import tasks

    if tasks.use_of(directory) != "fill-mask":
        raise ValueError(f"{directory} has no masked-LM head; --task sparse trains {tasks.USES['fill-mask'].needs}")
    return BertTokenizer.from_pretrained(directory)


def _build(directory: Path, config: SparseTrainConfig) -> nn.Module:
    from bertkit.encoder.heads import use_class

    return use_class("fill-mask").from_pretrained(directory)


def _step_loss(engine, tokenizer, step: resumable.Step, config: SparseTrainConfig,
               device) -> tuple[torch.Tensor, dict[str, Any]]:
    """SPLADE's loss of one batch: the ranking loss plus the FLOPS terms, λ raised by the step's
    share of the warm-up; the terms go to the step's record."""
    share = flops_weight(step.number, step.total, config.flops_warmup_ratio)
    rows, negatives = [pair for pair, _ in step.rows], [own for _, own in step.rows]
    rank, reg_q, reg_d = engine(partial(_losses, tokenizer=tokenizer, rows=rows, negatives=negatives,
                                        config=config, device=device, group=step.group))
    loss = rank + share * (config.flops_query_weight * reg_q + config.flops_doc_weight * reg_d)
    return loss, {"ranking_loss": rank.item(), "flops_query": reg_q.item(), "flops_doc": reg_d.item(),
                  "flops_share": share}


def _save(model: nn.Module, tokenizer, out: Path, config: SparseTrainConfig) -> None:
    """OUT_DIR: the masked-LM directory and the files that make it a SparseEncoder."""
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    write_sparse_encoder_files(out, config.max_length)


def _losses(model, tokenizer, rows: list[Pair], negatives: list[list[str]], config: SparseTrainConfig, device,
            group: DistInfo | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(contrastive loss, FLOPS of the queries, FLOPS of the documents) of one batch; with
    `group` (torchrun), of the global batch that every rank's rows make."""
    def encode(texts):
        batch = tokenizer(list(texts), max_length=config.max_length)
        return splade_vectors(model, {k: v.to(device) for k, v in batch.items()})

    queries = encode([r.query for r in rows])  # (B, V)
    documents = encode([r.positive for r in rows] + [n for ns in negatives for n in ns])  # (C, V)
    queries, documents = parallel.gather_in_batch(queries, documents, len(rows), group)  # (B_all, V), (C_all, V)
    return contrastive_loss(queries, documents), flops(queries), flops(documents)


def write_sparse_encoder_files(out: Path, max_length: int) -> None:
    """modules.json, 1_SpladePooling/config.json, sentence_bert_config.json and
    config_sentence_transformers.json: what makes a masked-LM directory a sentence-transformers
    SparseEncoder (MLMTransformer + SpladePooling, max pooling of log1p∘ReLU)."""
    atomic_write_json(out / "modules.json", [
        {"idx": 0, "name": "0", "path": "",
         "type": "sentence_transformers.sparse_encoder.modules.mlm_transformer.MLMTransformer"},
        {"idx": 1, "name": "1", "path": "1_SpladePooling",
         "type": "sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling"}])
    (out / "1_SpladePooling").mkdir(exist_ok=True)
    atomic_write_json(out / "1_SpladePooling" / "config.json",
                      {"pooling_strategy": "max", "activation_function": "relu", "embedding_dimension": None})
    atomic_write_json(out / "sentence_bert_config.json", {"max_seq_length": max_length, "do_lower_case": False})
    atomic_write_json(out / "config_sentence_transformers.json", {
        "model_type": "SparseEncoder", "prompts": {"query": "", "document": ""}, "default_prompt_name": None,
        "similarity_fn_name": "dot"})


# ---------------------------------------------------------------------------------------------
# evaluation
# ---------------------------------------------------------------------------------------------
def evaluate_sparse(model_dir: str | Path, spec: str, *, top_k: int | None = None) -> dict[str, Any]:
    """MRR@10 / Recall@k / nDCG@10 of a sparse model on `spec`'s queries, searching the whole
    corpus (a builtin set's, else every passage of the file) by dot product, and the average
    non-zero terms of its queries and documents."""
    from bertkit.inference.sparse import embed_sparse, sparse_engine
    from bertkit.retrieval.metrics import evaluate_run
    from bertkit.retrieval.sparse import SparseIndex, postings

    pairs, corpus, qrels = evaluation_set(spec)
    engine = sparse_engine(model_dir)
    docs = embed_sparse(engine, corpus, top_k=top_k)
    queries = embed_sparse(engine, [p.query for p in pairs])
    side = SparseIndex(Path(model_dir), {"rows": len(corpus), "vocab_size": engine.config.vocab_size},
                       **postings(((ix.tolist(), v.tolist()) for ix, v in docs), engine.config.vocab_size))
    run_ = {}
    for i, q in enumerate(queries):
        s = side.scores([q])[0]
        run_[str(i)] = [str(j) for j in sorted(np.argsort(-s)[:100].tolist(), key=lambda j: (-s[j], j))]
    scores = {k: round(v, 4) if isinstance(v, float) else v for k, v in evaluate_run(run_, qrels).items()}
    scores["query_terms"] = round(float(np.mean([len(ix) for ix, _ in queries])), 1)
    scores["document_terms"] = round(float(np.mean([len(ix) for ix, _ in docs])), 1)
    return scores


PARTS = resumable.Parts("sparse", load=_load, build=_build, epochs=resumable.pair_epochs, loss=_step_loss,
                        save=_save, evaluate=lambda out, spec, config: evaluate_sparse(out, spec),
                        chance_loss=chance_loss)
