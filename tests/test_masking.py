"""MLM masking: BERT's rates on real text, whole words, and masks that depend on the key only."""

from __future__ import annotations

import random

import numpy as np
import pytest

from bertkit.data.corpus import Corpus, load_corpus
from bertkit.data.instances import create_nsp_instances, tokenize_documents
from bertkit.data.masking import (
    IGNORE_INDEX,
    MASKED,
    NOT_SELECTED,
    RANDOM,
    UNCHANGED,
    default_max_predictions,
    mask_demo,
    mask_keys,
    mask_tokens,
)
from bertkit.data.shards import collate
from bertkit.data.tokenizer import BertTokenizer
from bertkit.data.vocab import train_tokenizer


def _batch(documents, tokenizer, whole_word_mask, max_seq_len=128):
    """Real NSP instances, padded into one (B, T) batch, with their special-token mask."""
    docs = tokenize_documents(documents, tokenizer, whole_word_mask=whole_word_mask)
    instances = list(create_nsp_instances(docs, max_seq_len=max_seq_len, short_seq_prob=0.1,
                                          rng=random.Random(0), cls_id=tokenizer.cls_token_id,
                                          sep_id=tokenizer.sep_token_id))
    batch = collate(instances, pad_id=tokenizer.pad_token_id, max_seq_len=max_seq_len)
    special = np.isin(batch["input_ids"], list(tokenizer.special_ids))
    special |= batch["attention_mask"] == 0
    return batch, special


@pytest.fixture(scope="module")
def english(minilm_dir):
    tokenizer = BertTokenizer.from_pretrained(minilm_dir)
    documents = load_corpus("builtin:bbc-news").documents[:500]
    return tokenizer, documents


@pytest.fixture(scope="module")
def chinese(tmp_path_factory):
    documents = load_corpus("builtin:peoples-daily").documents
    out = tmp_path_factory.mktemp("zh-tok")
    tokenizer = train_tokenizer(Corpus.from_documents(documents[:800]), 5000, out)
    return tokenizer, documents[800:1300]


def _mask(batch, special, tokenizer, *, seed=0, epoch=0, word_starts=None, **kwargs):
    replacement = np.setdiff1d(np.arange(tokenizer.vocab_size), list(tokenizer.special_ids))
    keys = mask_keys(seed, epoch, np.arange(len(batch["input_ids"])))
    return mask_tokens(batch["input_ids"], special, keys, mask_token_id=tokenizer.mask_token_id,
                       replacement_ids=replacement, word_starts=word_starts, **kwargs)


def test_rates_on_real_text(english):
    """Over ≥ 100k real tokens: selection 15% ± 0.5 point, 80/10/10 ± 1 point (seed fixed)."""
    tokenizer, documents = english
    batch, special = _batch(documents, tokenizer, whole_word_mask=False)
    real = ~special
    assert real.sum() >= 100_000
    out = _mask(batch, special, tokenizer, max_predictions=default_max_predictions(128))
    selected = out.labels != IGNORE_INDEX
    assert abs(selected.sum() / real.sum() - 0.15) < 0.005
    assert not (selected & special).any()  # never [CLS], [SEP], [PAD], padding
    kinds = out.kinds[selected]
    assert abs((kinds == MASKED).mean() - 0.8) < 0.01
    assert abs((kinds == RANDOM).mean() - 0.1) < 0.01
    assert abs((kinds == UNCHANGED).mean() - 0.1) < 0.01
    assert (out.kinds[~selected] == NOT_SELECTED).all()
    original = batch["input_ids"]
    assert (out.labels[selected] == original[selected]).all()
    assert (out.input_ids[out.kinds == MASKED] == tokenizer.mask_token_id).all()
    assert (out.input_ids[out.kinds == UNCHANGED] == original[out.kinds == UNCHANGED]).all()
    assert (out.input_ids[~selected] == original[~selected]).all()
    replaced = out.input_ids[out.kinds == RANDOM]
    assert not np.isin(replaced, list(tokenizer.special_ids)).any()
    assert len(np.unique(replaced)) > 0.8 * len(replaced)  # spread over the vocabulary
    assert (selected.sum(axis=1) <= default_max_predictions(128)).all()


def test_max_predictions_caps_each_row(english):
    tokenizer, documents = english
    batch, special = _batch(documents[:40], tokenizer, whole_word_mask=False)
    out = _mask(batch, special, tokenizer, mlm_probability=0.5, max_predictions=7)
    counts = (out.labels != IGNORE_INDEX).sum(axis=1)
    assert counts.max() == 7 and counts.min() >= 1


def _assert_whole_words(out, batch, special):
    """Every word (a start flag and the non-start tokens after it) is selected entirely or not."""
    selected = out.labels != IGNORE_INDEX
    starts = batch["word_starts"] | np.roll(special, 1, axis=1)
    groups = np.cumsum(starts, axis=1)
    words = 0
    for row in range(len(selected)):
        real = ~special[row]
        for g in np.unique(groups[row][real & selected[row]]):
            members = real & (groups[row] == g)
            assert selected[row][members].all()
            words += members.sum() > 1
    return words


def test_whole_word_masking_english(english):
    tokenizer, documents = english
    batch, special = _batch(documents[:250], tokenizer, whole_word_mask=True)
    out = _mask(batch, special, tokenizer, word_starts=batch["word_starts"],
                max_predictions=default_max_predictions(128))
    assert _assert_whole_words(out, batch, special) > 100  # multi-piece words were chosen whole
    rate = (out.labels != IGNORE_INDEX).sum() / (~special).sum()
    assert abs(rate - 0.15) < 0.01  # smaller words fill the budget a big one would overshoot


def test_whole_word_masking_chinese_follows_jieba(chinese):
    tokenizer, documents = chinese
    batch, special = _batch(documents, tokenizer, whole_word_mask=True)
    assert (~special).sum() > 50_000
    out = _mask(batch, special, tokenizer, word_starts=batch["word_starts"],
                max_predictions=default_max_predictions(128))
    assert _assert_whole_words(out, batch, special) > 1000  # 喜欢, 机器 ... masked together
    rate = (out.labels != IGNORE_INDEX).sum() / (~special).sum()
    assert abs(rate - 0.15) < 0.01


def test_mask_depends_on_key_only(english):
    """The same instance gets the same mask alone or in a batch, whatever the padding; a new epoch
    or seed gives a new one."""
    tokenizer, documents = english
    batch, special = _batch(documents[:30], tokenizer, whole_word_mask=False)
    replacement = np.setdiff1d(np.arange(tokenizer.vocab_size), list(tokenizer.special_ids))
    keys = mask_keys(5, 2, np.arange(100, 100 + len(batch["input_ids"])))
    common = dict(mask_token_id=tokenizer.mask_token_id, replacement_ids=replacement)
    full = mask_tokens(batch["input_ids"], special, keys, **common)
    row = 3
    length = int(batch["attention_mask"][row].sum())
    wider_ids = np.pad(batch["input_ids"][row:row + 1, :length], ((0, 0), (0, 40)))
    wider_special = np.pad(special[row:row + 1, :length], ((0, 0), (0, 40)), constant_values=True)
    alone = mask_tokens(wider_ids, wider_special, keys[row:row + 1], **common)
    assert (alone.labels[0, :length] == full.labels[row, :length]).all()
    assert (alone.input_ids[0, :length] == full.input_ids[row, :length]).all()
    other_epoch = mask_tokens(batch["input_ids"], special,
                              mask_keys(5, 3, np.arange(100, 100 + len(keys))), **common)
    other_seed = mask_tokens(batch["input_ids"], special,
                             mask_keys(6, 2, np.arange(100, 100 + len(keys))), **common)
    assert (other_epoch.labels != full.labels).any() and (other_seed.labels != full.labels).any()


def test_mask_demo(minilm_dir):
    demo = mask_demo("The quick brown fox jumps over the lazy dog near the riverbank today.",
                     minilm_dir, seed=1)
    assert demo.tokens[0] == "[CLS]" and demo.tokens[-1] == "[SEP]"
    assert len(demo.predictions) == round((len(demo.tokens) - 2) * 0.15)
    for p in demo.predictions:
        assert demo.tokens[p.position] == p.original and demo.masked_tokens[p.position] == p.shown
        assert p.kind == "[MASK]" if p.shown == "[MASK]" else p.kind in ("random", "unchanged")
    assert "position" in demo.format()
    chinese = mask_demo("我喜欢机器学习，也喜欢自然语言处理。", seed=0, whole_word_mask=True)
    assert chinese.tokens[1:4] == ["我", "喜", "欢"]  # a vocabulary of the text's own characters
    assert mask_demo("我喜欢机器学习", seed=4).predictions != []
    with pytest.raises(ValueError, match="non-empty"):
        mask_demo("   ")
