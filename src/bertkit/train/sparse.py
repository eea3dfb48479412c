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

The MLM head projects real tokens only (padding rows never reach the vocabulary). Resumable:
a training state is written every `save_every` steps (`train.state`), and `resume=True`
continues it with the same batches and negatives (each epoch's order and draws come from the
seed and the epoch number). OUT_DIR is a masked-LM directory and a sentence-transformers
`SparseEncoder` directory (modules.json: MLMTransformer + SpladePooling): `SparseEncoder(OUT_DIR)`
gives the weights `bertkit embed OUT_DIR --sparse` gives.

Under torchrun (`train.parallel`) each rank encodes its slice of every batch and the SPLADE
vectors of all ranks are gathered with their gradients, so the in-batch negatives and the FLOPS
means are the global batch's, as in one process.
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
from functools import partial
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bertkit.constants import FINETUNE_CONFIG
from bertkit.train import health, parallel
from bertkit.train import state as train_state
from bertkit.train.card import drop_stale, finetune_card
from bertkit.train.optim import default_lr
from bertkit.train.retrieval.common import BUILTIN_PREFIX, Pair, evaluation_set, optimizer_step, read_pairs
from bertkit.train.retrieval.common import config_from_options as common_config_from_options
from bertkit.util import distributed
from bertkit.util.distributed import DistInfo
from bertkit.util.fileio import atomic_write_json, atomic_write_text, model_directory

log = logging.getLogger(__name__)

OUTPUTS = ("config.json", "model.safetensors", FINETUNE_CONFIG, "eval.json", "steps.jsonl", "modules.json",
           train_state.CHECKPOINTS)
# Settings a resumed run may change: they do not alter the sequence of updates.
RESUMABLE_CHANGES = {"resume", "overwrite", "progress", "device", "save_every", "eval"}
# Options of `bertkit finetune` that only --task sparse takes.
SPARSE_OPTIONS = ("flops_query_weight", "flops_doc_weight", "flops_warmup_ratio")


@dataclass
class SparseTrainConfig:
    """Every setting of a sparse run; written to OUT_DIR/finetune_config.json."""

    model: str  # a directory with a masked-LM head (any family bertkit loads)
    train: str  # JSONL {query, positive, negatives?} / TSV, or builtin:NAME[:SPLIT]
    out_dir: str
    task: str = "sparse"
    eval: str | None = None  # MRR@10 / nDCG@10 at the end (default: a builtin's dev split)
    epochs: int = 1
    batch_size: int = 16  # SPLADE v2: 128 on GPUs; in-batch negatives grow with it
    # None: by the model's width (`optim.default_lr`): 3e-5 for base, near SPLADE v2's 2e-5;
    # 1e-3 for the demo's tiny model, whose 94 steps at 2e-5 left the loss where it started (75 → 76).
    lr: float | None = None
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    max_grad_norm: float = 1.0
    max_length: int = 128  # pieces per text (SPLADE v2: 256)
    max_train_examples: int | None = None
    seed: int = 42
    flops_query_weight: float = 3e-4  # λ_q (SPLADE v2)
    flops_doc_weight: float = 1e-4  # λ_d (SPLADE v2)
    flops_warmup_ratio: float = 1 / 3  # share of the steps over which λ rises quadratically from 0
    hard_negatives: int = 1  # negatives per row in the batch's candidates: its own, then mined
    mine: str = "bm25"  # bm25 | none: where a row without its own negatives gets one
    mine_depth: int = 30  # mined negatives are drawn from this many top BM25 passages
    device: str = "cpu"
    progress: bool = True
    overwrite: bool = False
    resume: bool = False
    save_every: int = 200

    def __post_init__(self) -> None:
        for name in ("model", "train", "out_dir", "eval"):
            if getattr(self, name) is not None:
                setattr(self, name, str(getattr(self, name)))
        problems = []
        for name in ("epochs", "batch_size", "max_length", "mine_depth", "save_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.append(f"{name} must be a positive integer, got {value!r}")
        if self.batch_size < 2:
            problems.append("sparse needs batch_size ≥ 2: the other rows of a batch are the negatives")
        if not isinstance(self.hard_negatives, int) or self.hard_negatives < 0:
            problems.append(f"hard_negatives must be an integer ≥ 0, got {self.hard_negatives!r}")
        for name in ("flops_query_weight", "flops_doc_weight"):
            if not getattr(self, name) >= 0:
                problems.append(f"{name} must be ≥ 0, got {getattr(self, name)!r}")
        if not 0 <= self.flops_warmup_ratio <= 1:
            problems.append(f"flops_warmup_ratio must be in [0, 1], got {self.flops_warmup_ratio!r}")
        if self.mine not in ("bm25", "none"):
            problems.append(f"sparse mines with bm25 or none, got {self.mine!r}")
        if self.lr is not None and not self.lr > 0:
            problems.append(f"lr must be > 0, got {self.lr!r}")
        if self.resume and self.overwrite:
            problems.append("resume and overwrite exclude each other; pass one")
        if problems:
            raise ValueError("invalid sparse training settings: " + "; ".join(problems))


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
    from tqdm.auto import tqdm

    from bertkit.data.tokenizer import BertTokenizer
    from bertkit.encoder import tasks
    from bertkit.encoder.heads import use_class
    from bertkit.train import optim

    started = time.time()
    out = train_state.check_run_outputs(config.out_dir, OUTPUTS, overwrite=config.overwrite, resume=config.resume)
    directory = model_directory(config.model, "--model")
    if tasks.use_of(directory) != "fill-mask":
        raise ValueError(f"{directory} has no masked-LM head; --task sparse trains {tasks.USES['fill-mask'].needs}")
    pairs, report = read_pairs(config.train)
    if config.max_train_examples:
        pairs = pairs[:config.max_train_examples]
    if len(pairs) < 2:
        raise ValueError(f"{config.train}: {len(pairs)} training pair; in-batch negatives need at least 2")
    if config.eval is None and config.train.startswith(BUILTIN_PREFIX):
        config.eval = BUILTIN_PREFIX + config.train[len(BUILTIN_PREFIX):].split(":")[0] + ":dev"
    from bertkit.encoder.config import BertConfig

    info = distributed.init_distributed(config.device)
    parallel.check_batch_size(config.batch_size, info)
    config.lr = config.lr or default_lr(BertConfig.from_json(directory).hidden_size)
    resume_from = None
    if config.resume:
        resume_from = train_state.resume_checkpoint(out, dataclasses.asdict(config), out / FINETUNE_CONFIG,
                                                    RESUMABLE_CHANGES)
    distributed.barrier(info)  # every rank has read OUT before rank 0 changes it
    if config.overwrite and info.is_main:
        for name in OUTPUTS:
            path = out / name
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    tokenizer = BertTokenizer.from_pretrained(directory)
    device = info.device
    torch.manual_seed(config.seed)
    model = use_class("fill-mask").from_pretrained(directory).to(device)
    mined = mine_negatives(pairs, config)
    steps_per_epoch = math.ceil(len(pairs) / config.batch_size)
    total = steps_per_epoch * config.epochs
    optimizer = optim.build_optimizer(model, config.lr, weight_decay=config.weight_decay)
    schedule = optim.lr_schedule(optimizer, round(config.warmup_ratio * total), total, "linear")
    if info.is_main:
        out.mkdir(parents=True, exist_ok=True)
    steps: list[dict[str, Any]] = []
    step = 0
    if resume_from is not None:
        saved = train_state.load_trainer_state(resume_from)
        model.load_state_dict(use_class("fill-mask").from_pretrained(resume_from).state_dict())
        optimizer.load_state_dict(saved["optimizer"])
        schedule.load_state_dict(saved["scheduler"])
        parallel.restore_rank_rng(saved, info)
        step, steps = int(saved["step"]), list(saved["steps"])
        log.info("resuming from %s (step %d of %d)", resume_from, step, total)
    else:
        parallel.seed_dropout(config.seed, info)
        if info.is_main:
            drop_stale(out)  # an earlier run's card would describe that run until this one ends
            atomic_write_json(out / FINETUNE_CONFIG, dataclasses.asdict(config))
    engine = parallel.data_parallel(model, info)
    model.train()
    for epoch in range(1, config.epochs + 1):
        rng = random.Random(f"{config.seed}:{epoch}")  # the epoch's order and draws, the same on resume
        order = list(range(len(pairs)))
        rng.shuffle(order)
        negatives = [_negatives(p, m, config.hard_negatives, rng) for p, m in zip(pairs, mined)]
        batches = [order[i:i + config.batch_size] for i in range(0, len(order), config.batch_size)]
        done = max(0, step - (epoch - 1) * steps_per_epoch)
        for batch in tqdm(batches[done:], desc=f"epoch {epoch}/{config.epochs}",
                          disable=not (config.progress and info.is_main)):
            share = flops_weight(step, total, config.flops_warmup_ratio)
            part = parallel.shard(batch, info)
            # The gathered losses are the global batch's, the same on every rank.
            rank, reg_q, reg_d = engine(partial(_losses, tokenizer=tokenizer, rows=[pairs[i] for i in part.rows],
                                                negatives=[negatives[i] for i in part.rows], config=config,
                                                device=device, group=part.group))
            loss = rank + share * (config.flops_query_weight * reg_q + config.flops_doc_weight * reg_d)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"the loss became {float(loss)} at step {step + 1}; lower --lr")
            optimizer_step(parallel.for_backward(parallel.share(loss, part), info), model, optimizer, schedule,
                           config.max_grad_norm, step)
            step += 1
            steps.append({"step": step, "epoch": epoch, "loss": loss.item(), "ranking_loss": rank.item(),
                          "flops_query": reg_q.item(), "flops_doc": reg_d.item(), "flops_share": share,
                          "lr": schedule.get_last_lr()[0]})
            if step % config.save_every == 0 and step < total:
                rngs = parallel.rank_rng_states(info)  # every rank calls: dropout streams are per rank
                if info.is_main:
                    train_state.save_checkpoint(out, step, model, None, {
                        "optimizer": optimizer.state_dict(), "scheduler": schedule.state_dict(),
                        "rng": rngs[0], "rank_rngs": rngs, "step": step, "steps": steps}, keep=1, publish=False)
    model.eval()
    if not info.is_main:  # rank 0 writes the model and scores it
        return {"status": "done", "task": "sparse", "model": config.model, "steps": step}
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    write_sparse_encoder_files(out, config.max_length)
    atomic_write_text(out / "steps.jsonl", "".join(json.dumps(s) + "\n" for s in steps))
    shutil.rmtree(out / train_state.CHECKPOINTS, ignore_errors=True)
    losses = [s["loss"] for s in steps]
    summary: dict[str, Any] = {
        "status": "done", "task": "sparse", "model": config.model, "steps": step,
        "first_loss": losses[0] if losses else None,
        "last_loss": float(np.mean(losses[-max(1, len(losses) // 10):])) if losses else None,
        "train": report.to_dict(), "train_examples": len(pairs)}
    if info.enabled:
        summary["processes"] = info.world_size
    if config.eval:
        summary["eval"] = evaluate_sparse(out, config.eval)
    summary["warnings"] = health.collect(
        health.step_warning(step, examples=len(pairs), batch_size=config.batch_size, epochs=config.epochs),
        health.loss_warning(summary["last_loss"], chance_loss(config)))
    for warning in summary["warnings"]:
        log.warning("warning: %s", warning)
    summary["seconds"] = round(time.time() - started, 2)
    atomic_write_json(out / "eval.json", summary)
    finetune_card(out)
    return summary


def mine_negatives(pairs: Sequence[Pair], config: SparseTrainConfig) -> list[list[str]]:
    """Each pair's BM25 look-alikes among the training passages (not its positive nor its own
    negatives), the top `mine_depth`; [] each with mine="none" or hard_negatives 0."""
    if config.mine == "none" or config.hard_negatives == 0:
        return [[] for _ in pairs]
    from bertkit.retrieval.bm25 import BM25

    pool = sorted({p.positive for p in pairs} | {n for p in pairs for n in p.negatives})
    if len(pool) < 2:
        return [[] for _ in pairs]
    bm25 = BM25.fit(pool)
    depth = min(config.mine_depth, len(pool))
    return [[pool[i] for i in bm25.top_k(p.query, depth) if pool[i] != p.positive and pool[i] not in p.negatives]
            for p in pairs]


def _negatives(pair: Pair, mined: list[str], k: int, rng: random.Random) -> list[str]:
    """Up to k hard negatives: the row's own first (drawn when it has more), then drawn from the
    mined ones (the very top BM25 hits are most often unlabelled positives, so drawn, not taken)."""
    own = list(pair.negatives) if len(pair.negatives) <= k else rng.sample(pair.negatives, k)
    return own + rng.sample(mined, min(k - len(own), len(mined)))


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
