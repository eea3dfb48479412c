"""ModernBERT-configured models with other vocabularies than ModernBERT's own: mmBERT's
Gemma-style one (SentencePiece-style BPE with byte fallback, <bos> … <eos>, pad 0) and Ettin's
sizes over ModernBERT's tokenizer. Tiny random checkpoints made by transformers, tokenizers
trained here with `tokenizers`; ids, embeddings and fill-mask equal transformers'.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import bertkit
from bertkit.data.tokenizer import BertTokenizer

from family_fixtures import CORPUS, SCRIPTS, transformers_mean, transformers_top_masked
from modern_fixtures import make_modernbert

transformers = pytest.importorskip("transformers")

TEXTS = ["Hello world", "北京是中国的首都。", "مرحبا بالعالم", "café 🙂 ✨ naïve", "Zürich ŝ ǅ rare  spaces"]
PAIRS = ["x", "中国", "كيف حالك", "à vous", "🙂 end"]
# Gemma's special tokens in Gemma's order: <pad> 0, <eos> 1, <bos> 2, <unk> 3, then mmBERT's <mask> 4.
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]


def gemma_style_dir(out: Path, names_cls: bool) -> Path:
    """An mmBERT-style directory: a Gemma-style tokenizer.json (BPE over "▁"-joined text with byte
    fallback pieces <0x00>…<0xFF>, `<bos> A <eos> (B <eos>)`), its tokenizer_config.json (naming
    cls / sep as <bos> / <eos> or, as Gemma's does, only bos / eos) and a ModernBertForMaskedLM."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors, trainers

    out.mkdir(parents=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=SPECIALS + [f"<0x{b:02X}>" for b in range(256)])
    tok.train_from_iterator(CORPUS + SCRIPTS, trainer)
    tok.add_special_tokens([AddedToken("<mask>", special=True, normalized=False)])
    bos, eos = tok.token_to_id("<bos>"), tok.token_to_id("<eos>")
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A <eos>", pair="<bos> $A <eos> $B <eos>", special_tokens=[("<bos>", bos), ("<eos>", eos)])
    tok.save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
              "pad_token": "<pad>", "unk_token": "<unk>", "mask_token": "<mask>", "model_max_length": 8192}
    if names_cls:
        config.update(cls_token="<bos>", sep_token="<eos>")
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    torch.manual_seed(0)
    model_config = transformers.ModernBertConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=4, num_attention_heads=2,
        intermediate_size=37, local_attention=16, max_position_embeddings=8192, initializer_range=0.2,
        pad_token_id=0, eos_token_id=eos, bos_token_id=bos, cls_token_id=bos, sep_token_id=eos)
    transformers.ModernBertForMaskedLM(model_config).eval().save_pretrained(out)
    return out


def same_as_transformers(directory: Path) -> None:
    """Token ids (texts and pairs), mean-pooled embeddings and fill-mask equal transformers'."""
    theirs = transformers.AutoTokenizer.from_pretrained(directory)
    ours = BertTokenizer.from_pretrained(directory)
    assert [e.ids for e in ours.encode_batch(TEXTS)] == theirs(TEXTS)["input_ids"]
    assert [e.ids for e in ours.encode_batch(TEXTS, PAIRS)] == theirs(TEXTS, PAIRS)["input_ids"]
    model = bertkit.load(directory)
    got = torch.as_tensor(model.encode(TEXTS, pooling="mean"))
    assert float((got - transformers_mean(directory, TEXTS)).abs().max()) <= 1e-5
    masked = f"Hello {theirs.mask_token} world"
    ids, scores = transformers_top_masked(directory, masked, 5)
    candidates = model.fill_mask(masked, top_k=5)[0]
    assert [c["token_id"] for c in candidates] == ids
    assert max(abs(c["score"] - s) for c, s in zip(candidates, scores)) <= 1e-5


@pytest.mark.parametrize("names_cls", [True, False], ids=["cls-named", "bos-eos-only"])
def test_gemma_style_vocabulary_matches_transformers(names_cls, tmp_path):
    """mmBERT's kind of vocabulary: byte fallback for unseen characters, <bos> / <eos> around the text.
    Where tokenizer_config.json names only bos / eos, bertkit takes them as the cls / sep tokens
    (transformers leaves cls_token_id None; the ids it encodes are the same)."""
    directory = gemma_style_dir(tmp_path / "mm", names_cls)
    same_as_transformers(directory)
    ours = BertTokenizer.from_pretrained(directory)
    assert (ours.cls_token_id, ours.sep_token_id, ours.pad_token_id, ours.mask_token_id) == (2, 1, 0, 4)
    assert any(t.startswith("<0x") for t in ours.backend.encode("ǅ").tokens)  # byte fallback reached


def test_ettin_sizes_over_modernberts_tokenizer_match_transformers(tmp_path):
    """Ettin's encoders are ModernBERT's architecture and tokenizer at other sizes: 7 layers, a
    global layer every third, mean pooling in its classifier config."""
    directory = make_modernbert(tmp_path / "ettin", num_hidden_layers=7, global_attn_every_n_layers=3,
                                classifier_pooling="mean")
    config = json.loads((directory / "config.json").read_text())
    assert config["layer_types"].count("full_attention") == 3  # layers 0, 3, 6
    same_as_transformers(directory)
