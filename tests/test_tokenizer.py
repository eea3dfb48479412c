"""BertTokenizer against transformers' BertTokenizerFast (the oracle) on real text and vocabularies."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch

from bertkit.data.corpus import Corpus, load_corpus
from bertkit.data.tokenizer import SPECIAL_TOKENS, BertTokenizer
from bertkit.data.vocab import train_tokenizer

transformers = pytest.importorskip("transformers")

KEYS = ("input_ids", "token_type_ids", "attention_mask")


@pytest.fixture(scope="module")
def bbc_sentences() -> list[str]:
    corpus = load_corpus("builtin:bbc-news")
    sentences = [s for doc in corpus.documents[::10] for s in doc]
    return random.Random(0).sample(sentences, 240)


@pytest.fixture(scope="module")
def zh_tokenizer_dir(tmp_path_factory) -> Path:
    """A WordPiece vocabulary freshly trained on part of People's Daily."""
    corpus = load_corpus("builtin:peoples-daily")
    out = tmp_path_factory.mktemp("zh-tokenizer")
    train_tokenizer(Corpus.from_documents(corpus.documents[:1500]), 6000, out)
    return out


@pytest.fixture(scope="module")
def zh_sentences() -> list[str]:
    corpus = load_corpus("builtin:peoples-daily")
    # The last documents: not part of the training slice above; they hold digits and Latin too.
    return [s for doc in corpus.documents[-120:] for s in doc][:300]


def _assert_same(ours: dict, theirs, offsets: bool) -> None:
    for key in KEYS:
        assert ours[key] == theirs[key], key
    if offsets:
        assert [[tuple(span) for span in row] for row in ours["offset_mapping"]] == \
            [[tuple(span) for span in row] for row in theirs["offset_mapping"]]


@pytest.mark.parametrize("settings", [
    {"max_length": 512, "padding": True},
    {"max_length": 24, "padding": "max_length"},
    {"max_length": 40, "padding": True},
])
def test_parity_with_bert_tokenizer_fast_on_minilm(minilm_dir, bbc_sentences, settings):
    ours = BertTokenizer.from_pretrained(minilm_dir)
    theirs = transformers.BertTokenizerFast.from_pretrained(minilm_dir)
    firsts, seconds = bbc_sentences[:120], bbc_sentences[120:]
    for pair in (None, seconds):
        mine = ours(firsts, pair, truncation=True, return_offsets=True, return_tensors=None,
                    **settings)
        ref = theirs(firsts, pair, truncation=True, return_offsets_mapping=True, **settings)
        _assert_same(mine, ref, offsets=True)


def test_parity_on_trained_chinese_vocab(zh_tokenizer_dir, zh_sentences):
    ours = BertTokenizer.from_pretrained(zh_tokenizer_dir)
    theirs = transformers.BertTokenizerFast.from_pretrained(zh_tokenizer_dir)
    for settings in ({"max_length": 64, "padding": True}, {"max_length": 512, "padding": True}):
        mine = ours(zh_sentences, truncation=True, return_offsets=True, return_tensors=None,
                    **settings)
        ref = theirs(zh_sentences, truncation=True, return_offsets_mapping=True, **settings)
        _assert_same(mine, ref, offsets=True)
    pairs = ours(zh_sentences[:50], zh_sentences[50:100], max_length=48, return_tensors=None)
    _assert_same(pairs, theirs(zh_sentences[:50], zh_sentences[50:100], max_length=48,
                               truncation=True, padding=True), offsets=False)


def test_trained_vocab_layout(zh_tokenizer_dir):
    vocab = (zh_tokenizer_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert vocab[:5] == list(SPECIAL_TOKENS)  # [PAD] = 0 as in released BERT vocabularies
    tokenizer = BertTokenizer.from_pretrained(zh_tokenizer_dir)
    assert (tokenizer.pad_token_id, tokenizer.unk_token_id, tokenizer.cls_token_id,
            tokenizer.sep_token_id, tokenizer.mask_token_id) == (0, 1, 2, 3, 4)
    assert tokenizer.special_ids == frozenset(range(5))
    # CJK characters are one token each.
    assert tokenizer.tokenize("中国人民") == ["中", "国", "人", "民"]


def test_vocab_txt_only_directory(tmp_path, minilm_dir, bbc_sentences):
    shutil.copy(minilm_dir / "vocab.txt", tmp_path / "vocab.txt")
    ours = BertTokenizer.from_pretrained(tmp_path)
    theirs = transformers.BertTokenizerFast.from_pretrained(tmp_path)
    _assert_same(ours(bbc_sentences[:60], max_length=64, return_tensors=None),
                 theirs(bbc_sentences[:60], max_length=64, truncation=True, padding=True),
                 offsets=False)
    # Same encoding as the full directory, hence the same fingerprint; a vocab.txt path works too.
    full = BertTokenizer.from_pretrained(minilm_dir)
    assert ours.fingerprint() == full.fingerprint()
    assert BertTokenizer.from_pretrained(tmp_path / "vocab.txt").fingerprint() == full.fingerprint()


def test_config_overrides_lowercase_like_the_reference(tmp_path, minilm_dir):
    for name in ("vocab.txt", "tokenizer.json"):
        shutil.copy(minilm_dir / name, tmp_path / name)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    ours = BertTokenizer.from_pretrained(tmp_path)
    theirs = transformers.BertTokenizerFast.from_pretrained(tmp_path)
    text = "Hello World, Café au lait in Zürich"
    assert not ours.do_lower_case
    assert ours.tokenize(text) == theirs.tokenize(text)
    assert ours.fingerprint() != BertTokenizer.from_pretrained(minilm_dir).fingerprint()


def test_save_pretrained_round_trip(tmp_path, minilm_dir, bbc_sentences):
    original = BertTokenizer.from_pretrained(minilm_dir)
    original(bbc_sentences[:4], max_length=8, padding="max_length")  # leaves backend state set
    original.save_pretrained(tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == {"vocab.txt", "tokenizer.json",
                                                    "tokenizer_config.json",
                                                    "special_tokens_map.json"}
    saved = json.loads((tmp_path / "tokenizer.json").read_text())
    assert saved["truncation"] is None and saved["padding"] is None
    reloaded = BertTokenizer.from_pretrained(tmp_path)
    theirs = transformers.BertTokenizerFast.from_pretrained(tmp_path)
    assert reloaded.fingerprint() == original.fingerprint()
    _assert_same(reloaded(bbc_sentences, max_length=128, return_tensors=None),
                 theirs(bbc_sentences, max_length=128, truncation=True, padding=True),
                 offsets=False)


def test_encode_tensors_and_decode(minilm_dir):
    tok = BertTokenizer.from_pretrained(minilm_dir)
    batch = tok(["The cat sat.", "A much longer sentence about the dog."], ["Yes.", "No."])
    assert set(batch) == set(KEYS)
    shape = batch["input_ids"].shape
    assert all(v.dtype == torch.long and v.shape == shape for v in batch.values())
    row = batch["input_ids"][0].tolist()
    assert row[0] == tok.cls_token_id and row.count(tok.sep_token_id) == 2
    assert batch["attention_mask"][0].sum() < batch["attention_mask"].shape[1]  # padded row
    assert tok.decode(batch["input_ids"][1]) == "a much longer sentence about the dog. no."
    enc = tok.encode("unbelievably good", "yes")
    assert enc.tokens[:3] == ["[CLS]", "un", "##bel"]
    assert enc.word_ids[1:4] == [0, 0, 0] and enc.sequence_ids[-2] == 1
    assert tok.convert_tokens_to_ids(["[MASK]", "no-such-token"]) == [tok.mask_token_id,
                                                                       tok.unk_token_id]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.convert_ids_to_tokens([tok.vocab_size + 5])


def test_train_tokenizer_refuses_to_overwrite(tmp_path):
    corpus = Corpus.from_texts(["the cat sat on the mat. the dog sat too."] * 20)
    train_tokenizer(corpus, 60, tmp_path)
    with pytest.raises(FileExistsError, match="--overwrite"):
        train_tokenizer(corpus, 60, tmp_path)
    train_tokenizer(corpus, 60, tmp_path, overwrite=True, lowercase=False)
    assert not BertTokenizer.from_pretrained(tmp_path).do_lower_case


def test_clear_errors(tmp_path, minilm_dir):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        BertTokenizer.from_pretrained(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="no tokenizer.json or vocab.txt"):
        BertTokenizer.from_pretrained(tmp_path)
    tok = BertTokenizer.from_pretrained(minilm_dir)
    with pytest.raises(ValueError, match="empty list"):
        tok([])
    with pytest.raises(ValueError, match="texts\\[1\\] is a NoneType"):
        tok(["fine", None])
    with pytest.raises(ValueError, match="different lengths"):
        tok(["short", "a somewhat longer text"], padding=False)
    (tmp_path / "vocab.txt").write_text("a\nb\n")
    with pytest.raises(ValueError, match="the vocabulary has no"):
        BertTokenizer.from_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="Corpus.from_texts"):
        train_tokenizer("just some text I meant to train on", 100, tmp_path / "out")
