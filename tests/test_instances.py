"""Pre-training instances: BERT's NSP recipe and RoBERTa's packing, on real and traceable data."""

from __future__ import annotations

import random

import numpy as np
import pytest

from bertkit.data.corpus import Corpus, load_corpus
from bertkit.data.instances import (
    IS_NEXT,
    NO_NSP,
    NOT_NEXT,
    TokenizedDocuments,
    create_instances_from_document,
    create_nsp_instances,
    create_packed_instances,
    tokenize_documents,
    truncate_seq_pair,
)
from bertkit.data.tokenizer import BertTokenizer
from bertkit.data.vocab import train_tokenizer

CLS, SEP = 1, 2
FIRST_ID = 10  # ids below are "special" in the traceable corpus


def traceable_docs(sentence_lengths: list[list[int]]) -> TokenizedDocuments:
    """Documents whose token ids are FIRST_ID + global position: each token tells where it is from."""
    lengths = [n for doc in sentence_lengths for n in doc]
    total = sum(lengths)
    return TokenizedDocuments(
        token_ids=np.arange(FIRST_ID, FIRST_ID + total, dtype=np.int32),
        sentence_offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        document_offsets=np.concatenate([[0], np.cumsum([len(d) for d in sentence_lengths])]
                                        ).astype(np.int64),
        word_starts=np.arange(total) % 3 == 0,
    )


def document_of(docs: TokenizedDocuments, token_ids: np.ndarray) -> np.ndarray:
    sentence = np.searchsorted(docs.sentence_offsets, token_ids - FIRST_ID, side="right") - 1
    return np.searchsorted(docs.document_offsets, sentence, side="right") - 1


@pytest.fixture(scope="module")
def bbc_docs(minilm_dir) -> tuple[TokenizedDocuments, BertTokenizer]:
    tokenizer = BertTokenizer.from_pretrained(minilm_dir)
    corpus = load_corpus("builtin:bbc-news")
    return tokenize_documents(corpus.documents[:500], tokenizer), tokenizer


def test_truncate_seq_pair_trims_the_longer_side_from_both_ends():
    rng = random.Random(0)
    fronts = backs = 0
    for _ in range(200):
        keep_a, keep_b = truncate_seq_pair(50, 10, 40, rng)
        assert (keep_a.stop - keep_a.start) + (keep_b.stop - keep_b.start) == 40
        assert keep_b == slice(0, 10)  # the shorter side is untouched
        fronts += keep_a.start > 0
        backs += keep_a.stop < 50
    assert fronts > 150 and backs > 150  # 20 cuts each time: both ends are used
    keep_a, keep_b = truncate_seq_pair(30, 30, 20, rng)
    assert keep_a.stop - keep_a.start == keep_b.stop - keep_b.start == 10  # equal sides alternate


def test_nsp_on_real_text_balanced_and_within_length(bbc_docs):
    """≥ 100k real tokens; IsNext share 50% ± 2 points (seed fixed; binomial sd ≈ 0.5 point)."""
    docs, tok = bbc_docs
    assert docs.num_tokens >= 100_000
    instances = list(create_nsp_instances(docs, max_seq_len=128, short_seq_prob=0.1,
                                          rng=random.Random(7), cls_id=tok.cls_token_id,
                                          sep_id=tok.sep_token_id))
    labels = np.array([inst.nsp_label for inst in instances])
    assert set(labels) == {IS_NEXT, NOT_NEXT}
    assert abs((labels == IS_NEXT).mean() - 0.5) < 0.02
    for inst in instances:
        ids = inst.input_ids
        assert len(ids) <= 128
        assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id
        first_sep = int(np.flatnonzero(ids == tok.sep_token_id)[0])
        assert first_sep >= 2 and first_sep < len(ids) - 2  # A and B both non-empty
        types = inst.token_type_ids
        # segment ids switch exactly after the first [SEP]
        assert types[:first_sep + 1].sum() == 0 and types[first_sep + 1:].all()
    lengths = np.array([len(inst.input_ids) for inst in instances])
    assert (lengths == 128).mean() > 0.6  # most instances fill the sequence
    assert ((lengths < 64).mean()) > 0.05  # short_seq_prob produces short ones


def test_nsp_segments_come_from_where_the_labels_say():
    rng = random.Random(3)
    sizes = [[rng.randint(3, 30) for _ in range(rng.randint(1, 12))] for _ in range(60)]
    docs = traceable_docs(sizes)
    seen = np.zeros(docs.num_tokens, dtype=bool)
    for d in range(docs.num_documents):
        for inst in create_instances_from_document(docs, d, max_seq_len=128, short_seq_prob=0.1,
                                                   rng=rng, cls_id=CLS, sep_id=SEP):
            a = inst.input_ids[1:inst.segment_b_start - 1]
            b = inst.input_ids[inst.segment_b_start:-1]
            assert (document_of(docs, a) == d).all()  # A is always this document's
            assert (np.diff(a) == 1).all() and (np.diff(b) == 1).all()  # contiguous text
            if inst.nsp_label == IS_NEXT:
                assert (document_of(docs, b) == d).all() and b[0] > a[-1]
            else:  # 60 documents: the random one is another document
                assert (document_of(docs, b) != d).all()
            seen[a - FIRST_ID] = True
            if inst.nsp_label == IS_NEXT:
                seen[b - FIRST_ID] = True
            # word starts travel with their tokens through truncation; specials are not starts
            expected = (inst.input_ids - FIRST_ID) % 3 == 0
            expected[inst.input_ids < FIRST_ID] = False
            assert (inst.word_starts == expected).all()
    # Unused sentences are put back: apart from truncation (~4% here), every token is used.
    assert seen.mean() > 0.93


def test_single_sentence_documents_force_not_next():
    docs = traceable_docs([[5], [6], [7]])
    for d in range(3):
        (inst,) = create_instances_from_document(docs, d, max_seq_len=32, short_seq_prob=0.0,
                                                 rng=random.Random(d), cls_id=CLS, sep_id=SEP)
        assert inst.nsp_label == NOT_NEXT


def test_packed_instances_keep_the_text_in_order():
    sizes = [[4, 9, 3], [12], [70, 2], [5, 5, 5, 5]]
    docs = traceable_docs(sizes)
    instances = list(create_packed_instances(docs, max_seq_len=32, cls_id=CLS, sep_id=SEP))
    text, boundaries = [], 0
    for inst in instances:
        assert len(inst.input_ids) <= 32
        assert inst.input_ids[0] == CLS and inst.input_ids[-1] == SEP
        assert inst.nsp_label == NO_NSP and not inst.token_type_ids.any()
        body = inst.input_ids[1:-1]
        boundaries += int((body == SEP).sum())
        assert body[0] != SEP and body[-1] != SEP  # a document separator never opens or closes
        text += [t for t in body if t != SEP]
        assert len(inst.word_starts) == len(inst.input_ids)
    assert text == list(docs.token_ids)  # nothing lost, nothing reordered (the 70 is cut up)
    assert boundaries >= 1
    with pytest.raises(ValueError, match="max_seq_len 2"):
        list(create_packed_instances(docs, max_seq_len=2, cls_id=CLS, sep_id=SEP))


def test_tokenize_documents_drops_empty_and_marks_chinese_words(tmp_path):
    tok_dir = tmp_path / "tok"
    train_tokenizer(Corpus.from_texts(["我喜欢机器学习。The unbelievable cat."] * 3), 60,
                    tok_dir, min_frequency=1)
    tok = BertTokenizer.from_pretrained(tok_dir)
    docs = tokenize_documents([["我喜欢机器学习。", ""], ["\u200b"], ["The bat."]], tok,
                              whole_word_mask=True)
    assert docs.num_documents == 2 and docs.num_sentences == 2  # empty ones are gone
    ids, starts = docs.tokens(0, 1)
    tokens = tok.convert_ids_to_tokens(ids)
    assert tokens == ["我", "喜", "欢", "机", "器", "学", "习", "。"]
    # jieba: 我 / 喜欢 / 机器 / 学习 / 。
    assert starts.tolist() == [True, True, False, True, False, True, False, True]
    ids, starts = docs.tokens(1, 2)
    assert tok.convert_ids_to_tokens(ids) == ["the", "b", "##a", "##t", "."]
    assert starts.tolist() == [True, True, False, False, True]  # "bat" is one word
