"""Training the two BERT stages of retrieval: a bi-encoder (`embed`) and a cross-encoder (`rerank`).

embed — a bi-encoder from any BERT directory. Query and passage go through the same encoder,
pooled (mean over every token, [CLS] and [SEP] included, as sentence-transformers; or [CLS])
and normalised. Loss: in-batch negatives, MultipleNegativesRankingLoss (Henderson et al. 2017;
sentence-transformers' name): for B queries the candidates are the B positives plus each row's
hard negatives, the logits are cosine × `scale` (20 as sentence-transformers, a temperature of
0.05) and the target of query i is its own positive; `loss` picks another of `losses.py`'s
table (cached-mnrl, cosent, angle, margin-mse and kl from a `teacher` cross-encoder's scores), and
`matryoshka_dims` trains the embedding's prefixes too. OUT_DIR is a Hugging Face BertModel
directory and also a sentence-transformers model (modules.json, 1_Pooling/config.json,
sentence_bert_config.json): `SentenceTransformer(OUT_DIR)` gives the vectors
`bertkit.inference.embed(OUT_DIR, ...)` gives.

rerank — a cross-encoder: [CLS] query [SEP] passage [SEP] → one logit (a sequence-classification
head with one label), trained on each positive and `negatives` hard negatives per query: the
row's own, then mined by BM25 (`mine="bm25"`, lexical look-alikes, the usual first stage) or by a
bi-encoder (`mine="biencoder"`, `mine_model`) from every passage of the training file. A row
with more negatives than `negatives` (or a mined list) is a pool: each epoch draws afresh from it.
Two losses: `loss="bce"`, binary cross-entropy on every (query, passage, 0/1) pair, batch_size
pairs a step; `loss="listwise"`, softmax cross-entropy over one query's positive and its
negatives (the positive must outscore them all; Nogueira & Cho's pointwise BCE vs the listwise
"localized contrastive" loss of Gao et al. 2021), batch_size queries a step. The pair length
(`max_length`) is written as the tokenizer's `model_max_length`: `search.load_reranker` and
sentence-transformers' `CrossEncoder(OUT_DIR)` cut pairs where training did, and the latter
scores as `bertkit.inference.rerank` does (sigmoid of the logit).

Inputs: JSONL rows {"query", "positive", "negatives"?: [..]} (cosent / angle: {"sentence1",
"sentence2", "score"}) or TSV rows query<TAB>document<TAB>label
(label 1 relevant, 0 a negative of that query; an optional header), or builtin:NAME[:SPLIT] of
`bertkit.retrieval.datasets`. Bad rows are named file:line, counted and skipped.

    common.py        the settings (`RetrievalTrainConfig`), the training pairs, hard negatives drawn, one update
    biencoder.py     embed: the encoder, pooling, the loss call, sentence-transformers files
    losses.py        embed's losses, one table: mnrl, cached-mnrl, cosent, angle, margin-mse, kl; Matryoshka
    gradcache.py     GradCache: a large batch's loss at one mini-batch's memory (cached-mnrl; torchrun too)
    teacher.py       a cross-encoder teacher's scores of every training pair, cached in OUT_DIR
    mining.py        `bertkit mine-negatives`: hard negatives as sentence-transformers' mine_hard_negatives
    crossencoder.py  rerank: the one-logit head, mined negatives, the bce and listwise losses
    loop.py          embed and rerank as parts of the one run: the tokenizer, LoRA, saving, evaluation
    resumable.py     the one run of embed, rerank, SPLADE (`train.sparse`) and ColBERT (`train.colbert`):
                     output checks, epochs, torchrun, exact resume, saving, evaluation, the health checks;
                     SPLADE's and ColBERT's shared settings and BM25 negatives
    evaluate.py      MRR@10 / Recall@k / nDCG@10 of a trained model, and a reranker's first stage
"""

from bertkit.train.retrieval.biencoder import pool_padded, write_sentence_transformers_files
from bertkit.train.retrieval.common import (
    BUILTIN_PREFIX,
    RETRIEVAL_OPTIONS,
    TASKS,
    Pair,
    RetrievalTrainConfig,
    from_finetune_config,
    optimizer_step,
    read_pairs,
)
from bertkit.train.retrieval.crossencoder import RERANK_LR, listwise_loss, rerank_epoch, rerank_groups
from bertkit.train.retrieval.evaluate import evaluate
from bertkit.train.retrieval.loop import finetune_retrieval, run
from bertkit.train.retrieval.losses import EMBED_LOSSES, embed_loss, multiple_negatives_ranking_loss

__all__ = ["BUILTIN_PREFIX", "EMBED_LOSSES", "RERANK_LR", "RETRIEVAL_OPTIONS", "TASKS", "Pair",
           "RetrievalTrainConfig", "embed_loss", "evaluate", "finetune_retrieval", "from_finetune_config",
           "listwise_loss",
           "multiple_negatives_ranking_loss", "optimizer_step", "pool_padded", "read_pairs", "rerank_epoch",
           "rerank_groups", "run", "write_sentence_transformers_files"]
