"""Long documents as passages: cut by the model's own tokenizer, at sentence ends where the text
allows, with an optional overlap; and late chunking (Günther et al. 2024, arXiv 2409.04701).

A BERT bi-encoder reads at most its `max_length` pieces; a document longer than that, embedded
whole, is truncated and its tail never indexed. `split_passages` cuts a document into passages of
at most `max_tokens` pieces (the tokenizer's pieces, so a passage always fits the model):

- a passage ends at the last sentence start (`text.split_sentences`) inside the budget, if that
  keeps it at least half the budget long; else at the last word start, else mid-word;
- the next passage starts `overlap` pieces before the end, moved forward to a sentence start if
  one lies inside the overlap (so an overlap is whole sentences where it can be).

Every passage keeps its character span in the document, so a search hit can point at it.

Late chunking: instead of embedding each passage alone, a window of consecutive passages (at
most `max_length` − 2 pieces) is encoded once, and each passage's vector is the mean of its own
pieces' output states; a passage's vector then carries what the rest of its window says (who "he"
is, what "the deal" was). `late_chunk_windows` assigns passages to windows, `embed_late` pools.
The paper pools the mean of a chunk's token states, whatever the model's own pooling; so does
this (a [CLS]-pooled model is refused: its passages have no [CLS] of their own).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from bertkit.util.text import split_sentences


@dataclass(frozen=True)
class Passage:
    start: int  # character span of the passage in its document: text[start:end]
    end: int
    t0: int  # piece span in the document's pieces (no special tokens): [t0, t1)
    t1: int


def sentence_starts(text: str, offsets: Sequence[tuple[int, int]]) -> set[int]:
    """Indices of the pieces that begin a sentence of `text` (piece 0 always)."""
    starts, pos = set(), 0
    char_starts = []
    for sentence in split_sentences(text):
        at = text.find(sentence, pos)
        if at < 0:  # split_sentences strips and joins nothing, so this does not happen; be safe
            continue
        char_starts.append(at)
        pos = at + len(sentence)
    piece = 0
    for c in char_starts:
        while piece < len(offsets) and offsets[piece][0] < c:
            piece += 1
        if piece < len(offsets):
            starts.add(piece)
    starts.add(0)
    return starts


def split_passages(text: str, offsets: Sequence[tuple[int, int]], word_starts: Sequence[bool],
                   max_tokens: int, overlap: int = 0) -> list[Passage]:
    """A document's passages, in order.

    offsets: (T,) character span of each piece of `text` (no special tokens), as the tokenizer
    gives them; word_starts: (T,) whether piece t begins a word (not a "##" continuation).
    max_tokens: pieces per passage (≥ 1); overlap: pieces shared by neighbours (0 ≤ overlap <
    max_tokens). A text with no pieces has no passages.
    """
    if max_tokens < 1:
        raise ValueError(f"passage tokens must be positive, got {max_tokens}")
    if not 0 <= overlap < max_tokens:
        raise ValueError(f"passage overlap {overlap} must be in 0..{max_tokens - 1} (below --passage-tokens)")
    n = len(offsets)
    if n == 0:
        return []
    sentences = sentence_starts(text, offsets)
    out, start = [], 0
    while True:
        end = min(start + max_tokens, n)
        if end < n:
            cut = next((b for b in range(end, start + max(1, max_tokens // 2) - 1, -1) if b in sentences), None)
            if cut is None:
                cut = next((b for b in range(end, start, -1) if word_starts[b]), end)
            end = cut
        out.append(Passage(offsets[start][0], offsets[end - 1][1], start, end))
        if end >= n:
            return out
        nxt = max(end - overlap, start + 1)
        # Move the overlap's start forward to a sentence start inside it, when there is one.
        nxt = next((b for b in range(nxt, end) if b in sentences), nxt)
        start = nxt


def late_chunk_windows(passages: Sequence[Passage], max_tokens: int) -> list[tuple[int, int]]:
    """The piece span [w0, w1) of the window each passage is encoded in: consecutive passages
    grouped greedily while their span fits `max_tokens` pieces (the model's length − 2)."""
    windows: list[tuple[int, int]] = []
    group: list[Passage] = []
    for p in passages:
        if group and p.t1 - group[0].t0 > max_tokens:
            windows.extend([(group[0].t0, group[-1].t1)] * len(group))
            group = []
        group.append(p)
    if group:
        windows.extend([(group[0].t0, group[-1].t1)] * len(group))
    return windows


def tokenize_documents(tokenizer: Any, texts: Sequence[str]) -> list[tuple[list[int], list[tuple[int, int]],
                                                                             list[bool]]]:
    """(ids, offsets, word_starts) of each text's pieces, without special tokens or truncation."""
    out = []
    for e in tokenizer.encode_batch(list(texts), truncation=False):
        keep = [i for i, special in enumerate(e.special_tokens_mask) if not special]
        words = [e.word_ids[i] for i in keep]
        out.append(([e.ids[i] for i in keep], [tuple(e.offsets[i]) for i in keep],
                    [j == 0 or words[j] != words[j - 1] for j in range(len(keep))]))
    return out


def embed_late(engine: Any, items: Sequence[tuple[list[int], int, int]], normalize: bool):
    """Late-chunked vectors, one per item.

    items: (window_ids, p0, p1): a window's piece ids (no special tokens) and the passage's span
    [p0, p1) inside it. Equal windows are encoded once. Returns (len(items), H) float32 tensor.
    """
    import torch
    import torch.nn.functional as F

    from bertkit.encoder.model import encoder_of

    tok = engine.tokenizer
    windows: dict[tuple[int, ...], int] = {}
    for ids, _, _ in items:
        windows.setdefault(tuple(ids), len(windows))
    seqs = [[tok.cls_token_id, *w, tok.sep_token_id] for w in windows]
    states: list[Any] = [None] * len(seqs)
    encoder = encoder_of(engine.model)

    def head(_model, batch):
        hidden = encoder.forward_packed(batch.input_ids, batch.token_type_ids, batch.packed).hidden
        return [h.float().cpu() for h in batch.split(hidden)]  # one (T_i, H) per window

    for index, hiddens in engine.run(seqs, None, head):
        for i, h in zip(index, hiddens):
            states[i] = h
    out = torch.empty(len(items), engine.config.hidden_size)
    for row, (ids, p0, p1) in enumerate(items):
        h = states[windows[tuple(ids)]]  # (T, H), [CLS] at 0
        out[row] = h[1 + p0:1 + p1].mean(0)  # the passage's own pieces
    return F.normalize(out, dim=-1) if normalize else out
