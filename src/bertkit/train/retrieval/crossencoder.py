"""The cross-encoder trainer (`finetune --task rerank`): [CLS] query [SEP] passage [SEP] → one
logit (a sequence-classification head with one label), trained on each positive and `negatives`
hard negatives per query.

Negatives: the row's own, then mined by BM25 (`mine="bm25"`, lexical look-alikes, the usual first
stage) or by a bi-encoder (`mine="biencoder"`, `mine_model`) from every passage of the training
file; a row with more negatives than `negatives` (or a mined list) is a pool that each epoch draws
from afresh. Two losses: `loss="bce"`, binary cross-entropy on every (query, passage, 0/1) pair,
batch_size pairs a step; `loss="listwise"`, softmax cross-entropy over one query's positive and its
negatives (Nogueira & Cho's pointwise BCE vs the listwise "localized contrastive" loss of Gao et
al. 2021), batch_size queries a step.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from bertkit.constants import label_name
from bertkit.train import health
from bertkit.train.retrieval.common import Pair, RetrievalTrainConfig, draw_negatives, encode

# The rerank default learning rate: a fresh one-logit head over an encoder that was never
# trained to read a pair has to move far in the few hundred steps a CPU budget allows. Measured
# (MiniLM, 200 BBC train queries x (1 + 3), 25 listwise steps, 50 dev queries' BM25 top 20 at
# MRR@10 0.736): lr 1e-4 leaves the loss at chance (1.39 -> 1.35) and reranks to 0.504; 3e-4
# reaches 0.50 and 0.767. 2e-5 (sentence-transformers' default) is made for thousands of steps.
RERANK_LR = 3e-4
DEFAULT_LR = RERANK_LR
# A query's loss reads its own pairs only: under torchrun each rank's rows stand alone.
GATHERS = False


def build(config: RetrievalTrainConfig) -> nn.Module:
    """A one-label sequence classifier over the directory's encoder; a classifier of another
    label count in the directory (an earlier task's) is dropped and initialised afresh."""
    from bertkit.encoder.checkpoint import load_into, read_state_dict
    from bertkit.encoder.config import BertConfig
    from bertkit.encoder.heads import BertForSequenceClassification

    directory = Path(config.model)
    model_config = BertConfig.from_json(directory).replace(id2label={0: label_name(0)},
                                                           label2id={label_name(0): 0})
    net = BertForSequenceClassification(model_config)
    state = read_state_dict(directory)
    state = {k: v for k, v in state.items() if not k.startswith("classifier.") or v.shape[0] == 1}
    load_into(net, state, str(directory))
    return net


def chance_loss(config: RetrievalTrainConfig, model_config=None) -> float | None:
    """ln 2 per pair (bce), ln(1 + negatives) for the listwise softmax over a query's candidates."""
    return health.uniform_guess(2 if config.loss == "bce" else 1 + config.negatives)


def baseline(scores: dict[str, Any], metric: str, split: str) -> str | None:
    """The warning for a reranker no better than its own first stage's order of the same candidates."""
    first = scores.get("first_stage")
    if not first:
        return None
    return health.baseline_warning("MRR@10", scores.get("mrr@10"), first.get("mrr@10"),
                                   f"the first stage's own order ({first['name']})", split)


def listwise_loss(logits: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """logits (G, 1 + K): column 0 each query's positive, the rest its negatives; mask (G, 1 + K)
    bool, False where a query has fewer negatives → mean cross-entropy of the positive against
    its own list (a softmax over one query's candidates, not the batch's)."""
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    return F.cross_entropy(logits, torch.zeros(len(logits), dtype=torch.long, device=logits.device))


def loss(model, tokenizer, rows: list, config, device) -> torch.Tensor:
    """bce: rows are (query, passage, label); listwise: (query, positive, [negatives])."""
    if config.loss == "bce":
        batch = encode(tokenizer, [r[0] for r in rows], [r[1] for r in rows], config.max_length, device)
        logits = model(**batch).logits[:, 0]  # (B,)
        labels = torch.tensor([r[2] for r in rows], dtype=logits.dtype, device=device)
        return F.binary_cross_entropy_with_logits(logits, labels)
    width = 1 + max(len(r[2]) for r in rows)
    queries = [r[0] for r in rows for _ in range(1 + len(r[2]))]
    passages = [d for r in rows for d in (r[1], *r[2])]
    batch = encode(tokenizer, queries, passages, config.max_length, device)
    flat = model(**batch).logits[:, 0]  # (P,) every pair of the batch, query by query
    mask = torch.zeros(len(rows), width, dtype=torch.bool, device=device)  # (G, 1 + K)
    for g, r in enumerate(rows):
        mask[g, :1 + len(r[2])] = True
    logits = flat.new_zeros(len(rows), width).masked_scatter(mask, flat)  # (G, 1 + K) row-major
    return listwise_loss(logits, mask)


@dataclass
class Group:
    """One training query: its positive, its own negatives and the mined ones to draw from."""
    query: str
    positive: str
    own: list[str]
    mined: list[str]


def rerank_groups(pairs: list[Pair], config: RetrievalTrainConfig) -> list[Group]:
    """Each pair with the top `mine_depth` mined passages that are not its positive."""
    pool = sorted({p.positive for p in pairs} | {n for p in pairs for n in p.negatives})
    mined: list[list[int]] = [[] for _ in pairs]
    wanted = [max(0, config.negatives - len(p.negatives)) for p in pairs]
    if config.mine != "none" and any(wanted) and len(pool) > 1:
        depth = min(config.mine_depth, len(pool))
        if config.mine == "bm25":
            from bertkit.retrieval.bm25 import BM25

            bm25 = BM25.fit(pool)
            mined = [bm25.top_k(p.query, depth) if w else [] for p, w in zip(pairs, wanted)]
        else:
            from bertkit.inference import embed
            from bertkit.retrieval.search import top_k_inner_product

            vectors = embed(config.mine_model, pool).numpy()
            queries = embed(config.mine_model, [p.query for p in pairs]).numpy()
            mined = top_k_inner_product(vectors, queries, depth)[1].tolist()
    return [Group(p.query, p.positive, list(p.negatives),
                   [pool[i] for i in found if pool[i] != p.positive and pool[i] not in p.negatives])
            for p, found in zip(pairs, mined)]


def rerank_epoch(groups: list[Group], config: RetrievalTrainConfig, rng: random.Random) -> list[tuple]:
    """One epoch's examples: `negatives` per query, its own first, then drawn from the mined top
    `mine_depth` (`common.draw_negatives`). bce: (query, passage, label) rows; listwise: (query,
    positive, [negatives]) rows."""
    rows: list[tuple] = []
    for g in groups:
        negatives = draw_negatives(g.own, g.mined, config.negatives, rng)
        if config.loss == "listwise":
            if negatives:  # a query without negatives has nothing to be ranked against
                rows.append((g.query, g.positive, negatives))
        else:
            rows.append((g.query, g.positive, 1.0))
            rows += [(g.query, n, 0.0) for n in negatives]
    if not rows:
        raise ValueError(f"no query has a negative to rank its positive against ({len(groups)} "
                         "queries): give rows negatives, or --mine bm25 with more than one passage")
    return rows


def prepare(pairs: list[Pair], config: RetrievalTrainConfig) -> list[Group]:
    """Each query's group: its positive, its own negatives and the mined ones (`rerank_groups`)."""
    return rerank_groups(pairs, config)


# An epoch's examples: negatives drawn afresh from each group.
epoch_examples = rerank_epoch


def count_pairs(examples: list[tuple], config: RetrievalTrainConfig) -> int:
    """The (query, passage) pairs an epoch reads: a listwise row holds 1 + its negatives."""
    return sum(1 + len(e[2]) for e in examples) if config.loss == "listwise" else len(examples)


def pooling(config: RetrievalTrainConfig) -> str | None:
    return None  # the head reads [CLS]; no sentence pooling to record


def save_extras(model: nn.Module, tokenizer, out: Path, config: RetrievalTrainConfig, adapters: bool) -> None:
    """The pair length it was trained at is the one to score at: load_reranker and
    sentence-transformers' CrossEncoder both read it from tokenizer_config.json (saved next).
    Scoring BBC bodies at the model's 512 instead cost 4.5x the time of 128."""
    tokenizer.model_max_length = config.max_length
