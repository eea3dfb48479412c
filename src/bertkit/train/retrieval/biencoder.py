"""The bi-encoder trainer (`finetune --task embed`): query and passage through one encoder,
pooled and normalised, trained with a loss of `losses.py`'s table; OUT_DIR is a sentence-transformers
model too.

The default loss is MultipleNegativesRankingLoss (Henderson et al. 2017; sentence-transformers'
name): for B queries the candidates are the B positives plus each row's hard negatives, the logits
are cosine × `scale` (20 as sentence-transformers, a temperature of 0.05) and the target of query i
is its own positive. The others (`--loss`): cached-mnrl, cosent, angle, margin-mse, kl, each
optionally over Matryoshka prefixes (`--matryoshka-dims`).
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
from torch import nn

from bertkit.encoder.packing import mean_pool
from bertkit.train import health
from bertkit.train.parallel import gather_in_batch
from bertkit.train.retrieval import gradcache, losses
from bertkit.train.retrieval.common import Pair, RetrievalTrainConfig, encode
from bertkit.util.distributed import DistInfo, gather_with_grad
from bertkit.util.fileio import atomic_write_json

# sentence-transformers' default learning rate, for the bi-encoder's whole encoder.
DEFAULT_LR = 2e-5
# Under torchrun the loss gathers every rank's embeddings (in-batch negatives across ranks).
GATHERS = True


def build(config: RetrievalTrainConfig) -> nn.Module:
    """The encoder to train: the directory's encoder, without any head it has."""
    from bertkit.encoder.model import BertModel

    model = BertModel.from_pretrained(Path(config.model))
    losses.check_dims(config.matryoshka_dims, model.config.hidden_size)
    return model


def chance_loss(config: RetrievalTrainConfig, model_config=None) -> float | None:
    """ln(batch): a uniform guess among the batch's positives (hard negatives left aside), for
    each Matryoshka dimension; None for the losses that are no softmax over the batch."""
    if not losses.EMBED_LOSSES[config.loss].in_batch:
        return None
    return health.uniform_guess(config.batch_size) * len(config.matryoshka_dims or [None])


# No trivial predictor is scored beside a bi-encoder's search.
baseline = health.no_baseline


def prepare(pairs: list[Pair], config: RetrievalTrainConfig) -> list[Pair]:
    """The pairs the loss can read: every epoch trains on all of them, with their own negatives
    (cosent / angle: the scored ones; margin-mse / kl: those with hard_negatives negatives, with
    the teacher's scores: `teacher.usable_pairs`)."""
    from bertkit.train.retrieval.teacher import usable_pairs

    return usable_pairs(pairs, config)


def epoch_examples(pairs: list[Pair], config: RetrievalTrainConfig, rng: random.Random) -> list[Pair]:
    return pairs


def count_pairs(examples: list[Pair], config: RetrievalTrainConfig) -> int:
    return len(examples)


def pooling(config: RetrievalTrainConfig) -> str | None:
    """The sentence pooling the model is trained with (a LoRA side file records it)."""
    return config.pooling


def save_extras(model: nn.Module, tokenizer, out: Path, config: RetrievalTrainConfig, adapters: bool) -> None:
    """The sentence-transformers files beside a full model (an adapter's side file says its pooling)."""
    if not adapters:
        write_sentence_transformers_files(out, model.config.hidden_size, config.pooling, config.max_length)


def pool_padded(hidden: torch.Tensor, attention_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """(B, T, H) states + (B, T) mask → (B, H): mean over real tokens ([CLS]/[SEP] included), or [CLS]."""
    return hidden[:, 0] if mode == "cls" else mean_pool(hidden, attention_mask)  # (B, H)


def loss(model, tokenizer, rows: list[Pair], config: RetrievalTrainConfig, device,
         group: DistInfo | None = None) -> torch.Tensor:
    """The in-batch loss of a batch of pairs: each query against every positive of the batch and
    up to `hard_negatives` of each row's own negatives. group: under torchrun, the ranks whose
    rows make the global batch with these (sentence-transformers' gathered in-batch negatives,
    FlagEmbedding's negatives_cross_device): their embeddings join, with gradients, before the
    loss, which is then the global batch's on every rank. A cached loss embeds by GradCache's
    mini-batches (`gradcache.py`: the same value and gradients, one mini-batch's activations),
    in one process as under torchrun."""
    candidates = [r.positive for r in rows]
    candidates += [n for r in rows for n in r.negatives[:config.hard_negatives]]
    q = encode(tokenizer, [r.query for r in rows], None, config.max_length, device)
    d = encode(tokenizer, candidates, None, config.max_length, device)
    targets = losses.targets(rows, config, device)  # None, (B,) or (B, 1 + K)
    if targets is not None and group is not None:
        targets = gather_with_grad(targets, group)  # every rank's rows, in the gathered order

    def embed(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """A padded batch (each (b, T)) → (b, H) pooled embeddings."""
        return pool_padded(model(**batch).last_hidden_state, batch["attention_mask"], config.pooling)

    def batch_loss(qv: torch.Tensor, dv: torch.Tensor) -> torch.Tensor:
        """This rank's queries (B, H) and candidates (C, H) → the (global) batch's loss."""
        qv, dv = gather_in_batch(qv, dv, len(rows), group)  # (B_all, H), (C_all, H): every rank's rows
        return losses.embed_loss(qv, dv, targets, config)

    if losses.EMBED_LOSSES[config.loss].cached:
        return gradcache.cached_loss(embed, [q, d], batch_loss, config.mini_batch_size)
    return batch_loss(embed(q), embed(d))


def write_sentence_transformers_files(out: Path, hidden_size: int, pooling: str, max_length: int,
                                      normalize: bool = True) -> None:
    """modules.json, 1_Pooling/config.json, sentence_bert_config.json: what makes a BertModel
    directory a SentenceTransformer (and what `inference.Pooling.read` reads back)."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
        (out / "2_Normalize").mkdir(exist_ok=True)
    atomic_write_json(out / "modules.json", modules)
    (out / "1_Pooling").mkdir(exist_ok=True)
    atomic_write_json(out / "1_Pooling" / "config.json", {
        "word_embedding_dimension": hidden_size, "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": False, "include_prompt": True})
    atomic_write_json(out / "sentence_bert_config.json", {"max_seq_length": max_length,
                                                          "do_lower_case": False})

