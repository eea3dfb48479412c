"""What the three task readers share: word pieces, windows, training batches.

- Rows of CSV / TSV / JSONL files come from `data.rows` (streamed; bad rows reported through a
  `DataReport`: file and line named, counted, skipped, so one broken row never stops a run).
- `WordPieces` wraps the `tokenizers` backend for encoding without special tokens or truncation:
  the task code places [CLS] / [SEP] itself, window by window.
- `window_spans` and `max_context_owner` cut long inputs into overlapping windows and decide, for
  each position, which window sees it with the most context on both sides (the rule of the
  original BERT SQuAD code, used here for QA answer starts and for NER stitching).
- `pad_batch` turns a list of training features into padded tensors (a model runs over
  features for evaluation and prediction on the inference engine, `bertkit.inference`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from bertkit.constants import IGNORE_INDEX

log = logging.getLogger(__name__)


def known_label_order(names: set[str], known: dict[str, int] | None) -> list[str] | None:
    """The label order of a model's existing `label2id` when it names every label in `names`.

    Fine-tuning an already fine-tuned model keeps its head meaningful only with the same ids.
    Placeholder maps ("LABEL_0", "LABEL_1", ... of an untrained head) are not reused.
    """
    if not known or all(k.startswith("LABEL_") for k in known) or not names <= set(known):
        return None
    return [k for k, _ in sorted(known.items(), key=lambda kv: kv[1])]


# ---------------------------------------------------------------------------------------------
# word pieces
# ---------------------------------------------------------------------------------------------
@dataclass
class WordPieces:
    """A `tokenizers.Tokenizer` that never truncates, pads or adds special tokens by itself.

    Built from a bertkit `BertTokenizer` (its `.backend`) or a `tokenizers.Tokenizer`; the source
    is copied, so its own truncation / padding settings are left untouched. `pair_middle` and
    `second_type_id` are how the tokenizer's own post-processor joins a pair, read from it, so
    that windows built here lay out as its pair encodings do: BERT `[CLS] A [SEP] B [SEP]` with
    segment 1 for B, RoBERTa `<s> A </s></s> B </s>` with segment 0 throughout.
    """

    backend: Any  # tokenizers.Tokenizer
    cls_id: int
    sep_id: int
    pad_id: int
    pair_middle: tuple[int, ...] = ()  # special ids between A and B (BERT: [SEP]; RoBERTa: </s></s>)
    second_type_id: int = 1  # segment id of B and its closing separator

    @classmethod
    def of(cls, tokenizer: Any) -> "WordPieces":
        from tokenizers import Tokenizer

        backend = getattr(tokenizer, "backend", tokenizer)
        if not isinstance(backend, Tokenizer):
            raise TypeError(f"expected a BertTokenizer or tokenizers.Tokenizer, got {type(tokenizer).__name__}")
        plain = Tokenizer.from_str(backend.to_str())
        plain.no_truncation()
        plain.no_padding()
        ids = {}
        for attr, token in (("cls_token_id", "[CLS]"), ("sep_token_id", "[SEP]"), ("pad_token_id", "[PAD]")):
            # a BertTokenizer knows its special tokens' ids even when they are spelled differently
            ids[attr] = getattr(tokenizer, attr, None)
            if ids[attr] is None:
                ids[attr] = plain.token_to_id(token)
            if ids[attr] is None:
                raise ValueError(f"the tokenizer has no {token} token; BERT inputs need [CLS], [SEP] "
                                 "and [PAD] in the vocabulary")
        middle, second = _pair_layout(plain, ids["sep_token_id"])
        return cls(plain, ids["cls_token_id"], ids["sep_token_id"], ids["pad_token_id"], middle, second)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size()

    def encode(self, texts: Sequence[str]) -> list[Any]:
        """Encodings (ids, offsets into each text, word_ids) of raw texts; batched in Rust."""
        return self.backend.encode_batch(list(texts), add_special_tokens=False)

    def encode_words(self, sentences: Sequence[Sequence[str]]) -> list[Any]:
        """Encodings of pre-split words; `word_ids` index each sentence's words."""
        return self.backend.encode_batch([list(s) for s in sentences], is_pretokenized=True,
                                         add_special_tokens=False)


def _pair_layout(backend: Any, sep_id: int) -> tuple[tuple[int, ...], int]:
    """(ids between a pair's two texts, segment id of the second) from the post-processor; BERT's
    ((sep_id,), 1) for a tokenizer that adds no special tokens to pairs."""
    # Encoded as a pair, not post-processed from two encodings: a TemplateProcessing (XLM-RoBERTa's)
    # drops the first text's sequence id from encodings made apart, which would hide the layout.
    encoding = backend.encode("a", "b")
    sequences = encoding.sequence_ids  # None for special tokens
    if 0 not in sequences or 1 not in sequences:
        return (sep_id,), 1
    last_a = max(i for i, s in enumerate(sequences) if s == 0)
    first_b = sequences.index(1)
    middle = tuple(encoding.ids[last_a + 1:first_b])
    if not middle or any(s is not None for s in sequences[last_a + 1:first_b]):
        return (sep_id,), 1
    return middle, encoding.type_ids[first_b]


# ---------------------------------------------------------------------------------------------
# windows over long inputs
# ---------------------------------------------------------------------------------------------
def window_spans(length: int, size: int, stride: int) -> list[tuple[int, int]]:
    """[start, end) windows of at most `size` items covering `length`, starts `stride` apart.

    As the original BERT SQuAD code: a window starts every `stride` items until one reaches the
    end (that last one may be shorter). `stride <= size` so that no item falls between windows.
    An empty input gets one empty window, so every example yields a feature.
    """
    if size <= 0:
        raise ValueError(f"window size must be positive, got {size}; increase --max-length")
    if not 0 < stride <= size:
        raise ValueError(f"doc stride {stride} must be in 1..{size} (the window's content size), "
                         "or text would fall between windows; lower --doc-stride")
    spans = []
    start = 0
    while True:
        end = min(start + size, length)
        spans.append((start, end))
        if end >= length:
            return spans
        start += stride


def max_context_owner(spans: Sequence[tuple[int, int]], length: int) -> list[int]:
    """For each position in [0, length), the index of the window that sees it with most context.

    Context = min(items to its left, items to its right) inside the window, plus 0.01 × the
    window's length to prefer longer windows on ties (the score of BERT's `_check_is_max_context`);
    remaining ties go to the earlier window.
    """
    owner = [-1] * length
    best = [float("-inf")] * length
    for w, (start, end) in enumerate(spans):
        for i in range(start, end):
            score = min(i - start, end - 1 - i) + 0.01 * (end - start)
            if score > best[i]:
                best[i], owner[i] = score, w
    return owner


# ---------------------------------------------------------------------------------------------
# batches
# ---------------------------------------------------------------------------------------------
def pad_batch(features: Sequence[dict[str, Any]], pad_id: int, width: int = 0) -> dict[str, torch.Tensor]:
    """Pad a list of features to the longest one (or to `width` if longer); returns tensors.

    Each feature has `input_ids` and `token_type_ids` (lists of T_i ints) and optionally
    `labels` (an int / float, or a list of T_i ints for token tasks), `start_positions`,
    `end_positions` (ints). Output: input_ids, token_type_ids, attention_mask (B, T) long;
    labels (B,) long / float or (B, T) long padded with -100; start/end_positions (B,) long.
    """
    width = max(width, *(len(f["input_ids"]) for f in features))
    batch: dict[str, torch.Tensor] = {}

    def padded(key: str, value: int) -> torch.Tensor:
        return torch.tensor([list(f[key]) + [value] * (width - len(f[key])) for f in features],
                            dtype=torch.long)

    batch["input_ids"] = padded("input_ids", pad_id)  # (B, T)
    batch["token_type_ids"] = padded("token_type_ids", 0)  # (B, T)
    batch["attention_mask"] = torch.tensor(
        [[1] * len(f["input_ids"]) + [0] * (width - len(f["input_ids"])) for f in features],
        dtype=torch.long)  # (B, T)
    if "labels" in features[0]:
        first = features[0]["labels"]
        if isinstance(first, (list, tuple)):
            batch["labels"] = padded("labels", IGNORE_INDEX)  # (B, T)
        elif isinstance(first, float):
            batch["labels"] = torch.tensor([f["labels"] for f in features], dtype=torch.float)  # (B,)
        else:
            batch["labels"] = torch.tensor([f["labels"] for f in features], dtype=torch.long)  # (B,)
    for key in ("start_positions", "end_positions"):
        if key in features[0]:
            batch[key] = torch.tensor([f[key] for f in features], dtype=torch.long)  # (B,)
    return batch
