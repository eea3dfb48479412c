"""`tokenizers` pipelines built from the files each family ships, and BERT's own pieces.

`BertTokenizer` (tokenizer.py) wraps one of these backends; this module only builds them:

- `wordpiece`: BERT's WordPiece from a vocab.txt (or a dict), with BERT's normaliser
  (`bert_normalizer`: clean text, lowercase and strip accents as configured, CJK characters as
  words), BertPreTokenizer and `##` continuations (`configure_bert_pipeline`);
- `bpe`: RoBERTa's byte-level BPE from vocab.json + merges.txt, as transformers'
  RobertaTokenizer builds it: `<s> A </s></s> B </s>`, one segment id (0) throughout;
- `unigram`: ALBERT's SentencePiece Unigram model from spiece.model, as transformers'
  AlbertTokenizer builds it;
- `deberta_spm`: DeBERTa-v2/v3's SentencePiece Unigram model from spm.model, as transformers'
  DebertaV2Tokenizer builds it;
- `fairseq_spm`: XLM-RoBERTa's and CamemBERT's SentencePiece Unigram model from
  sentencepiece.bpe.model with fairseq's ids, as XLMRobertaTokenizer / CamembertTokenizer build it;
- `set_bert_post_processor`: `[CLS] A [SEP] (B [SEP])` with segment ids 0 / 1.

BERT's special-token names live here too, as every builder needs them; each family's defaults
are its record's (`bertkit.families`: `Family.tokenizer`).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE, WordPiece

from bertkit.families import CAMEMBERT_JSON, DEBERTA_SPM, UNIGRAM, XLMR_JSON, TokenizerLayout

logger = logging.getLogger(__name__)

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
# Order of the special tokens in a freshly trained vocabulary: [PAD] first so that padding is id 0,
# as in every released BERT vocabulary (embedding row 0 is then the padding row).
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
SPECIAL_KEYS = {"pad_token": PAD, "unk_token": UNK, "cls_token": CLS, "sep_token": SEP,
                "mask_token": MASK}
# BERT's reference tokenizer gives up on longer words and emits [UNK]; kept for id parity.
MAX_INPUT_CHARS_PER_WORD = 100


# ---------------------------------------------------------------------------------------------
# BERT's pipeline
# ---------------------------------------------------------------------------------------------
def bert_normalizer(lowercase: bool, strip_accents: bool | None,
                    tokenize_chinese_chars: bool) -> normalizers.BertNormalizer:
    return normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=tokenize_chinese_chars,
                                      strip_accents=strip_accents, lowercase=lowercase)


def configure_bert_pipeline(backend: Tokenizer, *, lowercase: bool, strip_accents: bool | None,
                            tokenize_chinese_chars: bool) -> None:
    """BERT's normaliser, pre-tokenizer and `##` decoder on `backend` (a WordPiece model)."""
    backend.normalizer = bert_normalizer(lowercase, strip_accents, tokenize_chinese_chars)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece(prefix="##")


def set_bert_post_processor(backend: Tokenizer, cls_token: str, sep_token: str) -> None:
    cls_id, sep_id = backend.token_to_id(cls_token), backend.token_to_id(sep_token)
    if cls_id is None or sep_id is None:
        missing = cls_token if cls_id is None else sep_token
        raise ValueError(f"the vocabulary has no {missing!r} token; BERT inputs need "
                         f"{cls_token} and {sep_token}")
    backend.post_processor = processors.TemplateProcessing(
        single=f"{cls_token}:0 $A:0 {sep_token}:0",
        pair=f"{cls_token}:0 $A:0 {sep_token}:0 $B:1 {sep_token}:1",
        special_tokens=[(cls_token, cls_id), (sep_token, sep_id)],
    )


def component_state(component: Any) -> Any:
    """A normaliser's / pre-tokenizer's / post-processor's settings as plain JSON values."""
    return None if component is None else json.loads(component.__getstate__())


def normalizer_state(backend: Tokenizer) -> dict:
    return component_state(backend.normalizer) or {}


# ---------------------------------------------------------------------------------------------
# the families' files
# ---------------------------------------------------------------------------------------------
def wordpiece(vocab: str | os.PathLike | dict[str, int], *, lowercase: bool = True,
              strip_accents: bool | None = None, tokenize_chinese_chars: bool = True,
              special_tokens: dict[str, str] | None = None) -> Tokenizer:
    """BERT's WordPiece from a vocab.txt path (one token per line, id = line number) or a dict.

    strip_accents=None follows `lowercase`, as BERT's reference tokenizer does.
    """
    vocab_map = dict(vocab) if isinstance(vocab, dict) else read_vocab_txt(Path(vocab))
    if not vocab_map:
        raise ValueError(f"empty vocabulary {vocab if not isinstance(vocab, dict) else '{}'}")
    specials = {**SPECIAL_KEYS, **(special_tokens or {})}
    backend = Tokenizer(WordPiece(vocab_map, unk_token=specials["unk_token"],
                                  max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD))
    configure_bert_pipeline(backend, lowercase=lowercase, strip_accents=strip_accents,
                            tokenize_chinese_chars=tokenize_chinese_chars)
    # Special tokens are "added" tokens so that "[MASK]" in raw text stays one token and is
    # neither lowercased nor split, as in BertTokenizerFast.
    backend.add_special_tokens([specials[k] for k in SPECIAL_KEYS if specials[k] in vocab_map])
    set_bert_post_processor(backend, specials["cls_token"], specials["sep_token"])
    return backend


def bpe(vocab_json: str | os.PathLike, merges_txt: str | os.PathLike, specials: dict[str, str], *,
        add_prefix_space: bool = False, trim_offsets: bool = True) -> Tokenizer:
    """RoBERTa's byte-level BPE from vocab.json + merges.txt, built as transformers'
    RobertaTokenizer builds it: `<s> A </s></s> B </s>`, one segment id (0) throughout."""
    try:
        model = BPE.from_file(str(vocab_json), str(merges_txt), dropout=None, continuing_subword_prefix="",
                              end_of_word_suffix="", fuse_unk=False)
    except Exception as err:  # the Rust side raises plain Exception on malformed files
        raise ValueError(f"cannot read the BPE vocabulary {vocab_json} / {merges_txt}: {err}") from err
    backend = Tokenizer(model)
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    backend.decoder = decoders.ByteLevel()
    missing = [t for t in specials.values() if backend.token_to_id(t) is None]
    if missing:
        raise ValueError(f"{vocab_json} has no {missing[0]!r}; RoBERTa inputs need "
                         f"{', '.join(specials.values())} in the vocabulary")
    backend.add_special_tokens(list(dict.fromkeys(specials.values())))
    sep, bos = specials["sep_token"], specials["cls_token"]
    backend.post_processor = processors.RobertaProcessing(
        (sep, backend.token_to_id(sep)), (bos, backend.token_to_id(bos)), trim_offsets, add_prefix_space)
    return backend


def unigram(spiece_model: str | os.PathLike, specials: dict[str, str], *, lowercase: bool = True,
            keep_accents: bool = False, add_prefix_space: bool = True) -> Tokenizer:
    """ALBERT's SentencePiece Unigram model (spiece.model) as a `tokenizers` pipeline, built as
    transformers' AlbertTokenizer builds it from the same file: the pieces and scores, the
    model's own normalisation table (precompiled charsmap) after ``/'' → ", NFKD and accent
    stripping (unless keep_accents) and lowercasing; whitespace split, "▁" word prefix;
    `[CLS] A [SEP] B [SEP]` with segments 0 / 1. Control symbols ([CLS], [SEP], [MASK], <pad>)
    are special tokens, so "[MASK]" in raw text stays one token.

    Reading the file takes the `sentencepiece` package's message definition and `protobuf`
    (the `albert` extra); once loaded, encoding runs in `tokenizers` alone.
    """
    from tokenizers import AddedToken
    from tokenizers.models import Unigram

    proto = read_sentencepiece(spiece_model, UNIGRAM)
    backend = Tokenizer(Unigram([(piece.piece, piece.score) for piece in proto.pieces],
                                unk_id=proto.trainer_spec.unk_id, byte_fallback=False))
    steps = [normalizers.Replace("``", '"'), normalizers.Replace("''", '"')]
    if not keep_accents:
        steps += [normalizers.NFKD(), normalizers.StripAccents()]
    if lowercase:
        steps.append(normalizers.Lowercase())
    if proto.normalizer_spec.precompiled_charsmap:
        steps.append(normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap))
    backend.normalizer = normalizers.Sequence(steps)
    scheme = "always" if add_prefix_space else "never"
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme)])
    backend.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=scheme)
    # SentencePiece's CONTROL (3) pieces are special; USER_DEFINED (4) ones are kept whole.
    backend.add_tokens([AddedToken(p.piece, normalized=False, special=p.type == 3)
                        for p in proto.pieces if p.type in (3, 4)])
    missing = [t for t in specials.values() if backend.token_to_id(t) is None]
    if missing:
        raise ValueError(f"{spiece_model} has no {missing[0]!r}; ALBERT inputs need "
                         f"{', '.join(specials.values())} among its pieces")
    backend.add_special_tokens(list(dict.fromkeys(specials.values())))
    set_bert_post_processor(backend, specials["cls_token"], specials["sep_token"])
    return backend


def read_sentencepiece(path: str | os.PathLike, layout: TokenizerLayout):
    """The ModelProto of a SentencePiece Unigram .model file of `layout`; ImportError naming its extra,
    or ValueError in one line naming the file when it is not a Unigram model (damaged, or another type)."""
    try:
        from sentencepiece import sentencepiece_model_pb2
    except ImportError as err:
        raise ImportError(f"reading {path} needs sentencepiece and protobuf ({err.name} is "
                          f"not installed): pip install 'bertkit[{layout.extra}]', or save the tokenizer "
                          "once with transformers to get a tokenizer.json") from None
    proto = sentencepiece_model_pb2.ModelProto()
    try:
        proto.ParseFromString(Path(path).read_bytes())
    except Exception as err:  # protobuf's DecodeError, or a file that is no model at all
        message = " ".join(str(err).split()) or type(err).__name__
        raise ValueError(f"cannot read {path} as a SentencePiece model ({message}); the file is damaged: "
                         "copy it again from the model's source") from None
    if proto.trainer_spec.model_type != 1:  # 1 = UNIGRAM
        raise ValueError(f"{path} is a SentencePiece model of type {proto.trainer_spec.model_type}, not "
                         f"Unigram (1) as {layout.tokenizer_class}'s; give its tokenizer.json instead")
    return proto


def deberta_spm(spm_model: str | os.PathLike, specials: dict[str, str], *, lowercase: bool = False,
                split_by_punct: bool = False, add_prefix_space: bool = True) -> Tokenizer:
    """DeBERTa-v2/v3's SentencePiece Unigram model (spm.model; v3 ships no tokenizer.json) as a
    `tokenizers` pipeline, built as transformers' DebertaV2Tokenizer builds it from the same file
    (5.25, which AutoTokenizer loads; its DebertaV2Converter differs only in where it strips):
    the pieces and scores, unknown at [UNK]; lowercasing where do_lower_case, the model's
    normalisation table (precompiled charsmap), right strip and runs of spaces as one (without a
    table: whitespace runs and newlines as one space, NFC, right strip); punctuation isolated where
    split_by_punct; "▁" word prefix; `[CLS] A [SEP] B [SEP]` with segments 0 / 1. Control
    pieces are special; special tokens the model lacks ([MASK] in v3) are added after its pieces."""
    from tokenizers import AddedToken, Regex
    from tokenizers.models import Unigram

    proto = read_sentencepiece(spm_model, DEBERTA_SPM)
    pieces = [(piece.piece, piece.score) for piece in proto.pieces]
    unk = specials.get("unk_token", UNK)
    unk_id = next((i for i, (piece, score) in enumerate(pieces) if piece == unk and score == 0.0),
                  proto.trainer_spec.unk_id)
    backend = Tokenizer(Unigram(pieces, unk_id=unk_id, byte_fallback=False))
    steps = [normalizers.Lowercase()] if lowercase else []
    charsmap = proto.normalizer_spec.precompiled_charsmap
    if charsmap:
        steps += [normalizers.Precompiled(charsmap), normalizers.Strip(left=False, right=True),
                  normalizers.Replace(Regex(" {2,}"), " ")]
    else:
        steps += [normalizers.Replace(Regex(r"\s{2,}|[\n\r\t]"), " "), normalizers.NFC(),
                  normalizers.Strip(left=False, right=True)]
    backend.normalizer = normalizers.Sequence(steps)
    scheme = "always" if add_prefix_space else "first"
    split = [pre_tokenizers.Punctuation(behavior="isolated")] if split_by_punct else []
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        split + [pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme)])
    backend.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=scheme)
    backend.add_special_tokens([AddedToken(p.piece, normalized=False, special=True)
                                for p in proto.pieces if p.type == 3])
    backend.add_special_tokens([AddedToken(token, normalized=False, special=True)
                                for token in dict.fromkeys({**SPECIAL_KEYS, **specials}.values())])
    set_bert_post_processor(backend, specials.get("cls_token", CLS), specials.get("sep_token", SEP))
    return backend


def fairseq_spm(spm_model: str | os.PathLike, specials: dict[str, str], *, camembert: bool = False,
                add_prefix_space: bool = True) -> Tokenizer:
    """XLM-RoBERTa's (or CamemBERT's) SentencePiece Unigram model (sentencepiece.bpe.model, when the
    directory has no tokenizer.json) as a `tokenizers` pipeline, built as transformers 5.25's
    XLMRobertaTokenizer / CamembertTokenizer build it from the same file (its XLMRobertaConverter
    and CamembertConverter lay out the same ids):

    - XLM-R: fairseq's `<s> <pad> </s> <unk>` at 0-3, then the model's pieces after its own
      `<unk> <s> </s>` (so piece i has id i + 1), `<mask>` last;
    - CamemBERT: `<s>NOTUSED <pad> </s>NOTUSED <unk> <unk>NOTUSED` at 0-4 (the last scored -100 so
      that it is never chosen), then every piece but the model's `<unk>` (its `<s>` is 5, `</s>` 6),
      `<mask>` last, which swallows the space before it.

    Unknown at 3; the model's normalisation table (precompiled charsmap) where it has one;
    whitespace split, "▁" word prefix; `<s> A </s></s> B </s>`, one segment id (0) throughout."""
    from tokenizers import AddedToken
    from tokenizers.models import Unigram

    proto = read_sentencepiece(spm_model, CAMEMBERT_JSON if camembert else XLMR_JSON)
    bos, pad, eos, unk, mask = (specials[k] for k in ("cls_token", "pad_token", "sep_token", "unk_token",
                                                      "mask_token"))
    pieces = [(piece.piece, piece.score) for piece in proto.pieces]
    if camembert:
        head = [("<s>NOTUSED", 0.0), (pad, 0.0), ("</s>NOTUSED", 0.0), (unk, 0.0), ("<unk>NOTUSED", -100.0)]
        vocab = head + pieces[1:]
    else:
        vocab = [(bos, 0.0), (pad, 0.0), (eos, 0.0), (unk, 0.0)] + pieces[3:]
    backend = Tokenizer(Unigram(vocab + [(mask, 0.0)], unk_id=3, byte_fallback=False))
    if proto.normalizer_spec.precompiled_charsmap:
        backend.normalizer = normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap)
    scheme = "always" if add_prefix_space else "never"
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme)])
    backend.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=scheme)
    backend.add_special_tokens([AddedToken(token, normalized=False, special=True, lstrip=camembert and token == mask)
                                for token in dict.fromkeys((bos, pad, eos, unk, mask))])
    backend.post_processor = processors.TemplateProcessing(
        single=f"{bos}:0 $A:0 {eos}:0", pair=f"{bos}:0 $A:0 {eos}:0 {eos}:0 $B:0 {eos}:0",
        special_tokens=[(bos, backend.token_to_id(bos)), (eos, backend.token_to_id(eos))])
    return backend


def read_vocab_txt(path: Path) -> dict[str, int]:
    """token → id of a vocab.txt (id = line number)."""
    if not path.exists():
        raise FileNotFoundError(f"vocabulary file {path} does not exist")
    vocab: dict[str, int] = {}
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            token = line.rstrip("\n")
            if token in vocab:
                # Released vocabularies occasionally repeat a line; the reference loader keeps the
                # later id, so we do too (the earlier id becomes unreachable).
                logger.warning("%s:%d: token %r repeats line %d; keeping id %d", path, line_no,
                               token, vocab[token] + 1, line_no - 1)
            vocab[token] = line_no - 1
    return vocab
