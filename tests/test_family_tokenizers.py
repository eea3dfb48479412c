"""The families' tokenizers give transformers' ids: RoBERTa's byte-level BPE (vocab.json +
merges.txt, or tokenizer.json), ALBERT's Unigram through tokenizer.json or spiece.model,
XLM-RoBERTa's and CamemBERT's SentencePiece Unigram tokenizer.json, DistilBERT's WordPiece.

Every vocabulary is trained here with `tokenizers` on a few sentences: nothing downloads.
"""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from bertkit.data.tokenizer import BertTokenizer

from family_fixtures import albert_tokenizer_dir, sentencepiece_tokenizer_dir

transformers = pytest.importorskip("transformers")

CORPUS = ["The quick brown fox jumps over the lazy dog.", "Hello world, hello tokenizers!",
          "Byte-level BPE handles accents: café, naïve, Zürich.", "Numbers 12345 and symbols #@%&.",
          "Sentence order prediction swaps two consecutive segments."] * 10
TEXTS = ["hello world", "The lazy  dog jumps", "café Zürich 🙂 unseen-words!", "a <mask> in the middle",
         "  leading spaces", "Mixed CASE and 42 numbers"]
PAIRS = ["quick fox", "second segment here", "x", "the end", "b", "c d e"]


def roberta_files(directory):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    directory.mkdir()
    tok.model.save(str(directory))  # vocab.json + merges.txt
    return directory


def ids(tokenizer_output):
    return tokenizer_output["input_ids"]


def ours_ids(tokenizer: BertTokenizer, texts, pairs=None):
    return [e.ids for e in tokenizer.encode_batch(texts, pairs)]


def test_roberta_bpe_files_give_transformers_ids(tmp_path):
    directory = roberta_files(tmp_path / "bpe")
    theirs = transformers.RobertaTokenizer.from_pretrained(directory)
    ours = BertTokenizer.from_pretrained(directory)
    assert ours.cls_token_id == theirs.cls_token_id == 0 and ours.pad_token_id == theirs.pad_token_id == 1
    assert ours_ids(ours, TEXTS) == ids(theirs(TEXTS))
    assert ours_ids(ours, TEXTS, PAIRS) == ids(theirs(TEXTS, PAIRS))
    # One segment type: pair inputs carry segment id 0 throughout, as RoBERTa's embeddings expect.
    assert {t for e in ours.encode_batch(TEXTS, PAIRS) for t in e.type_ids} == {0}
    assert ours.decode(ours_ids(ours, ["café Zürich"])[0]) == "café Zürich"


def test_roberta_tokenizer_json_round_trip(tmp_path):
    directory = roberta_files(tmp_path / "bpe")
    transformers.RobertaTokenizer.from_pretrained(directory).save_pretrained(tmp_path / "hf")
    ours = BertTokenizer.from_pretrained(tmp_path / "hf")  # tokenizer.json written by transformers
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert ours_ids(ours, TEXTS, PAIRS) == ids(theirs(TEXTS, PAIRS))
    ours.save_pretrained(tmp_path / "ours")
    assert (tmp_path / "ours" / "merges.txt").is_file() and not (tmp_path / "ours" / "vocab.txt").exists()
    assert json.loads((tmp_path / "ours" / "tokenizer_config.json").read_text())["tokenizer_class"] == \
        "RobertaTokenizer"
    again = transformers.AutoTokenizer.from_pretrained(tmp_path / "ours")
    assert ids(again(TEXTS, PAIRS)) == ids(theirs(TEXTS, PAIRS))
    assert BertTokenizer.from_pretrained(tmp_path / "ours").fingerprint() == ours.fingerprint()


def test_albert_unigram_tokenizer_json_gives_transformers_ids(tmp_path):
    # The pipeline transformers' AlbertConverter writes (less the precompiled charsmap of spiece.model).
    directory = tmp_path / "albert"
    directory.mkdir()
    albert_tokenizer_dir(directory, CORPUS, vocab_size=120)
    theirs = transformers.AutoTokenizer.from_pretrained(directory)
    ours = BertTokenizer.from_pretrained(directory)
    texts = [t.replace("<mask>", "[MASK]") for t in TEXTS]
    assert ours.pad_token_id == theirs.pad_token_id == 0 and ours.mask_token_id == theirs.mask_token_id
    assert ours_ids(ours, texts, PAIRS) == ids(theirs(texts, PAIRS))
    reference = theirs(texts, PAIRS, return_token_type_ids=True)["token_type_ids"]
    assert [e.type_ids for e in ours.encode_batch(texts, PAIRS)] == reference


def spiece_dir(directory):
    """An ALBERT tokenizer directory holding only spiece.model, trained by SentencePiece here."""
    spm = pytest.importorskip("sentencepiece")
    corpus = directory / "corpus.txt"
    corpus.write_text("\n".join(CORPUS + ["In 1998, 3,000 people met ``quoted'' text."] * 10), encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(directory / "spiece"), vocab_size=90,
                                   model_type="unigram", pad_id=0, unk_id=1, bos_id=-1, eos_id=-1,
                                   control_symbols=["[CLS]", "[SEP]", "[MASK]"], minloglevel=2)
    corpus.unlink()
    (directory / "spiece.vocab").unlink()
    (directory / "config.json").write_text(json.dumps({"model_type": "albert"}))
    return directory


def test_albert_spiece_model_alone_gives_transformers_ids(tmp_path):
    """spiece.model without tokenizer.json: the same ids as transformers' AlbertTokenizer reading
    it (the model's precompiled charsmap included), and the same again after a save and reload."""
    directory = tmp_path / "albert"
    directory.mkdir()
    spiece_dir(directory)
    ours = BertTokenizer.from_pretrained(directory)
    theirs = transformers.AlbertTokenizer.from_pretrained(directory)
    texts = TEXTS + ["In 1998, ``quoted'' text [MASK] here.", "ＦＵＬＬ width ①②", "a [MASK]b"]
    pairs = PAIRS + ["one", "two", "three"]
    assert ours_ids(ours, texts) == ids(theirs(texts))
    assert ours_ids(ours, texts, pairs) == ids(theirs(texts, pairs))
    assert [e.type_ids for e in ours.encode_batch(texts, pairs)] == \
        theirs(texts, pairs, return_token_type_ids=True)["token_type_ids"]
    assert ours.convert_ids_to_tokens(ours.encode("a [MASK]b").ids).count("[MASK]") == 1  # kept whole
    ours.save_pretrained(tmp_path / "saved")
    assert ours_ids(BertTokenizer.from_pretrained(tmp_path / "saved"), texts, pairs) == ours_ids(ours, texts, pairs)


def test_spiece_model_that_is_no_model_names_the_file(tmp_path):
    pytest.importorskip("sentencepiece")
    (tmp_path / "spiece.model").write_bytes(b"\x00")
    with pytest.raises(ValueError, match="cannot read .*spiece.model as a SentencePiece model"):
        BertTokenizer.from_pretrained(tmp_path)


@pytest.mark.parametrize("tokenizer_class", ["XLMRobertaTokenizer", "CamembertTokenizer"])
def test_sentencepiece_tokenizer_json_gives_transformers_ids(tokenizer_class, tmp_path):
    """XLM-RoBERTa / CamemBERT: fairseq's ids and `<s> A </s></s> B </s>` pairs with one segment,
    over Chinese, Arabic, accents and emoji; the same again after bertkit saves and transformers reloads."""
    directory = tmp_path / "spm"
    directory.mkdir()
    sentencepiece_tokenizer_dir(directory, tokenizer_class)
    theirs = transformers.AutoTokenizer.from_pretrained(directory)
    ours = BertTokenizer.from_pretrained(directory)
    texts = TEXTS + ["北京是中国的首都", "مرحبا بالعالم", "Ça va très bien 🙂✨", "a <mask>."]
    pairs = PAIRS + ["首都", "كيف حالك", "à vous", "x"]
    assert (ours.cls_token_id, ours.pad_token_id, ours.sep_token_id) == (0, 1, 2) == \
        (theirs.cls_token_id, theirs.pad_token_id, theirs.sep_token_id)
    assert ours.mask_token_id == theirs.mask_token_id
    assert ours_ids(ours, texts, pairs) == ids(theirs(texts, pairs))
    assert [e.type_ids for e in ours.encode_batch(texts, pairs)] == \
        theirs(texts, pairs, return_token_type_ids=True)["token_type_ids"]
    ours.save_pretrained(tmp_path / "ours")
    again = transformers.AutoTokenizer.from_pretrained(tmp_path / "ours")
    assert type(again).__name__ == tokenizer_class
    assert ids(again(texts, pairs)) == ids(theirs(texts, pairs))


def fairseq_spm_dir(work, tokenizer_class: str):
    """An XLM-RoBERTa / CamemBERT directory as released before tokenizer.json: a SentencePiece
    Unigram sentencepiece.bpe.model (<unk> <s> </s> first, nmt_nfkc table) trained on text in
    several scripts, and tokenizer_config.json."""
    import sentencepiece

    from family_fixtures import SCRIPTS

    work.mkdir()
    corpus = work / "corpus.txt"
    corpus.write_text("\n".join(CORPUS + SCRIPTS), encoding="utf-8")
    sentencepiece.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(work / "sentencepiece.bpe"), vocab_size=150, model_type="unigram",
        hard_vocab_limit=False, character_coverage=0.98, minloglevel=2)
    corpus.unlink()
    (work / "sentencepiece.bpe.vocab").unlink()
    (work / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": tokenizer_class}))
    return work


@pytest.mark.parametrize("tokenizer_class", ["XLMRobertaTokenizer", "CamembertTokenizer"])
def test_sentencepiece_bpe_model_alone_gives_transformers_ids(tokenizer_class, tmp_path):
    """No tokenizer.json: sentencepiece.bpe.model is read with fairseq's ids laid over it, each
    family its own way, equal to AutoTokenizer on Chinese, Arabic, accents, emoji, <mask> and pairs;
    saved, it is a tokenizer.json that transformers reads to the same ids."""
    pytest.importorskip("sentencepiece")
    directory = fairseq_spm_dir(tmp_path / "spm", tokenizer_class)
    theirs = transformers.AutoTokenizer.from_pretrained(directory)
    ours = BertTokenizer.from_pretrained(directory)
    assert not (directory / "tokenizer.json").exists() and ours.tokenizer_class == tokenizer_class
    texts = TEXTS + ["北京是中国的首都", "مرحبا بالعالم", "Ça va très   bien, naïve", "✨🙂 emoji", "ﬁ Ｆｕｌｌ width"]
    pairs = PAIRS + ["中国", "كيف حالك", "à vous", "🙂", "x <mask>"]
    assert ours_ids(ours, texts) == ids(theirs(texts))
    assert ours_ids(ours, texts, pairs) == ids(theirs(texts, pairs))
    assert {t for e in ours.encode_batch(texts, pairs) for t in e.type_ids} == {0}
    assert (ours.cls_token_id, ours.sep_token_id, ours.pad_token_id, ours.mask_token_id, ours.vocab_size) == (
        theirs.cls_token_id, theirs.sep_token_id, theirs.pad_token_id, theirs.mask_token_id, len(theirs))
    assert ours.decode(ours_ids(ours, ["Ça va"])[0], skip_special_tokens=True) == theirs.decode(
        ids(theirs(["Ça va"]))[0], skip_special_tokens=True)
    ours.save_pretrained(tmp_path / "saved")
    again = transformers.AutoTokenizer.from_pretrained(tmp_path / "saved")
    assert ids(again(texts, pairs)) == ids(theirs(texts, pairs))


@pytest.mark.parametrize("prefix", ["XLMRoberta", "Camembert"])
def test_a_model_directory_with_sentencepiece_bpe_model_alone_embeds_and_fills_as_transformers(prefix, tmp_path):
    """The whole path on such a directory: mean-pooled embeddings (≤ 1e-5) and fill-mask's top 5."""
    pytest.importorskip("sentencepiece")
    import torch

    import bertkit

    from family_fixtures import transformers_mean, transformers_top_masked

    directory = fairseq_spm_dir(tmp_path / "model", prefix + "Tokenizer")
    torch.manual_seed(0)
    config = getattr(transformers, prefix + "Config")(
        vocab_size=len(transformers.AutoTokenizer.from_pretrained(directory)), hidden_size=30, num_hidden_layers=2,
        num_attention_heads=3, intermediate_size=37, max_position_embeddings=40, type_vocab_size=1, pad_token_id=1)
    getattr(transformers, prefix + "ForMaskedLM")(config).eval().save_pretrained(directory)
    model = bertkit.load(directory)
    texts = ["北京是中国的首都", "مرحبا بالعالم", "Ça va très bien", "🙂 emoji"]
    got = torch.as_tensor(model.encode(texts, pooling="mean"))
    assert float((got - transformers_mean(directory, texts)).abs().max()) <= 1e-5
    ids, _ = transformers_top_masked(directory, "Ça va <mask> bien", 5)
    assert [c["token_id"] for c in model.fill_mask("Ça va <mask> bien")[0]] == ids
