"""ColBERT models (late interaction): a query and a document as one unit vector per token, scored
by MaxSim (`multivector.maxsim`; Khattab & Zaharia, SIGIR 2020).

A ColBERT directory is PyLate's layout (`pylate.models.ColBERT`, which sentence-transformers v6
absorbed): a Transformer module (the encoder), one or more Dense modules (the projection, hidden
size → 128 typically, no bias) and config_sentence_transformers.json with the query and document
settings (`encoder.sentence_transformers.ColbertSettings`). Texts become token vectors as PyLate
makes them, equal to its `encode(is_query=...)` within 1e-5 (fp32; tests/test_colbert_pylate.py):

    query     [CLS] [Q] tokens [SEP] [MASK] … [MASK]   cut / padded to query_length, every vector kept
    document  [CLS] [D] tokens [SEP]                   cut at document_length, punctuation dropped

The prefix token ([Q] / [D], added tokens of the tokenizer) is inserted by id after [CLS], and
texts are cut one token short to leave it room, as PyLate does. The [MASK] padding is ColBERT's
query augmentation (§3.2): the expansion tokens read the query and so learn to stand for terms it
could have had. With attend_to_expansion_tokens false (ColBERT's own choice and PyLate's default)
no token attends to them: the real tokens see only each other and the [MASK] positions see the
real tokens, a key mask that differs from the padding mask (`encode_with_key_mask`). Every vector
goes through the projection and is scaled to unit length; a document's skiplist tokens
(string.punctuation by default) are encoded with the rest and dropped from its vectors.

Where it differs in how, not what: sequences run packed on the engine (no padding rows; queries
are all query_length long, so their batches have none to begin with), and PyLate's hierarchical
token pooling (`pool_factor`) is not offered.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from bertkit.encoder import modern
from bertkit.encoder.model import BertModel, encoder_of
from bertkit.encoder.packing import Padding
from bertkit.encoder.sentence_transformers import ColbertSettings, DenseLayer, dense_weights
from bertkit.inference.common import as_texts
from bertkit.inference.engine import Batch, Engine
from bertkit.inference.multivector import maxsim_scores
from bertkit.util.fileio import model_directory

log = logging.getLogger(__name__)

LATE_INTERACTION_NEEDS = ("a ColBERT model (PyLate's layout: modules.json with a Dense projection and "
                          "config_sentence_transformers.json; `bertkit finetune --task colbert` makes one)")


class Dense(nn.Module):
    """PyLate's Dense module: a linear map (no activation), plus the input when use_residual
    (through its own linear map when the sizes differ). State dict names as PyLate's."""

    def __init__(self, layer: DenseLayer):
        super().__init__()
        self.linear = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias)
        self.use_residual = layer.use_residual
        same = layer.in_features == layer.out_features
        self.residual = nn.Linear(layer.in_features, layer.out_features, bias=False) \
            if layer.use_residual and not same else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(N, in) → (N, out); any leading dimensions."""
        y = self.linear(x)
        if self.use_residual:
            y = y + (x if self.residual is None else self.residual(x))
        return y


def projection(model_dir: str | os.PathLike, settings: ColbertSettings) -> nn.Sequential:
    """The Dense modules of a ColBERT directory, in order, fp32: (N, H) → (N, D)."""
    layers = []
    for layer in settings.dense:
        dense = Dense(layer)
        dense.load_state_dict({name: tensor.float() for name, tensor in dense_weights(model_dir, layer).items()})
        layers.append(dense)
    return nn.Sequential(*layers)


@dataclass
class Colbert:
    """A ColBERT model on the inference engine: its encoder's engine, its settings, its projection."""

    engine: Engine
    settings: ColbertSettings
    projection: nn.Sequential  # fp32 on the engine's device: (N, H) → (N, D)

    def __post_init__(self) -> None:
        tokenizer, limit = self.engine.tokenizer, self.engine.config.max_sequence_length
        if self.settings.dense[0].in_features != self.engine.config.hidden_size:
            raise ValueError(f"the ColBERT projection reads {self.settings.dense[0].in_features} features but "
                             f"the encoder's hidden size is {self.engine.config.hidden_size}; the Dense "
                             "layer belongs to another model")
        for name in ("query_length", "document_length"):
            if getattr(self.settings, name) > limit:
                raise ValueError(f"the ColBERT {name} {getattr(self.settings, name)} exceeds the model's "
                                 f"limit of {limit} tokens; lower it in config_sentence_transformers.json")
        self.query_prefix_id, self.document_prefix_id = prefix_ids(tokenizer, self.settings)
        self.skiplist_ids = skiplist_ids(tokenizer, self.settings)
        self.projection = self.projection.to(self.engine.device).eval()

    @classmethod
    def load(cls, model_dir: str | os.PathLike, **options: Any) -> "Colbert":
        """A ColBERT directory on an engine (`options` go to `Engine.load`), or a one-line
        ValueError naming what late interaction needs."""
        model_dir = model_directory(model_dir)
        if ColbertSettings.read(model_dir) is None:  # before the weights load
            raise ValueError(f"{model_dir} is not a ColBERT model; late interaction needs {LATE_INTERACTION_NEEDS}")
        return cls.of(Engine.load(model_dir, use="embed", **options))

    @classmethod
    def of(cls, engine: Engine) -> "Colbert | None":
        """The ColBERT side of an engine loaded from a ColBERT directory; None for any other model."""
        settings = ColbertSettings.read(engine.model_dir) if engine.model_dir is not None else None
        return None if settings is None else cls(engine, settings, projection(engine.model_dir, settings))

    @property
    def dimension(self) -> int:
        """The size of a token vector."""
        return self.settings.dimension

    def token_ids(self, texts: Sequence[str], is_query: bool) -> tuple[list[list[int]], list[int]]:
        """`colbert_token_ids` with this model's tokenizer and settings; truncations counted."""
        prefix = self.query_prefix_id if is_query else self.document_prefix_id
        ids, real, long = colbert_token_ids(self.engine.tokenizer, self.settings, prefix, texts, is_query)
        length = self.settings.query_length if is_query else self.settings.document_length
        self._count_truncated(long, len(texts), length)
        return ids, real

    def _count_truncated(self, long: int, total: int, length: int) -> None:
        """Longer texts are cut, as PyLate cuts them (refused with truncate=False); said once per
        engine, then counted in its stats."""
        if not long:
            return
        if not self.engine.truncate:
            raise ValueError(f"{long} of {total} texts exceed the ColBERT length of {length} tokens; shorten "
                             "them or allow truncation (--truncate)")
        first = self.engine.stats.truncated == 0
        self.engine.stats.add(truncated=long)
        log.log(logging.WARNING if first else logging.DEBUG,
                "%d of %d texts were longer than %d tokens and were truncated (ColBERT lengths)", long, total, length)

    # -- vectors -------------------------------------------------------------------------------
    def encode(self, texts: str | Sequence[str], *, is_query: bool) -> list[torch.Tensor]:
        """Token vectors per text, in the order of `texts`: float32 (T_i, D) unit rows on the CPU.
        A query has query_length rows (with expansion); a document one per token kept."""
        texts = as_texts(texts, "query" if is_query else "document")
        ids, real = self.token_ids(texts, is_query)
        settings, encoder = self.settings, encoder_of(self.engine.model)
        masked_keys = is_query and settings.do_query_expansion and not settings.attend_to_expansion_tokens

        def head(_model, batch: Batch) -> list[torch.Tensor]:
            if masked_keys:  # every query of the batch is query_length long
                width = batch.packed.lengths[0]
                rows = len(batch.packed.lengths)
                keys = torch.arange(width, device=batch.input_ids.device) < torch.tensor(
                    [real[i] for i in batch.index], device=batch.input_ids.device)[:, None]  # (B, Q)
                hidden = encode_with_key_mask(encoder, batch.input_ids.view(rows, width),
                                              batch.token_type_ids.view(rows, width), keys).reshape(rows * width, -1)
            else:
                hidden = encoder.forward_packed(batch.input_ids, batch.token_type_ids, batch.packed).hidden  # (N, H)
            vectors = F.normalize(self.projection(hidden.float()), dim=-1)  # (N, D)
            if not is_query:
                keep = ~torch.isin(batch.input_ids, self.skiplist_ids.to(batch.input_ids.device))  # (N,)
                counts = [int(part.sum()) for part in keep.split(batch.packed.lengths)]
                return list(vectors[keep].cpu().split(counts))
            return batch.split(vectors.cpu())

        return self.engine.run_ordered(ids, None, head)

    def encode_query(self, texts: str | Sequence[str]) -> list[torch.Tensor]:
        return self.encode(texts, is_query=True)

    def encode_document(self, texts: str | Sequence[str]) -> list[torch.Tensor]:
        return self.encode(texts, is_query=False)

    def rerank(self, query: str, documents: Sequence[str], *, top_k: int | None = None) -> list[dict[str, Any]]:
        """Documents by MaxSim with `query`, best first: [{"index", "score"}] (the plain sum over
        query tokens, as PyLate's `rank.rerank` scores)."""
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k must be positive, got {top_k}")
        query_vectors = self.encode_query(as_texts(query, "query")[:1])[0]  # (Q, D)
        document_vectors = self.encode_document(as_texts(documents, "document"))
        empty = [i for i, d in enumerate(document_vectors) if len(d) == 0]
        if empty:
            raise ValueError(f"document {empty[0]} has no token left after its skiplist; give it words")
        scores = maxsim_scores(query_vectors, document_vectors)  # (K,)
        order = sorted(range(len(document_vectors)), key=lambda i: (-float(scores[i]), i))[:top_k]
        return [{"index": i, "score": float(scores[i])} for i in order]


def prefix_ids(tokenizer, settings: ColbertSettings) -> tuple[int | None, int | None]:
    """The ids of the query and document prefix tokens (None for an empty prefix: none inserted)."""
    found = []
    for prefix in (settings.query_prefix, settings.document_prefix):
        token_id = tokenizer.backend.token_to_id(prefix) if prefix else None
        if prefix and token_id is None:
            raise ValueError(f"the tokenizer has no token {prefix!r}, the ColBERT prefix that "
                             "config_sentence_transformers.json names; save the tokenizer PyLate extended "
                             "with the model")
        found.append(token_id)
    return found[0], found[1]


def skiplist_ids(tokenizer, settings: ColbertSettings) -> torch.Tensor:
    """(S,) long ids of the skiplist words; a word missing from the vocabulary maps to [UNK],
    which is then skipped too, as in PyLate."""
    return torch.tensor(sorted(set(tokenizer.convert_tokens_to_ids(list(settings.skiplist_words)))), dtype=torch.long)


def colbert_token_ids(tokenizer, settings: ColbertSettings, prefix: int | None, texts: Sequence[str],
                      is_query: bool) -> tuple[list[list[int]], list[int], int]:
    """Each text's ids as PyLate builds them, the count of its real tokens (the rest, up to
    query_length, are [MASK] expansion tokens) and how many texts were cut: ([ids], [real], cut).
    prefix: the id inserted after [CLS] (`prefix_ids`), or None."""
    length = settings.query_length if is_query else settings.document_length
    room = length - 1 if prefix is not None else length
    # sentence-transformers' Transformer module strips each text before tokenizing
    encodings = tokenizer.encode_raw([text.strip() for text in texts], max_length=room)
    ids, real = [], []
    for encoding in encodings:
        row = list(encoding.ids)
        if prefix is not None:
            row.insert(1, prefix)
        real.append(len(row))
        if is_query and settings.do_query_expansion:
            row += [tokenizer.mask_token_id] * (length - len(row))
        ids.append(row)
    return ids, real, sum(bool(e.overflowing) for e in encodings)


def encode_with_key_mask(encoder: BertModel, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                         key_mask: torch.Tensor) -> torch.Tensor:
    """The encoder over a (B, T) batch where every position is computed but attention reads only
    the keys of `key_mask`: (B, T) long ids and segments, (B, T) bool key mask → (B, T, H) states.

    A padding mask (`BertModel.forward`'s attention_mask) would also drop the masked positions'
    own states; ColBERT's expansion tokens need theirs, while no token may read them. So the
    layers get a `Padding` whose rows are every position and whose key mask is `key_mask`: the
    same attention masks (ModernBERT's local band and MPNet's relative bias included) and layers
    as `BertModel.forward`, over every row. Training calls it too (with gradients).
    """
    batch, length = input_ids.shape
    device = input_ids.device
    keys = Padding(index=torch.arange(batch * length, device=device), key_mask=key_mask[:, None, None, :].bool(),
                   batch=batch, length=length)
    x = encoder.embeddings(input_ids, token_type_ids).view(batch * length, -1)  # (B*T, E)
    if encoder.embed_proj is not None:
        x = encoder.embed_proj(x)  # (B*T, H)
    if encoder.final_norm is not None:  # ModernBERT: rotary positions, then the final norm
        rope = modern.rope_tables(encoder.layers, torch.arange(length, device=device))
        for layer in encoder.layers:
            x = layer(x, keys, batch, length, rope[layer.layer_type])  # (B*T, H)
        return encoder.final_norm(x).view(batch, length, -1)  # (B, T, H)
    mask = None if encoder.relative_bias is None else encoder.relative_bias.scores(length, keys)
    for i in encoder.schedule:
        x = encoder.layers[i](x, keys, batch, length, mask)  # (B*T, H)
    return x.view(batch, length, -1)  # (B, T, H)
