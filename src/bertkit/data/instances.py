"""Pre-training instances from tokenized documents: BERT's NSP pairs, ALBERT's SOP pairs, or
packed full sentences.

NSP (google-research/bert `create_instances_from_document`): sentences of a document accumulate
into a chunk until it reaches the target length (max_seq_len − 3: room for [CLS] A [SEP] B [SEP]);
the chunk's first k sentences (k random) are segment A. Half the time B is the rest of the chunk
(IsNext, label 0); otherwise B is a run of sentences from a random other document (NotNext, label
1) and the chunk's unused sentences go back to be read again, so no text is wasted. The longer of
A and B then loses tokens from a random end until the pair fits: always cutting the same end would
teach the model that one end of a segment is special.

With probability short_seq_prob (0.1) a chunk aims at a random shorter target: fine-tuning inputs
are often short, and a model trained only on full-length ones would not have seen short ones.

Departures from the reference, each for the label balance or the rate: the short target is drawn
per chunk (the reference draws once per document, so a long document is all short or all long);
a chunk always takes at least two sentences and never leaves a single one behind at the end of a
document (neither when closing it nor when putting sentences back after a NotNext), so only
one-sentence documents force NotNext and IsNext stays at 50%.

No-NSP (RoBERTa's FULL-SENTENCES, Liu et al. 2019 §4.2): contiguous sentences packed up to
max_seq_len as [CLS] ... [SEP], crossing document boundaries with an extra [SEP] between
documents; one segment, NSP label -100. A sentence longer than a whole sequence is cut into pieces.

SOP (ALBERT's sentence-order prediction, Lan et al. 2020 §3.1): chunks gather as for NSP, and A
and B are always two consecutive segments of the same document; half the time they are swapped
(label 1 = swapped, 0 = in order), so the model must learn coherence rather than topic. A chunk of
one sentence (a one-sentence document, or a sentence that fills the target alone) is cut in the
middle of its tokens; a one-token chunk gives no pair and is skipped.

These are small pure functions; the random generator is always an argument.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import numpy as np

from bertkit.data.masking import continuation_table, segment_chinese, token_word_starts
from bertkit.util.text import has_cjk

if TYPE_CHECKING:
    from bertkit.data.tokenizer import BertTokenizer

IS_NEXT, NOT_NEXT, NO_NSP = 0, 1, -100
IN_ORDER, SWAPPED = 0, 1  # SOP labels, stored where NSP's are
# Sentences per call into the tokenizer: large enough for its threads, small enough for a lively
# progress bar.
_ENCODE_CHUNK = 8192


@dataclass
class TokenizedDocuments:
    """Many documents' sentences as one flat token array (compact, cheap to slice and to pickle).

    token_ids: (N,) int32; sentence_offsets: (S + 1,) int64, sentence s is
    token_ids[sentence_offsets[s]:sentence_offsets[s + 1]]; document_offsets: (D + 1,) int64,
    document d holds sentences document_offsets[d] .. document_offsets[d + 1] - 1; word_starts:
    (N,) bool whole-word boundaries, or None when not computed. Every sentence has ≥ 1 token and
    every document ≥ 1 sentence.
    """

    token_ids: np.ndarray
    sentence_offsets: np.ndarray
    document_offsets: np.ndarray
    word_starts: np.ndarray | None = None

    @property
    def num_documents(self) -> int:
        return len(self.document_offsets) - 1

    @property
    def num_sentences(self) -> int:
        return len(self.sentence_offsets) - 1

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def sentence_range(self, document: int) -> range:
        """Global sentence numbers of one document."""
        return range(int(self.document_offsets[document]), int(self.document_offsets[document + 1]))

    def sentence_length(self, sentence: int) -> int:
        return int(self.sentence_offsets[sentence + 1] - self.sentence_offsets[sentence])

    def tokens(self, first_sentence: int,
               end_sentence: int) -> tuple[np.ndarray, np.ndarray | None]:
        """(ids, word_starts) of the sentences [first_sentence, end_sentence), concatenated."""
        lo, hi = self.sentence_offsets[first_sentence], self.sentence_offsets[end_sentence]
        starts = None if self.word_starts is None else self.word_starts[lo:hi]
        return self.token_ids[lo:hi], starts

    def subset(self, documents: Sequence[int]) -> "TokenizedDocuments":
        """The given documents, in the given order, as a new (copied) collection."""
        sentences = [self.sentence_range(d) for d in documents]
        lengths = np.diff(self.sentence_offsets)
        sentence_ids = np.fromiter((s for r in sentences for s in r), dtype=np.int64)
        token_spans = [np.arange(self.sentence_offsets[r.start], self.sentence_offsets[r.stop])
                       for r in sentences]
        token_index = np.concatenate(token_spans) if token_spans else np.zeros(0, dtype=np.int64)
        return TokenizedDocuments(
            token_ids=self.token_ids[token_index],
            sentence_offsets=np.concatenate([[0], np.cumsum(lengths[sentence_ids])]
                                            ).astype(np.int64),
            document_offsets=np.concatenate([[0], np.cumsum([len(r) for r in sentences])]
                                            ).astype(np.int64),
            word_starts=None if self.word_starts is None else self.word_starts[token_index],
        )


def tokenize_documents(documents: Sequence[Sequence[str]], tokenizer: "BertTokenizer", *,
                       whole_word_mask: bool = False, workers: int = 1,
                       on_tokens: Callable[[int], None] | None = None) -> TokenizedDocuments:
    """Tokenize documents (lists of sentences) without special tokens into `TokenizedDocuments`.

    Encoding runs in the tokenizer's own threads, chunk by chunk; on_tokens(n) is called after each
    chunk (for a progress bar). With whole_word_mask, word starts are computed from WordPiece `##`
    pieces and, in sentences holding CJK characters, jieba's words (segmented in `workers`
    processes). Sentences that encode to nothing and documents left empty are dropped.
    """
    from bertkit.data.formats.common import WordPieces

    sentences = [s for doc in documents for s in doc]
    per_document = np.array([len(doc) for doc in documents], dtype=np.int64)
    backend = WordPieces.of(tokenizer).backend  # a copy that never truncates nor pads
    # Without word boundaries only ids are needed: the fast path skips offsets.
    encode = backend.encode_batch if whole_word_mask else getattr(
        backend, "encode_batch_fast", backend.encode_batch)
    id_lists: list[list[int]] = []
    offset_lists: list[list[tuple[int, int]]] = []
    for lo in range(0, len(sentences), _ENCODE_CHUNK):
        encodings = encode(sentences[lo:lo + _ENCODE_CHUNK], add_special_tokens=False)
        id_lists += [e.ids for e in encodings]
        if whole_word_mask:
            offset_lists += [e.offsets for e in encodings]
        if on_tokens is not None:
            on_tokens(sum(len(e.ids) for e in encodings))

    lengths = np.fromiter((len(ids) for ids in id_lists), dtype=np.int64, count=len(id_lists))
    token_ids = np.fromiter(itertools.chain.from_iterable(id_lists), dtype=np.int32,
                            count=int(lengths.sum()))
    word_starts = None
    if whole_word_mask:
        word_starts = _word_starts(sentences, token_ids, lengths, offset_lists,
                                   continuation_table(tokenizer), workers)
    # Drop empty sentences, then documents left without sentences.
    keep = lengths > 0
    document_of = np.repeat(np.arange(len(per_document)), per_document)
    kept_per_document = np.bincount(document_of[keep], minlength=len(per_document))
    kept_per_document = kept_per_document[kept_per_document > 0]
    return TokenizedDocuments(
        token_ids=token_ids,
        sentence_offsets=np.concatenate([[0], np.cumsum(lengths[keep])]).astype(np.int64),
        document_offsets=np.concatenate([[0], np.cumsum(kept_per_document)]).astype(np.int64),
        word_starts=word_starts,
    )


def _word_starts(sentences: Sequence[str], token_ids: np.ndarray, lengths: np.ndarray,
                 offset_lists: Sequence[Sequence[tuple[int, int]]], continuation: np.ndarray,
                 workers: int) -> np.ndarray:
    """(N,) bool whole-word starts of all tokens: `##` pieces, plus jieba's words in CJK text."""
    # One character coordinate for the whole corpus: sentence s starts at char_base[s].
    char_lengths = np.fromiter((len(s) for s in sentences), dtype=np.int64, count=len(sentences))
    char_base = np.cumsum(char_lengths) - char_lengths
    token_chars = np.fromiter((start for offsets in offset_lists for start, _ in offsets),
                              dtype=np.int64, count=len(token_ids))
    token_chars += np.repeat(char_base, lengths)
    cjk = [i for i, s in enumerate(sentences) if has_cjk(s)]
    # Word starts: jieba's in CJK sentences; elsewhere every token start (WordPiece alone decides).
    boundaries = [token_chars[np.repeat(~np.isin(np.arange(len(sentences)), cjk), lengths)]]
    for i, starts in zip(cjk, segment_chinese([sentences[i] for i in cjk], workers)):
        boundaries.append(np.asarray(starts, dtype=np.int64) + char_base[i])
    return token_word_starts(token_ids, token_chars, np.sort(np.concatenate(boundaries)),
                             continuation)


@dataclass(frozen=True)
class Instance:
    """One pre-training sequence.

    input_ids: (L,) int64, [CLS] A [SEP] B [SEP] (NSP) or [CLS] ... [SEP] (packed);
    segment_b_start: position of B's first token (token_type_ids are 1 from there on), L when the
    sequence has one segment; nsp_label: 0 IsNext, 1 NotNext, -100 without NSP;
    word_starts: (L,) bool whole-word boundaries (False on special tokens), or None.
    """

    input_ids: np.ndarray
    segment_b_start: int
    nsp_label: int
    word_starts: np.ndarray | None = None

    @property
    def token_type_ids(self) -> np.ndarray:
        return (np.arange(len(self.input_ids)) >= self.segment_b_start).astype(np.int64)  # (L,)


def truncate_seq_pair(len_a: int, len_b: int, max_num_tokens: int,
                      rng: random.Random) -> tuple[slice, slice]:
    """Slices of A and B that fit max_num_tokens together, trimming the longer one token at a time
    from a random end (each end with probability 1/2)."""
    a_lo, a_hi, b_lo, b_hi = 0, len_a, 0, len_b
    while (a_hi - a_lo) + (b_hi - b_lo) > max_num_tokens:
        if (a_hi - a_lo) > (b_hi - b_lo):
            if rng.random() < 0.5:
                a_lo += 1
            else:
                a_hi -= 1
        elif rng.random() < 0.5:
            b_lo += 1
        else:
            b_hi -= 1
    return slice(a_lo, a_hi), slice(b_lo, b_hi)


def create_instances_from_document(docs: TokenizedDocuments, document: int, *, max_seq_len: int,
                                   short_seq_prob: float, rng: random.Random, cls_id: int,
                                   sep_id: int) -> list[Instance]:
    """NSP instances of one document; NotNext segments come from other documents of `docs`."""
    max_num_tokens = max_seq_len - 3  # [CLS] A [SEP] B [SEP]
    sentences = docs.sentence_range(document)
    instances: list[Instance] = []
    chunk_start = i = sentences.start
    chunk_length = 0
    target = _target_length(max_num_tokens, short_seq_prob, rng)
    while i < sentences.stop:
        chunk_length += docs.sentence_length(i)
        chunk_size = i + 1 - chunk_start
        left_after = sentences.stop - (i + 1)
        full = chunk_length >= target and chunk_size >= 2 and left_after != 1
        if not (full or left_after == 0):
            i += 1
            continue
        # A = the chunk's first a_end sentences.
        a_end = chunk_start + (rng.randint(1, chunk_size - 1) if chunk_size >= 2 else 1)
        if chunk_size == 1 or rng.random() < 0.5:
            label = NOT_NEXT
            if left_after == 0 and i + 1 - a_end == 1:
                # Put back, the document's last sentence would stand alone and force another
                # NotNext; A keeps it instead.
                a_end = i + 1
            tokens_a, starts_a = docs.tokens(chunk_start, a_end)
            tokens_b, starts_b = _random_segment(docs, document, target - len(tokens_a), rng)
            i = a_end - 1  # the chunk's unused sentences are read again
        else:
            label = IS_NEXT
            tokens_a, starts_a = docs.tokens(chunk_start, a_end)
            tokens_b, starts_b = docs.tokens(a_end, i + 1)
        keep_a, keep_b = truncate_seq_pair(len(tokens_a), len(tokens_b), max_num_tokens, rng)
        instances.append(_pair_instance(tokens_a[keep_a], tokens_b[keep_b],
                                        None if starts_a is None else starts_a[keep_a],
                                        None if starts_b is None else starts_b[keep_b],
                                        label, cls_id, sep_id))
        chunk_start, chunk_length = i + 1, 0
        target = _target_length(max_num_tokens, short_seq_prob, rng)
        i += 1
    return instances


def create_nsp_instances(docs: TokenizedDocuments, *, max_seq_len: int, short_seq_prob: float,
                         rng: random.Random, cls_id: int, sep_id: int) -> Iterator[Instance]:
    """NSP instances of every document, in document order."""
    _check_max_seq_len(max_seq_len, minimum=5)
    for document in range(docs.num_documents):
        yield from create_instances_from_document(docs, document, max_seq_len=max_seq_len,
                                                  short_seq_prob=short_seq_prob, rng=rng,
                                                  cls_id=cls_id, sep_id=sep_id)


def create_sop_instances(docs: TokenizedDocuments, *, max_seq_len: int, short_seq_prob: float,
                         rng: random.Random, cls_id: int, sep_id: int) -> Iterator[Instance]:
    """SOP instances of every document, in document order (see the module docstring)."""
    _check_max_seq_len(max_seq_len, minimum=5)
    max_num_tokens = max_seq_len - 3  # [CLS] A [SEP] B [SEP]
    for document in range(docs.num_documents):
        sentences = docs.sentence_range(document)
        chunk_start, chunk_length = sentences.start, 0
        target = _target_length(max_num_tokens, short_seq_prob, rng)
        for i in sentences:
            chunk_length += docs.sentence_length(i)
            if chunk_length < target and i + 1 < sentences.stop:
                continue
            tokens, starts = docs.tokens(chunk_start, i + 1)
            size = i + 1 - chunk_start
            if size >= 2:  # A = the chunk's first k sentences, k random, as for NSP
                a_end = chunk_start + rng.randint(1, size - 1)
                cut = int(docs.sentence_offsets[a_end] - docs.sentence_offsets[chunk_start])
            else:
                cut = len(tokens) // 2
            chunk_start, chunk_length = i + 1, 0
            target = _target_length(max_num_tokens, short_seq_prob, rng)
            if cut == 0:
                continue
            a, b = (tokens[:cut], starts[:cut] if starts is not None else None), \
                   (tokens[cut:], starts[cut:] if starts is not None else None)
            label = SWAPPED if rng.random() < 0.5 else IN_ORDER
            if label == SWAPPED:
                a, b = b, a
            keep_a, keep_b = truncate_seq_pair(len(a[0]), len(b[0]), max_num_tokens, rng)
            yield _pair_instance(a[0][keep_a], b[0][keep_b], None if a[1] is None else a[1][keep_a],
                                 None if b[1] is None else b[1][keep_b], label, cls_id, sep_id)


def create_packed_instances(docs: TokenizedDocuments, *, max_seq_len: int, cls_id: int,
                            sep_id: int, document_order: Sequence[int] | None = None
                            ) -> Iterator[Instance]:
    """FULL-SENTENCES instances: sentences packed in order, [SEP] between documents."""
    _check_max_seq_len(max_seq_len, minimum=3)
    budget = max_seq_len - 2  # [CLS] ... [SEP]
    pieces: list[tuple[np.ndarray, np.ndarray | None]] = []
    used = 0
    order = range(docs.num_documents) if document_order is None else document_order
    for n, document in enumerate(order):
        sentences = docs.sentence_range(document)
        for s in sentences:
            ids, starts = docs.tokens(s, s + 1)
            # The separator goes before a new document's first sentence, unless it opens a sequence.
            boundary = n > 0 and s == sentences.start and used > 0
            if used + boundary + len(ids) > budget and used > 0:
                yield _packed_instance(pieces, cls_id, sep_id)
                pieces, used, boundary = [], 0, False
            if boundary:
                pieces.append((np.array([sep_id], dtype=np.int64), _false(1, starts)))
                used += 1
            for lo in range(0, len(ids), budget):  # only a sentence longer than `budget` loops
                part = ids[lo:lo + budget]
                if used + len(part) > budget:
                    yield _packed_instance(pieces, cls_id, sep_id)
                    pieces, used = [], 0
                pieces.append((part, None if starts is None else starts[lo:lo + budget]))
                used += len(part)
    if used:
        yield _packed_instance(pieces, cls_id, sep_id)


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def _check_max_seq_len(max_seq_len: int, minimum: int) -> None:
    if max_seq_len < minimum:
        raise ValueError(f"max_seq_len {max_seq_len} leaves no room for text after the special "
                         f"tokens; use at least {minimum} (BERT uses 128 and 512)")


def _target_length(max_num_tokens: int, short_seq_prob: float, rng: random.Random) -> int:
    if rng.random() < short_seq_prob:
        return rng.randint(2, max_num_tokens)
    return max_num_tokens


def _random_segment(docs: TokenizedDocuments, document: int, target_length: int,
                    rng: random.Random) -> tuple[np.ndarray, np.ndarray | None]:
    """Sentences from a random other document, from a random start, until target_length tokens."""
    other = document
    for _ in range(10):  # with a single document there is no other; it is then reused
        other = rng.randint(0, docs.num_documents - 1)
        if other != document:
            break
    sentences = docs.sentence_range(other)
    first = rng.randint(sentences.start, sentences.stop - 1)
    end, length = first, 0
    while end < sentences.stop and (end == first or length < target_length):
        length += docs.sentence_length(end)
        end += 1
    return docs.tokens(first, end)


def _false(length: int, like: np.ndarray | None) -> np.ndarray | None:
    return None if like is None else np.zeros(length, dtype=bool)


def _pair_instance(a: np.ndarray, b: np.ndarray, starts_a: np.ndarray | None,
                   starts_b: np.ndarray | None, label: int, cls_id: int, sep_id: int) -> Instance:
    ids = np.concatenate([[cls_id], a, [sep_id], b, [sep_id]]).astype(np.int64)
    starts = None
    if starts_a is not None:
        no = np.zeros(1, dtype=bool)
        starts = np.concatenate([no, starts_a, no, starts_b, no])
    return Instance(input_ids=ids, segment_b_start=len(a) + 2, nsp_label=label, word_starts=starts)


def _packed_instance(pieces: list[tuple[np.ndarray, np.ndarray | None]], cls_id: int,
                     sep_id: int) -> Instance:
    ids = np.concatenate([[cls_id]] + [p for p, _ in pieces] + [[sep_id]]).astype(np.int64)
    starts = None
    if pieces and pieces[0][1] is not None:
        no = np.zeros(1, dtype=bool)
        starts = np.concatenate([no] + [s for _, s in pieces] + [no])
    return Instance(input_ids=ids, segment_b_start=len(ids), nsp_label=NO_NSP, word_starts=starts)
