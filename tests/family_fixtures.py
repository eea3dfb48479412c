"""Checkpoints of the families made by transformers, with tokenizers trained here.

`make_checkpoint(family, out_dir)` writes what a user would download: config.json, the weights
and the tokenizer files transformers saves for that family (RoBERTa: vocab.json + merges.txt +
tokenizer.json; ALBERT: a Unigram tokenizer.json; XLM-RoBERTa and CamemBERT: a SentencePiece
Unigram tokenizer.json with fairseq's ids; DistilBERT, ERNIE and ELECTRA: vocab.txt + tokenizer.json;
MPNet: a WordPiece tokenizer.json with `<s>` / `</s>` markers).
Random weights, tiny sizes; nothing downloads. Used by the tests and the README's examples.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

CORPUS = ["The quick brown fox jumps over the lazy dog.", "Hello world, hello tokenizers!",
          "Paris is the capital of France.", "Berlin is the capital of Germany.",
          "The cat sat on the mat.", "A dog ran in the park.", "Sentence order prediction swaps segments.",
          "Byte-level BPE handles accents: café, naïve, Zürich."] * 10
# Text in several scripts for the multilingual vocabularies.
SCRIPTS = ["北京是中国的首都。", "مرحبا بالعالم، كيف حالك؟", "Ça va très bien, merci à vous.",
           "Emoji 🙂 and ✨ too."] * 10
PREFIX = {"roberta": "Roberta", "xlm-roberta": "XLMRoberta", "camembert": "Camembert", "albert": "Albert",
          "distilbert": "DistilBert", "ernie": "Ernie", "electra": "Electra", "mpnet": "MPNet"}
# RoBERTa and its SentencePiece descendants: fairseq's ids (<s> 0, <pad> 1, </s> 2, <unk> 3).
FAIRSEQ = ("roberta", "xlm-roberta", "camembert")


def _roberta_tokenizer(work: Path):
    import transformers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.model.save(str(work))
    return transformers.RobertaTokenizer.from_pretrained(work)


def albert_tokenizer_dir(work: Path, corpus=CORPUS, vocab_size: int = 150) -> Path:
    """An ALBERT-style Unigram tokenizer.json (+ tokenizer_config.json) trained on `corpus`, in `work`."""
    tok = Tokenizer(models.Unigram())
    # The pipeline transformers' AlbertConverter writes (less spiece.model's precompiled charsmap).
    tok.normalizer = normalizers.Sequence([normalizers.Replace("``", '"'), normalizers.Replace("''", '"'),
                                           normalizers.NFKD(), normalizers.StripAccents(),
                                           normalizers.Lowercase(), normalizers.Replace(Regex(" {2,}"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace()])
    tok.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=vocab_size, unk_token="<unk>",
                                      special_tokens=["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"])
    tok.train_from_iterator(corpus, trainer)
    tok.add_special_tokens([AddedToken("[MASK]", lstrip=True, special=True)])  # as ALBERT's files have it
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    tok.save(str(work / "tokenizer.json"))
    (work / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "AlbertTokenizer"}))
    return work


def sentencepiece_tokenizer_dir(work: Path, tokenizer_class: str = "XLMRobertaTokenizer",
                                corpus=CORPUS + SCRIPTS, vocab_size: int = 200) -> Path:
    """An XLM-RoBERTa-style (or CamemBERT) Unigram tokenizer.json trained on `corpus`, in `work`:
    fairseq's ids (<s> <pad> </s> <unk> first, <mask> last), `<s> A </s></s> B </s>`, the
    pipeline transformers' class builds (no normaliser without spiece.model's charsmap)."""
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace()])
    tok.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=vocab_size, unk_token="<unk>",
                                      special_tokens=["<s>", "<pad>", "</s>", "<unk>"])
    tok.train_from_iterator(corpus, trainer)
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True)])
    tok.post_processor = processors.TemplateProcessing(
        single="<s>:0 $A:0 </s>:0", pair="<s>:0 $A:0 </s>:0 </s>:0 $B:0 </s>:0",
        special_tokens=[("<s>", tok.token_to_id("<s>")), ("</s>", tok.token_to_id("</s>"))])
    tok.save(str(work / "tokenizer.json"))
    (work / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": tokenizer_class}))
    return work


def _sentencepiece_tokenizer(family: str):
    def build(work: Path):
        import transformers

        directory = sentencepiece_tokenizer_dir(work, PREFIX[family] + "Tokenizer")
        return transformers.AutoTokenizer.from_pretrained(directory)
    return build


def _albert_tokenizer(work: Path):
    import transformers

    return transformers.AutoTokenizer.from_pretrained(albert_tokenizer_dir(work))


def _wordpiece_tokenizer(work: Path):
    """BERT's WordPiece (vocab.txt), which DistilBERT, ERNIE and ELECTRA use."""
    import transformers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=200, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    tok.train_from_iterator(CORPUS, trainer)
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    (work / "vocab.txt").write_text("".join(f"{t}\n" for t, _ in vocab), encoding="utf-8")
    return transformers.BertTokenizer.from_pretrained(work)


def _mpnet_tokenizer(work: Path):
    """MPNet's WordPiece (MPNetTokenizer): `<s> A </s></s> B </s>`, [UNK], fairseq's first ids."""
    import transformers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "[UNK]", "<mask>"])
    tok.train_from_iterator(CORPUS + SCRIPTS, trainer)
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    (work / "vocab.txt").write_text("".join(f"{t}\n" for t, _ in vocab), encoding="utf-8")
    return transformers.MPNetTokenizer.from_pretrained(work)


def hf_config(family: str, vocab_size: int, **extra):
    import transformers

    common = dict(vocab_size=vocab_size, max_position_embeddings=66, **extra)
    if family in FAIRSEQ:
        return getattr(transformers, PREFIX[family] + "Config")(
            hidden_size=36, num_hidden_layers=2, num_attention_heads=3, intermediate_size=41, type_vocab_size=1,
            pad_token_id=1, layer_norm_eps=1e-5, **common)
    if family == "albert":
        return transformers.AlbertConfig(embedding_size=14, hidden_size=36, num_hidden_layers=3,
                                         num_hidden_groups=1, inner_group_num=1, num_attention_heads=3,
                                         intermediate_size=41, **common)
    if family == "ernie":  # with ERNIE 3.0's task-type table
        return transformers.ErnieConfig(hidden_size=36, num_hidden_layers=2, num_attention_heads=3,
                                        intermediate_size=41, use_task_id=True, **common)
    if family == "mpnet":
        return transformers.MPNetConfig(hidden_size=36, num_hidden_layers=2, num_attention_heads=3,
                                        intermediate_size=41, **common)
    if family == "electra":  # embeddings narrower than the layers, as ELECTRA-small's generator
        return transformers.ElectraConfig(embedding_size=14, hidden_size=36, num_hidden_layers=2,
                                          num_attention_heads=3, intermediate_size=41, **common)
    return transformers.DistilBertConfig(dim=36, n_layers=2, n_heads=3, hidden_dim=41, **common)


def make_checkpoint(family: str, out_dir: str | Path, kind: str = "ForMaskedLM", seed: int = 0, **extra) -> Path:
    """A transformers `<Family><kind>` with random weights and the family's tokenizer, saved to out_dir."""
    import transformers

    out_dir = Path(out_dir)
    with tempfile.TemporaryDirectory() as work:
        tokenizer = {"roberta": _roberta_tokenizer, "albert": _albert_tokenizer,
                     "xlm-roberta": _sentencepiece_tokenizer("xlm-roberta"),
                     "camembert": _sentencepiece_tokenizer("camembert"),
                     "distilbert": _wordpiece_tokenizer, "ernie": _wordpiece_tokenizer,
                     "electra": _wordpiece_tokenizer, "mpnet": _mpnet_tokenizer}[family](Path(work))
    torch.manual_seed(seed)
    model = getattr(transformers, PREFIX[family] + kind)(hf_config(family, len(tokenizer), **extra)).eval()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


if __name__ == "__main__":  # python tests/family_fixtures.py OUT_ROOT: one MLM checkpoint per family
    import sys

    root = Path(sys.argv[1])
    for name in PREFIX:
        print(make_checkpoint(name, root / name))


def transformers_mean(directory: Path, texts: list[str]) -> torch.Tensor:
    """(len(texts), H) transformers' AutoModel states of `directory`, mean over each text's tokens:
    the reference for `embed(..., pooling="mean", normalize=False)`."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.AutoModel.from_pretrained(directory).eval()
    inputs = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**inputs).last_hidden_state  # (B, T, H)
    mask = inputs["attention_mask"].unsqueeze(-1).float()  # (B, T, 1)
    return (hidden * mask).sum(1) / mask.sum(1)


def transformers_top_masked(directory: Path, text: str, k: int = 5) -> tuple[list[int], list[float]]:
    """transformers' k most likely tokens at the one mask of `text`: (token ids, probabilities),
    the reference for `fill_mask(directory, [text], top_k=k)`."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    model = transformers.AutoModelForMaskedLM.from_pretrained(directory).eval()
    inputs = tokenizer([text], return_tensors="pt")
    with torch.no_grad():
        logits = model(**inputs).logits[0]  # (T, V)
    position = int((inputs["input_ids"][0] == tokenizer.mask_token_id).nonzero())
    top = logits[position].softmax(-1).topk(k)
    return top.indices.tolist(), top.values.tolist()


def make_bert(out_dir: str | Path, kind: str = "Model", seed: int = 0, **extra) -> Path:
    """A transformers Bert<kind> of the same tiny sizes, with the WordPiece tokenizer, saved to
    out_dir. BERT is not in PREFIX: the family tests loop over its descendants."""
    import transformers

    out_dir = Path(out_dir)
    with tempfile.TemporaryDirectory() as work:
        tokenizer = _wordpiece_tokenizer(Path(work))
    torch.manual_seed(seed)
    config = transformers.BertConfig(vocab_size=len(tokenizer), hidden_size=36, num_hidden_layers=2,
                                     num_attention_heads=3, intermediate_size=41, max_position_embeddings=66,
                                     **extra)
    getattr(transformers, "Bert" + kind)(config).eval().save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
