"""Named-entity recognition: CoNLL / JSONL reading, tag schemes, word-piece alignment, stitching.

Files:
- CoNLL: one token per line, `token<TAB>tag` (or space-separated columns: the first is the token,
  the last the tag), a blank line between sentences; `-DOCSTART-` lines are ignored.
- JSONL: one sentence per line, `{"tokens": [...], "tags": [...]}` (key names configurable).
Tags are BIO or BIOES (`B-PER`, `I-PER`, `E-PER`, `S-PER`, `O`); the scheme of a file is BIOES when
any E-/S- tag occurs. A sentence whose tag sequence breaks its scheme (e.g. `I-PER` after `O`) is
reported with file and line and skipped, or, with `invalid="repair"`, rewritten the way conlleval
reads it (a stray `I-X` opens an entity) — the reading for IOB1 files such as CoNLL-2003's original.

Alignment: every word is cut into word pieces; its first piece carries the word's label, the
others -100, so each word is predicted once, from its first piece.

Long sentences: pieces are cut into overlapping windows; each word is predicted from the window
where its first piece has the most context (max of the min distance to a window edge), the rule
BERT's SQuAD code uses for answer starts (`max_context_owner`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from bertkit.constants import IGNORE_INDEX
from bertkit.data.formats.common import WordPieces, known_label_order, max_context_owner, window_spans
from bertkit.data.report import DataReport
from bertkit.data.rows import read_rows, text_lines
from bertkit.data.scoring import get_entities, split_tag

SCHEMES = ("BIO", "BIOES")


@dataclass
class NerSentence:
    """`words` and their `tags` (None when unlabelled), `where` = file:line of the first word."""

    words: list[str]
    tags: list[str] | None
    where: str = ""


# ---------------------------------------------------------------------------------------------
# tag schemes
# ---------------------------------------------------------------------------------------------
def detect_scheme(sentences: Sequence[NerSentence]) -> str:
    """"BIOES" when any E- or S- tag occurs, else "BIO"."""
    for s in sentences:
        for tag in s.tags or ():
            if tag[:2] in ("E-", "S-"):
                return "BIOES"
    return "BIO"


def malformed_tag(tags: Sequence[str], scheme: str) -> str | None:
    """A message for the first tag that is not a tag of `scheme` at all; None when all are."""
    for i, tag in enumerate(tags):
        try:
            prefix, _ = split_tag(tag)
        except ValueError as err:
            return f"word {i + 1}: {err}"
        if scheme == "BIO" and prefix in ("E", "S"):
            return f"word {i + 1}: tag {tag!r} is BIOES but the file is BIO"
    return None


def tag_problem(tags: Sequence[str], scheme: str) -> str | None:
    """The first break of `scheme`'s sequence rules, as a message; None when valid.

    Tags must be well formed (`malformed_tag`). BIO: I-X must follow B-X or I-X. BIOES as well:
    B-X and I-X must be followed by I-X or E-X, E-X must follow B-X or I-X, S-X stands alone.
    """
    prev, prev_type = "O", ""
    for i, tag in enumerate(list(tags) + ["O"]):
        cur, kind = split_tag(tag)
        continues = cur in ("I", "E")
        if continues and not (prev in ("B", "I") and prev_type == kind):
            after = f"after {tags[i - 1]!r}" if i else "at the start"
            return f"word {i + 1}: {tag!r} {after} does not continue an entity"
        if scheme == "BIOES" and prev in ("B", "I") and not (continues and prev_type == kind):
            return f"word {i}: {tags[i - 1]!r} is not closed by I-/E-{prev_type}"
        prev, prev_type = cur, kind
    return None


def repair_tags(tags: Sequence[str], scheme: str) -> list[str]:
    """Rewrite tags in `scheme` from the entities conlleval reads in them."""
    return tags_from_entities([(e.type, e.start, e.end) for e in get_entities(tags)], len(tags), scheme)


def tags_from_entities(entities: Sequence[tuple[str, int, int]], length: int, scheme: str) -> list[str]:
    """Tags of `length` words carrying (type, start, end) entities, in BIO or BIOES."""
    tags = ["O"] * length
    for kind, start, end in entities:
        if scheme == "BIOES" and end - start == 1:
            tags[start] = f"S-{kind}"
            continue
        tags[start] = f"B-{kind}"
        for i in range(start + 1, end):
            tags[i] = f"I-{kind}"
        if scheme == "BIOES":
            tags[end - 1] = f"E-{kind}"
    return tags


def label_names(sentences: Sequence[NerSentence], scheme: str,
                known: dict[str, int] | None = None) -> list[str]:
    """The head's labels: "O", then for each entity type (sorted) B-, I- (and E-, S- for BIOES).

    Every prefix is included even when the data lack one (a type seen only as single words still
    gets I-), so the label set depends on the types alone. A model's own label2id is reused when
    it covers them.
    """
    types = sorted({split_tag(t)[1] for s in sentences for t in s.tags or () if t != "O"})
    prefixes = ("B", "I") if scheme == "BIO" else ("B", "I", "E", "S")
    names = ["O"] + [f"{p}-{t}" for t in types for p in prefixes]
    return known_label_order(set(names), known) or names


# ---------------------------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------------------------
def read_ner(path: str | os.PathLike, *, labelled: bool = True, tokens_key: str = "tokens",
             tags_key: str = "tags", invalid: str = "skip",
             scheme: str | None = None) -> tuple[list[NerSentence], DataReport, str]:
    """Read a CoNLL (any suffix but .jsonl/.json) or JSONL NER file.

    labelled: tags are required (False: only words are read; a CoNLL file may then have one column).
    invalid: "skip" a sentence whose tags break the scheme, or "repair" it (conlleval reading).
    scheme: "BIO" / "BIOES", or None to detect it from the file.
    Returns (sentences, report, scheme). Bad sentences are reported (file:line) and skipped;
    ValueError when none is usable.
    """
    if invalid not in ("skip", "repair"):
        raise ValueError(f"invalid must be 'skip' or 'repair', got {invalid!r}")
    path = Path(path)
    report = DataReport(str(path))
    if path.suffix.lower() in (".jsonl", ".json"):
        raw = list(_read_jsonl(path, report, labelled, tokens_key, tags_key))
    else:
        raw = list(conll_sentences(path, report, labelled=labelled))
    # Readers yield sentences and (where, problem) pairs in file order, so the report keeps it
    # (rows that are not JSON at all are reported by the row reader as it goes).
    scheme = scheme or detect_scheme([s for s in raw if isinstance(s, NerSentence)])
    if scheme not in SCHEMES:
        raise ValueError(f"unknown tag scheme {scheme!r}; use BIO or BIOES")
    sentences = []
    for sentence in raw:
        if not isinstance(sentence, NerSentence):
            report.skip(*sentence)
            continue
        if sentence.tags is not None:
            problem = malformed_tag(sentence.tags, scheme)
            if problem:
                report.skip(sentence.where, problem)
                continue
            problem = tag_problem(sentence.tags, scheme)
            if problem and invalid == "repair":
                sentence.tags = repair_tags(sentence.tags, scheme)
            elif problem:
                report.skip(sentence.where, f"{problem}; fix the tags or pass --ner-invalid repair "
                                            "to read them as conlleval does")
                continue
        sentences.append(sentence)
    report.n_kept = len(sentences)
    report.require_rows()
    return sentences, report, scheme


def conll_sentences(path: str | os.PathLike, report: DataReport, *, labelled: bool,
                    encoding: str = "refuse") -> Iterator[NerSentence | tuple[str, str]]:
    """The sentences of a CoNLL file, streamed: a NerSentence each, or (where, problem) for a
    sentence that cannot be read (an empty token; no tag column when `labelled`)."""
    words, tags, start, bad = [], [], 0, None

    def flush():
        if words and bad:
            return f"{path}:{start}", bad
        if words:
            return NerSentence(list(words), list(tags) if labelled else None, f"{path}:{start}")
        return None

    for line_no, line in text_lines(path, report, encoding=encoding):
        line = line.rstrip("\r\n")
        if not line.strip() or line.startswith("-DOCSTART-"):
            sentence = flush()
            if sentence:
                yield sentence
            words, tags, bad = [], [], None
            continue
        columns = line.split("\t") if "\t" in line else line.split()
        columns = [c.strip() for c in columns]
        if not words:
            start = line_no
        if not columns[0]:
            bad = bad or f"line {line_no} has an empty token"
        elif labelled and len(columns) < 2:
            bad = bad or (f"line {line_no} has no tag column (expected token<TAB>tag)")
        words.append(columns[0])
        tags.append(columns[-1] if len(columns) > 1 else "O")
    sentence = flush()
    if sentence:
        yield sentence


def _read_jsonl(path: Path, report: DataReport, labelled: bool, tokens_key: str, tags_key: str):
    for line_no, row in read_rows(path, report, fmt="jsonl"):
        where = f"{path}:{line_no}"
        words, tags = row.get(tokens_key), row.get(tags_key)
        if not isinstance(words, list) or (labelled and not isinstance(tags, list)):
            wanted = f"{tokens_key!r}" + (f" and {tags_key!r}" if labelled else "")
            yield where, (f"expected an object with list fields {wanted}; name the keys "
                          "with --tokens-key / --tags-key")
            continue
        if not words:
            yield where, "empty sentence"
            continue
        if labelled and len(tags) != len(words):
            yield where, f"{len(words)} tokens but {len(tags)} tags"
            continue
        if any(not str(w).strip() for w in words):
            yield where, "a token is empty"
            continue
        yield NerSentence([str(w) for w in words], [str(t) for t in tags] if labelled else None, where)


# ---------------------------------------------------------------------------------------------
# features and stitching
# ---------------------------------------------------------------------------------------------
@dataclass
class NerEncoded:
    """Features of a list of sentences and what maps their outputs back to words.

    features: input_ids, token_type_ids, example (sentence index), span ([start, end) of the
      sentence's pieces in this window), labels (when labelled; -100 off first pieces).
    first_piece[i][w]: position of word w's first piece in sentence i (None: the word has no pieces,
      e.g. a lone control character; it is predicted "O").
    n_pieces[i]: number of pieces of sentence i.
    """

    features: list[dict[str, Any]]
    first_piece: list[list[int | None]]
    n_pieces: list[int]
    n_words_without_pieces: int = 0


def ner_features(sentences: Sequence[NerSentence], pieces: WordPieces, max_length: int, *,
                 label2id: dict[str, int] | None = None, stride: int | None = None) -> NerEncoded:
    """Windows of [CLS] pieces [SEP], at most `max_length` long, `stride` pieces apart (default
    half a window); with `label2id`, labels on each word's first piece and -100 elsewhere."""
    budget = max_length - 2
    if budget < 1:
        raise ValueError(f"max_length {max_length} leaves no room for words; use at least 3")
    stride = stride or max(1, budget // 2)
    encodings = pieces.encode_words([s.words for s in sentences])
    out = NerEncoded([], [], [])
    for i, (sentence, enc) in enumerate(zip(sentences, encodings)):
        first: list[int | None] = [None] * len(sentence.words)
        piece_labels = [IGNORE_INDEX] * len(enc.ids)
        for p, w in enumerate(enc.word_ids):
            if w is not None and first[w] is None:
                first[w] = p
                if label2id is not None:
                    piece_labels[p] = _label_id(sentence, w, label2id)
        out.n_words_without_pieces += sum(f is None for f in first)
        out.first_piece.append(first)
        out.n_pieces.append(len(enc.ids))
        for start, end in window_spans(len(enc.ids), budget, stride):
            feature = {
                "input_ids": [pieces.cls_id] + enc.ids[start:end] + [pieces.sep_id],
                "token_type_ids": [0] * (end - start + 2),
                "example": i,
                "span": (start, end),
            }
            if label2id is not None:
                feature["labels"] = [IGNORE_INDEX] + piece_labels[start:end] + [IGNORE_INDEX]
            out.features.append(feature)
    return out


def _label_id(sentence: NerSentence, word: int, label2id: dict[str, int]) -> int:
    tag = sentence.tags[word]
    if tag not in label2id:
        raise ValueError(f"{sentence.where}: tag {tag!r} was not in the training data (known: "
                         f"{', '.join(sorted(label2id))}); add training sentences with this tag "
                         "or remove the sentence")
    return label2id[tag]


def word_logits(logits: Sequence[torch.Tensor], encoded: NerEncoded) -> list[torch.Tensor | None]:
    """Per-word logits (W_i, C) of every sentence from per-window logits (None: no words).

    logits: one (T_f, C) float tensor per feature (T_f = its length incl. [CLS] and [SEP]).
    Each word takes the logits at its first piece, read from the window that gives that piece
    the most context; a word without pieces gets zeros (uniform).
    """
    by_sentence: dict[int, list[int]] = {}
    for f, feature in enumerate(encoded.features):
        by_sentence.setdefault(feature["example"], []).append(f)
    out: list[torch.Tensor | None] = []
    for i, first in enumerate(encoded.first_piece):
        feats = by_sentence.get(i, [])
        if not first or not feats:
            out.append(None)
            continue
        spans = [encoded.features[f]["span"] for f in feats]
        owner = max_context_owner(spans, encoded.n_pieces[i])
        rows = []
        for p in first:
            if p is None:
                rows.append(logits[feats[0]].new_zeros(logits[feats[0]].shape[-1]))
                continue
            f = feats[owner[p]]
            rows.append(logits[f][p - encoded.features[f]["span"][0] + 1])  # +1: [CLS] comes first
        out.append(torch.stack(rows))
    return out


def stitch_predictions(logits: Sequence[torch.Tensor], encoded: NerEncoded,
                       id2label: dict[int, str]) -> list[list[str]]:
    """Per-word tags of every sentence (the argmax of `word_logits`; words without pieces "O")."""
    out = []
    for first, rows in zip(encoded.first_piece, word_logits(logits, encoded)):
        tags = [] if rows is None else [id2label[int(k)] for k in rows.argmax(-1)]
        out.append(["O" if p is None else tag for p, tag in zip(first, tags)])
    return out


def allowed_transitions(names: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Which tag may follow which in a valid BIO / BIOES sequence, as additive score masks.

    Returns (transitions (C, C): [prev, cur] = 0 where allowed, -inf where not; start (C,);
    end (C,)). I-X (and E-X) continue only B-X or I-X; in BIOES, B-X and I-X must be continued,
    so they can neither end a sentence nor be followed by O, B-, S- or another type.
    Tags without a B/I/E/S prefix (O, or plain IO names) are free.
    """
    parts = [_tag_parts(n) for n in names]
    bioes = any(kind in ("E", "S") for kind, _ in parts)
    n = len(names)
    trans = torch.zeros(n, n)
    start = torch.zeros(n)
    end = torch.zeros(n)
    inf = float("-inf")
    for c, (kind, typ) in enumerate(parts):
        if kind in ("I", "E"):
            start[c] = inf
            for p, (pkind, ptyp) in enumerate(parts):
                if not (pkind in ("B", "I") and ptyp == typ):
                    trans[p, c] = inf
        elif bioes:
            for p, (pkind, _) in enumerate(parts):
                if pkind in ("B", "I"):
                    trans[p, c] = inf
        if bioes and kind in ("B", "I"):
            end[c] = inf
    return trans, start, end


def _tag_parts(name: str) -> tuple[str, str]:
    try:
        return split_tag(name)
    except ValueError:
        return "O", ""  # not a B/I/E/S tag: no constraint


def constrained_decode(log_probs: torch.Tensor, names: Sequence[str]) -> list[str]:
    """The most probable valid tag sequence (Viterbi under `allowed_transitions`).

    log_probs: (W, C) per-word log-probabilities. Unlike a per-word argmax, the result never has
    an I-X without its B-X, so every entity is a well-formed span.
    """
    trans, start, end = allowed_transitions(names)
    score = log_probs[0] + start  # (C,)
    back = []
    for w in range(1, log_probs.shape[0]):
        total = score[:, None] + trans  # (C_prev, C)
        score, best_prev = total.max(0)  # (C,)
        score = score + log_probs[w]
        back.append(best_prev)
    tag = int((score + end).argmax())
    path = [tag]
    for best_prev in reversed(back):
        tag = int(best_prev[tag])
        path.append(tag)
    return [names[t] for t in reversed(path)]


# ---------------------------------------------------------------------------------------------
# words and entities with character offsets
# ---------------------------------------------------------------------------------------------
@dataclass
class WordSplit:
    """Words of a raw text as the tokenizer splits them, with their [start, end) character spans."""

    text: str
    words: list[str] = field(default_factory=list)
    offsets: list[tuple[int, int]] = field(default_factory=list)


def split_words(pieces: WordPieces, texts: Sequence[str]) -> list[WordSplit]:
    """Split raw texts into the tokenizer's words (whitespace, punctuation, single CJK characters)."""
    out = []
    for text, enc in zip(texts, pieces.encode(texts)):
        spans: dict[int, list[int]] = {}
        for w, (s, e) in zip(enc.word_ids, enc.offsets):
            if w is None:
                continue
            span = spans.setdefault(w, [s, e])
            span[0], span[1] = min(span[0], s), max(span[1], e)
        split = WordSplit(text)
        for w in sorted(spans):
            s, e = spans[w]
            split.words.append(text[s:e])
            split.offsets.append((s, e))
        out.append(split)
    return out


def join_words(words: Sequence[str]) -> WordSplit:
    """A text for pre-split words: joined with nothing when every word is one character (Chinese
    character-level data), else with single spaces; offsets point into that text."""
    sep = "" if all(len(w) == 1 for w in words) else " "
    split = WordSplit(sep.join(words))
    pos = 0
    for w in words:
        split.words.append(w)
        split.offsets.append((pos, pos + len(w)))
        pos += len(w) + len(sep)
    return split


def entities_with_offsets(tags: Sequence[str], split: WordSplit) -> list[dict[str, Any]]:
    """Entities of one sentence as dicts: type, text, start / end (character offsets in
    `split.text`, end exclusive), word_start / word_end (word indices, end exclusive)."""
    out = []
    for e in get_entities(tags):
        s, t = split.offsets[e.start][0], split.offsets[e.end - 1][1]
        out.append({"type": e.type, "text": split.text[s:t], "start": s, "end": t,
                    "word_start": e.start, "word_end": e.end})
    return out
