"""BERT tokenization: a thin wrapper over the `tokenizers` library (its Rust WordPiece).

`BertTokenizer` loads any BERT tokenizer directory (tokenizer.json and/or vocab.txt, with
tokenizer_config.json) and encodes exactly as `BertTokenizerFast` does: BERT normalisation
(clean text, lowercase and strip accents as configured, each CJK character its own word),
BertPreTokenizer, WordPiece with `##` continuations, and `[CLS] A [SEP] (B [SEP])` with segment ids
0 / 1. `bertkit.data.vocab.train_tokenizer` learns a new WordPiece vocabulary from a corpus; the
pipelines themselves are built in `tokenizer_backends.py`.

Settings precedence when loading a directory: tokenizer_config.json, then the normaliser stored in
tokenizer.json, then BERT's defaults (lowercase, accents stripped when lowercasing, CJK split).

The other families' tokenizers load through the same class: whatever a tokenizer.json describes
(RoBERTa's byte-level BPE, ALBERT's SentencePiece Unigram, DistilBERT's WordPiece) runs as it is,
with the special tokens of tokenizer_config.json, or the family's defaults (`Family.tokenizer` in
`bertkit.families`, by tokenizer_class or config.json's model_type). A RoBERTa directory without tokenizer.json
loads from vocab.json + merges.txt as transformers' RobertaTokenizer builds it, an ALBERT
directory without tokenizer.json from spiece.model as transformers' AlbertTokenizer builds it, a
DeBERTa-v2/v3 one from spm.model as DebertaV2Tokenizer builds it, an XLM-RoBERTa or CamemBERT one
from sentencepiece.bpe.model as XLMRobertaTokenizer / CamembertTokenizer build it (reading these
files takes sentencepiece and protobuf: the `albert`, `deberta` and `xlm-roberta` extras).

The `tokenizers` backend keeps truncation and padding as state; each call here sets them for itself,
so one `BertTokenizer` must not be shared by threads that encode with different settings at once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Literal, Sequence

from tokenizers import Tokenizer

from bertkit.data import tokenizer_backends as backends
from bertkit.data.tokenizer_backends import CLS, SEP, SPECIAL_KEYS, SPECIAL_TOKENS  # noqa: F401
from bertkit.families import BPE, CAMEMBERT_JSON, DEBERTA_SPM, UNIGRAM, XLMR_JSON, TokenizerLayout, tokenizer_layout
from bertkit.util.fileio import atomic_write_json, atomic_write_text, missing_model_dir

logger = logging.getLogger(__name__)

TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json",
                   "special_tokens_map.json", "vocab.json", "merges.txt")


@dataclass(frozen=True)
class Encoding:
    """One encoded text (or pair). All lists have the same length, the number of tokens.

    offsets are (start, end) character spans into the text the token came from (the pair's second
    text for tokens of sequence 1); special tokens have (0, 0). word_ids number the pre-tokenised
    words of each sequence (None for special tokens); sequence_ids say which text a token came from
    (0, 1, or None for special tokens).
    """

    ids: list[int]
    type_ids: list[int]
    tokens: list[str]
    offsets: list[tuple[int, int]]
    word_ids: list[int | None]
    sequence_ids: list[int | None]
    special_tokens_mask: list[int]

    def __len__(self) -> int:
        return len(self.ids)


class BertTokenizer:
    """A BERT WordPiece tokenizer: `from_pretrained`, `from_vocab` or `data.vocab.train_tokenizer` make one.

    Attributes: backend (the `tokenizers.Tokenizer`), vocab_size, the ids of the five special
    tokens, special_ids (those ids plus any other added special token), do_lower_case, strip_accents,
    tokenize_chinese_chars, model_max_length (the default truncation length).
    """

    def __init__(self, backend: Tokenizer, *, model_max_length: int = 512,
                 special_tokens: dict[str, str] | None = None, tokenizer_class: str | None = None):
        """Wrap a configured `tokenizers.Tokenizer` (WordPiece model, BERT normaliser expected).

        special_tokens maps "pad_token", "unk_token", "cls_token", "sep_token", "mask_token" to
        their strings when a vocabulary spells them differently from [PAD] [UNK] [CLS] [SEP] [MASK].
        tokenizer_class: what tokenizer_config.json calls it (None: BertTokenizer).
        """
        if model_max_length < 2:
            raise ValueError(f"model_max_length {model_max_length} leaves no room for [CLS] and "
                             "[SEP]; use a value of at least 2 (BERT models use 512)")
        self.backend = backend
        self.model_max_length = int(model_max_length)
        self.special_tokens = {**SPECIAL_KEYS, **(special_tokens or {})}
        ids = {}
        for key, token in self.special_tokens.items():
            token_id = backend.token_to_id(token)
            if token_id is None:
                raise ValueError(f"the vocabulary has no {key} {token!r}; BERT inputs need "
                                 f"{', '.join(self.special_tokens.values())} (add it to vocab.txt)")
            ids[key] = token_id
        self.pad_token_id: int = ids["pad_token"]
        self.unk_token_id: int = ids["unk_token"]
        self.cls_token_id: int = ids["cls_token"]
        self.sep_token_id: int = ids["sep_token"]
        self.mask_token_id: int = ids["mask_token"]
        added_special = {i for i, tok in backend.get_added_tokens_decoder().items() if tok.special}
        self.special_ids: frozenset[int] = frozenset(ids.values()) | frozenset(added_special)
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        # What tokenizer_config.json calls this tokenizer (written back on save).
        self.tokenizer_class: str = tokenizer_class or "BertTokenizer"
        # Truncation/padding state we last gave the backend; None means "not set by us yet".
        self._truncation: tuple | None = None
        self._padding: tuple | None = None

    # -- construction --------------------------------------------------------------------------
    @classmethod
    def from_vocab(cls, vocab: str | os.PathLike | dict[str, int], lowercase: bool = True,
                   strip_accents: bool | None = None, tokenize_chinese_chars: bool = True, *,
                   model_max_length: int = 512,
                   special_tokens: dict[str, str] | None = None) -> "BertTokenizer":
        """Build a tokenizer from a vocab.txt path (one token per line, id = line number) or a dict.

        strip_accents=None follows `lowercase`, as BERT's reference tokenizer does.
        """
        backend = backends.wordpiece(vocab, lowercase=lowercase, strip_accents=strip_accents,
                                     tokenize_chinese_chars=tokenize_chinese_chars,
                                     special_tokens=special_tokens)
        return cls(backend, model_max_length=model_max_length, special_tokens=special_tokens)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> "BertTokenizer":
        """Load a tokenizer directory (tokenizer.json and/or vocab.txt, optional
        tokenizer_config.json and special_tokens_map.json), or a path to a vocab.txt or
        tokenizer.json file (with the settings of a tokenizer_config.json beside it, if any).
        """
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(missing_model_dir(path, "tokenizer path"))
        directory = path if path.is_dir() else path.parent
        config = _read_json_if_exists(directory / "tokenizer_config.json")
        special_map = _read_json_if_exists(directory / "special_tokens_map.json")
        specials = dict(_layout(directory, config).specials)
        for key in SPECIAL_KEYS:
            # A Gemma-style vocabulary (mmBERT's) names <bos> / <eos> and no cls / sep token; its
            # tokenizer.json wraps texts in them, so they are the first and separating tokens.
            fallback = {"cls_token": "bos_token", "sep_token": "eos_token"}.get(key)
            value = config.get(key, special_map.get(key, config.get(fallback, special_map.get(fallback))))
            if isinstance(value, dict):  # AddedToken serialised as {"content": ...}
                value = value.get("content")
            if isinstance(value, str):
                specials[key] = value
        max_len = config.get("model_max_length", 512)
        # Some configs store "no limit" as a huge sentinel (1e30); BERT positions stop at 512.
        if not isinstance(max_len, int) or max_len > 1_000_000:
            max_len = 512
        settings = {k: config[k] for k in ("strip_accents", "tokenize_chinese_chars")
                    if k in config}
        if "do_lower_case" in config:
            settings["lowercase"] = config["do_lower_case"]

        if path.is_file():
            tokenizer_json = path if path.suffix == ".json" else None
            vocab_file = path
        else:  # a directory: tokenizer.json when there is one, as it is the richer description
            tokenizer_json = directory / "tokenizer.json"
            tokenizer_json = tokenizer_json if tokenizer_json.exists() else None
            vocab_file = directory / "vocab.txt"
        if tokenizer_json is None:
            if path.is_dir() and all((directory / name).is_file() for name in BPE.files):
                return cls.from_bpe_files(*(directory / name for name in BPE.files),
                                          model_max_length=max_len, special_tokens=specials,
                                          add_prefix_space=bool(config.get("add_prefix_space", False)),
                                          trim_offsets=bool(config.get("trim_offsets", True)),
                                          tokenizer_class=config.get("tokenizer_class"))
            if not vocab_file.exists():
                fairseq = _layout(directory, config)
                if path.is_dir() and fairseq.backend == "fairseq_spm" and (directory / fairseq.files[0]).is_file():
                    return cls.from_fairseq_spm(directory / fairseq.files[0], camembert=fairseq is CAMEMBERT_JSON,
                                                add_prefix_space=bool(config.get("add_prefix_space", True)),
                                                model_max_length=max_len, special_tokens=specials)
                if path.is_dir() and all((directory / name).is_file() for name in DEBERTA_SPM.files):
                    return cls.from_deberta_spm(
                        directory / DEBERTA_SPM.files[0], lowercase=bool(config.get("do_lower_case", False)),
                        split_by_punct=bool(config.get("split_by_punct", False)),
                        add_prefix_space=bool(config.get("add_prefix_space", True)),
                        model_max_length=max_len, special_tokens=specials)
                if path.is_dir() and all((directory / name).is_file() for name in UNIGRAM.files):
                    return cls.from_sentencepiece(
                        *(directory / name for name in UNIGRAM.files),
                        lowercase=bool(config.get("do_lower_case", True)),
                        keep_accents=bool(config.get("keep_accents", False)),
                        add_prefix_space=bool(config.get("add_prefix_space", True)),
                        model_max_length=max_len, special_tokens=specials,
                        tokenizer_class=config.get("tokenizer_class"))
                raise FileNotFoundError(f"no tokenizer.json or vocab.txt in {directory}; a BERT "
                                        "tokenizer directory needs one of them (RoBERTa: vocab.json "
                                        "and merges.txt)")
            return cls.from_vocab(vocab_file, model_max_length=max_len, special_tokens=specials,
                                  **settings)

        try:
            backend = Tokenizer.from_file(str(tokenizer_json))
        except Exception as err:  # the Rust side raises plain Exception on malformed files
            raise ValueError(f"cannot read {tokenizer_json}: {err}") from err
        backend.no_truncation()
        backend.no_padding()
        stored = backends.normalizer_state(backend)
        if stored.get("type") == "BertNormalizer":
            current = {"lowercase": stored.get("lowercase", True),
                       "strip_accents": stored.get("strip_accents"),
                       "tokenize_chinese_chars": stored.get("handle_chinese_chars", True)}
            wanted = {**current, **settings}
            if wanted != current:  # the config wins, as BertTokenizerFast lets it
                backend.normalizer = backends.bert_normalizer(**wanted)
        if backend.post_processor is None:
            backends.set_bert_post_processor(backend, specials.get("cls_token", CLS),
                                     specials.get("sep_token", SEP))
        return cls(backend, model_max_length=max_len, special_tokens=specials,
                   tokenizer_class=config.get("tokenizer_class"))

    @classmethod
    def from_bpe_files(cls, vocab_json: str | os.PathLike, merges_txt: str | os.PathLike, *,
                       model_max_length: int = 512, special_tokens: dict[str, str] | None = None,
                       add_prefix_space: bool = False, trim_offsets: bool = True,
                       tokenizer_class: str | None = None) -> "BertTokenizer":
        """RoBERTa's byte-level BPE from vocab.json + merges.txt (`tokenizer_backends.bpe`)."""
        specials = {**BPE.specials, **(special_tokens or {})}
        backend = backends.bpe(vocab_json, merges_txt, specials, add_prefix_space=add_prefix_space,
                               trim_offsets=trim_offsets)
        return cls(backend, model_max_length=model_max_length, special_tokens=specials,
                   tokenizer_class=tokenizer_class or BPE.tokenizer_class)

    @classmethod
    def from_sentencepiece(cls, spiece_model: str | os.PathLike, *, lowercase: bool = True,
                           keep_accents: bool = False, add_prefix_space: bool = True,
                           model_max_length: int = 512, special_tokens: dict[str, str] | None = None,
                           tokenizer_class: str | None = None) -> "BertTokenizer":
        """ALBERT's SentencePiece Unigram model from spiece.model (`tokenizer_backends.unigram`;
        reading the file takes the `albert` extra)."""
        specials = {**UNIGRAM.specials, **(special_tokens or {})}
        backend = backends.unigram(spiece_model, specials, lowercase=lowercase, keep_accents=keep_accents,
                                   add_prefix_space=add_prefix_space)
        return cls(backend, model_max_length=model_max_length, special_tokens=specials,
                   tokenizer_class=tokenizer_class or UNIGRAM.tokenizer_class)

    @classmethod
    def from_deberta_spm(cls, spm_model: str | os.PathLike, *, lowercase: bool = False,
                         split_by_punct: bool = False, add_prefix_space: bool = True, model_max_length: int = 512,
                         special_tokens: dict[str, str] | None = None) -> "BertTokenizer":
        """DeBERTa-v2/v3's SentencePiece Unigram model from spm.model (`tokenizer_backends.deberta_spm`;
        reading the file takes the `deberta` extra)."""
        specials = {**SPECIAL_KEYS, **DEBERTA_SPM.specials, **(special_tokens or {})}
        backend = backends.deberta_spm(spm_model, specials, lowercase=lowercase, split_by_punct=split_by_punct,
                                       add_prefix_space=add_prefix_space)
        return cls(backend, model_max_length=model_max_length, special_tokens=specials,
                   tokenizer_class=DEBERTA_SPM.tokenizer_class)

    @classmethod
    def from_fairseq_spm(cls, spm_model: str | os.PathLike, *, camembert: bool = False, add_prefix_space: bool = True,
                         model_max_length: int = 512, special_tokens: dict[str, str] | None = None) -> "BertTokenizer":
        """XLM-RoBERTa's or CamemBERT's sentencepiece.bpe.model (`tokenizer_backends.fairseq_spm`;
        reading the file takes the `xlm-roberta` extra)."""
        layout = CAMEMBERT_JSON if camembert else XLMR_JSON
        specials = {**layout.specials, **(special_tokens or {})}
        backend = backends.fairseq_spm(spm_model, specials, camembert=camembert, add_prefix_space=add_prefix_space)
        return cls(backend, model_max_length=model_max_length, special_tokens=specials,
                   tokenizer_class=layout.tokenizer_class)

    # -- settings ------------------------------------------------------------------------------
    @property
    def do_lower_case(self) -> bool:
        return bool(backends.normalizer_state(self.backend).get("lowercase", False))

    @property
    def strip_accents(self) -> bool | None:
        return backends.normalizer_state(self.backend).get("strip_accents")

    @property
    def tokenize_chinese_chars(self) -> bool:
        return bool(backends.normalizer_state(self.backend).get("handle_chinese_chars", False))

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return (f"BertTokenizer(vocab_size={self.vocab_size}, do_lower_case={self.do_lower_case}, "
                f"model_max_length={self.model_max_length})")

    def get_vocab(self) -> dict[str, int]:
        """token → id for the whole vocabulary (added tokens included)."""
        return self.backend.get_vocab(with_added_tokens=True)

    # -- encoding ------------------------------------------------------------------------------
    def tokenize(self, text: str) -> list[str]:
        """WordPiece tokens of `text`, without [CLS]/[SEP] and without truncation."""
        self._set_truncation(None)
        self._set_padding(None)
        return self.backend.encode(_check_text(text, "text"), add_special_tokens=False).tokens

    def encode(self, text: str, text_pair: str | None = None, *, max_length: int | None = None,
               truncation: bool = True) -> Encoding:
        """Encode one text, or a pair as [CLS] A [SEP] B [SEP], unpadded.

        With truncation, max_length defaults to model_max_length and pairs lose tokens from the
        longer side first.
        """
        return self.encode_batch([text], None if text_pair is None else [text_pair],
                                 max_length=max_length, truncation=truncation)[0]

    def encode_batch(self, texts: Sequence[str], text_pairs: Sequence[str] | None = None, *,
                     max_length: int | None = None, truncation: bool = True) -> list[Encoding]:
        """`encode` for many texts at once (the backend uses all cores); unpadded."""
        inputs = self._inputs(texts, text_pairs)
        self._set_truncation(self._resolve_max_length(max_length) if truncation else None)
        self._set_padding(None)
        return [_to_encoding(e) for e in self._run_backend(inputs)]

    def encode_raw(self, texts: Sequence[str], text_pairs: Sequence[str] | None = None, *,
                   max_length: int | None = None) -> list[Any]:
        """`tokenizers.Encoding`s as the backend makes them (ids, type_ids, offsets, word_ids,
        and `overflowing` non-empty where truncation at max_length cut a text), unpadded.

        For the inference engine: skips the conversion to `Encoding` dataclasses that
        `encode_batch` does, which costs as much as tokenizing short texts.
        """
        inputs = self._inputs(texts, text_pairs)
        self._set_truncation(self._resolve_max_length(max_length))
        self._set_padding(None)
        return self._run_backend(inputs)

    def __call__(self, texts: str | Sequence[str], text_pairs: str | Sequence[str] | None = None,
                 *, max_length: int | None = 512, truncation: bool = True,
                 padding: bool | Literal["longest", "max_length"] = True,
                 return_offsets: bool = False,
                 return_tensors: Literal["pt"] | None = "pt") -> dict[str, Any]:
        """Encode a batch for a model.

        Returns {"input_ids": (B, T) long, "token_type_ids": (B, T) long, "attention_mask":
        (B, T) long with 1 = token and 0 = padding, and with return_offsets "offset_mapping":
        (B, T, 2) long character spans}. padding=True pads to the longest sequence of the batch,
        "max_length" to max_length, False not at all. Pairs are truncated longest side first.
        return_tensors=None gives lists of lists instead of torch tensors.
        """
        texts = [texts] if isinstance(texts, str) else texts
        if isinstance(text_pairs, str):
            text_pairs = [text_pairs]
        inputs = self._inputs(texts, text_pairs)
        limit = self._resolve_max_length(max_length)
        self._set_truncation(limit if truncation else None)
        if padding is True or padding == "longest":
            self._set_padding(("longest", None))
        elif padding == "max_length":
            self._set_padding(("max_length", limit))
        elif padding is False:
            self._set_padding(None)
        else:
            raise ValueError(f"padding={padding!r} is not one of True, False, 'longest', "
                             "'max_length'")
        encodings = self._run_backend(inputs)
        batch: dict[str, Any] = {
            "input_ids": [e.ids for e in encodings],
            "token_type_ids": [e.type_ids for e in encodings],
            "attention_mask": [e.attention_mask for e in encodings],
        }
        if return_offsets:
            batch["offset_mapping"] = [[list(span) for span in e.offsets] for e in encodings]
        if return_tensors is None:
            return batch
        if return_tensors != "pt":
            raise ValueError(f"return_tensors={return_tensors!r} is not supported; use 'pt' or "
                             "None")
        lengths = {len(ids) for ids in batch["input_ids"]}
        if len(lengths) > 1:
            raise ValueError(f"sequences have different lengths {sorted(lengths)}: pass "
                             "padding=True to pad them, or return_tensors=None for lists")
        import torch  # imported here so data preparation workers never pay for torch

        return {key: torch.tensor(value, dtype=torch.long) for key, value in batch.items()}

    # -- ids and text --------------------------------------------------------------------------
    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | list[int]:
        """Ids of tokens; tokens not in the vocabulary map to the [UNK] id."""
        if isinstance(tokens, str):
            token_id = self.backend.token_to_id(tokens)
            return self.unk_token_id if token_id is None else token_id
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def convert_ids_to_tokens(self, ids: int | Iterable[int], skip_special_tokens: bool = False
                              ) -> str | list[str]:
        """Tokens of ids; an id outside the vocabulary is a ValueError naming it."""
        if isinstance(ids, int) or (hasattr(ids, "ndim") and ids.ndim == 0):
            return self._id_to_token(int(ids))
        return [self._id_to_token(int(i)) for i in _as_int_list(ids)
                if not (skip_special_tokens and int(i) in self.special_ids)]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        """Text of a sequence of ids (list, numpy array or 1-D tensor), `##` pieces joined."""
        return self.backend.decode(_as_int_list(ids), skip_special_tokens=skip_special_tokens)

    # -- persistence ---------------------------------------------------------------------------
    def save_pretrained(self, out_dir: str | os.PathLike) -> Path:
        """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json, and the
        model's own vocabulary files: vocab.txt (WordPiece) or vocab.json + merges.txt (BPE).

        Each file is written atomically; existing tokenizer files in out_dir are replaced (the
        caller chose the directory). The result loads in the transformers tokenizer named by
        `tokenizer_class` (BertTokenizerFast for BERT) with the same ids.
        """
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        model = json.loads(self.backend.model.__getstate__())
        if model.get("type") == "WordPiece":
            vocab = self.get_vocab()
            by_id = sorted(vocab.items(), key=lambda kv: kv[1])
            if [i for _, i in by_id] != list(range(len(by_id))):
                raise ValueError("vocabulary ids have gaps, which vocab.txt (id = line number) "
                                 "cannot express; give the vocabulary ids 0..V-1")
            atomic_write_text(out / "vocab.txt", "".join(f"{tok}\n" for tok, _ in by_id))
        elif model.get("type") == "BPE":
            atomic_write_json(out / "vocab.json", model["vocab"])
            merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
            atomic_write_text(out / "merges.txt", "#version: 0.2\n" + "".join(f"{m}\n" for m in merges))
        atomic_write_text(out / "tokenizer.json", _clean_backend(self.backend).to_str(pretty=True))
        settings: dict[str, Any] = {"tokenizer_class": self.tokenizer_class}
        if backends.normalizer_state(self.backend).get("type") == "BertNormalizer":
            settings.update(do_lower_case=self.do_lower_case, strip_accents=self.strip_accents,
                            tokenize_chinese_chars=self.tokenize_chinese_chars)
        atomic_write_json(out / "tokenizer_config.json", {
            **settings,
            "model_max_length": self.model_max_length,
            **self.special_tokens,
        })
        atomic_write_json(out / "special_tokens_map.json", dict(self.special_tokens))
        return out

    def fingerprint(self) -> str:
        """Stable hex digest of what decides the ids: vocabulary, normalisation, special tokens.

        Two tokenizers with the same fingerprint encode every text identically, however they were
        loaded (vocab.txt or tokenizer.json).
        """
        state = backends.normalizer_state(self.backend)
        if state.get("type") == "BertNormalizer":
            lowercase = bool(state.get("lowercase"))
            strip = state.get("strip_accents")
            normalisation = {"type": "BertNormalizer", "clean_text": state.get("clean_text"),
                             "lowercase": lowercase,
                             # None means "follow lowercase": hash the effective behaviour.
                             "strip_accents": lowercase if strip is None else bool(strip),
                             "handle_chinese_chars": state.get("handle_chinese_chars")}
        else:
            normalisation = state
        model = json.loads(self.backend.model.__getstate__())
        payload = {
            "vocab": [tok for tok, _ in sorted(self.get_vocab().items(), key=lambda kv: kv[1])],
            "normalizer": normalisation,
            "pre_tokenizer": backends.component_state(self.backend.pre_tokenizer),
            "model": {k: model.get(k) for k in ("type", "unk_token", "continuing_subword_prefix",
                                                 "max_input_chars_per_word")},
            "special": {k: self.special_tokens[k] for k in sorted(self.special_tokens)},
        }
        if model.get("type") != "WordPiece":  # BPE merges / Unigram scores decide ids too
            payload["model"]["pieces"] = model.get("merges", model.get("vocab"))
            payload["post_processor"] = backends.component_state(self.backend.post_processor)
        blob = json.dumps(payload, sort_keys=True, ensure_ascii=False).encode("utf-8")
        return hashlib.sha256(blob).hexdigest()[:16]

    # -- internals -----------------------------------------------------------------------------
    def _id_to_token(self, token_id: int) -> str:
        token = self.backend.id_to_token(token_id)
        if token is None:
            raise ValueError(f"token id {token_id} is outside the vocabulary (size "
                             f"{self.vocab_size}); was it produced with another tokenizer?")
        return token

    def _resolve_max_length(self, max_length: int | None) -> int:
        limit = self.model_max_length if max_length is None else int(max_length)
        if limit < 1:
            raise ValueError(f"max_length {max_length} must be at least 1")
        return limit

    @staticmethod
    def _inputs(texts: Sequence[str], text_pairs: Sequence[str] | None) -> list:
        if isinstance(texts, str) or not isinstance(texts, Sequence):
            texts = list(texts)
        if len(texts) == 0:
            raise ValueError("no texts to tokenize: got an empty list")
        firsts = [_check_text(t, f"texts[{i}]") for i, t in enumerate(texts)]
        if text_pairs is None:
            return firsts
        text_pairs = list(text_pairs)
        if len(text_pairs) != len(firsts):
            raise ValueError(f"got {len(firsts)} texts but {len(text_pairs)} text_pairs; pass one "
                             "pair text per text")
        seconds = [_check_text(t, f"text_pairs[{i}]") for i, t in enumerate(text_pairs)]
        return list(zip(firsts, seconds))

    def _run_backend(self, inputs: list) -> list:
        try:
            return self.backend.encode_batch(inputs, add_special_tokens=True)
        except Exception as err:  # e.g. a max_length too short for a pair's special tokens
            raise ValueError(f"tokenization failed: {err}") from err

    def _set_truncation(self, max_length: int | None) -> None:
        if self._truncation == (max_length,):
            return
        if max_length is None:
            self.backend.no_truncation()
        else:
            self.backend.enable_truncation(max_length, strategy="longest_first")
        self._truncation = (max_length,)

    def _set_padding(self, mode: tuple[str, int | None] | None) -> None:
        if self._padding == (mode,):
            return
        if mode is None:
            self.backend.no_padding()
        else:
            self.backend.enable_padding(pad_id=self.pad_token_id, pad_type_id=0,
                                        pad_token=self.special_tokens["pad_token"], length=mode[1])
        self._padding = (mode,)


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def _clean_backend(backend: Tokenizer) -> Tokenizer:
    """A copy without the per-call truncation/padding state, for saving and hashing."""
    copy = Tokenizer.from_str(backend.to_str())
    copy.no_truncation()
    copy.no_padding()
    return copy


def _to_encoding(e: Any) -> Encoding:
    return Encoding(ids=e.ids, type_ids=e.type_ids, tokens=e.tokens, offsets=e.offsets,
                    word_ids=e.word_ids, sequence_ids=e.sequence_ids,
                    special_tokens_mask=e.special_tokens_mask)


def _check_text(text: Any, name: str) -> str:
    if not isinstance(text, str):
        raise ValueError(f"{name} is a {type(text).__name__}, not a str; pass text strings")
    return text


def _as_int_list(ids: Iterable[int]) -> list[int]:
    if hasattr(ids, "tolist"):  # numpy array or torch tensor
        ids = ids.tolist()
    return [int(i) for i in ids]


def _layout(directory: Path, tokenizer_config: dict) -> TokenizerLayout:
    """The tokenizer of the directory's family (its special tokens), from tokenizer_class or
    config.json's model_type (`families.tokenizer_layout`)."""
    try:
        model_type = _read_json_if_exists(directory / "config.json").get("model_type")
    except ValueError:  # a broken config.json is reported by whoever loads the model
        model_type = None
    return tokenizer_layout(tokenizer_config.get("tokenizer_class"), model_type)


def _read_json_if_exists(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from err
    if not isinstance(value, dict):
        raise ValueError(f"{path} should hold a JSON object, found {type(value).__name__}")
    return value
