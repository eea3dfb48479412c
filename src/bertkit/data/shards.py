"""Prepared pre-training data: `prepare` writes it once, `PretrainingData` / `PretrainingBatches`
read it, memory-mapped, as batches for the trainer.

DATA_DIR layout (all arrays are .npy files, memory-mapped when read):

    meta.json                    written last: a directory without it is not valid data
    tokenizer/                   the tokenizer the ids belong to (vocab.txt, tokenizer.json, ...)
    train/shard-00000/           up to `shard_size` instances per shard
        input_ids.npy            (N,) uint16 when the vocabulary fits, else int32: all tokens
        offsets.npy              (n + 1,) int64: instance i is input_ids[offsets[i]:offsets[i + 1]]
        segment_b.npy            (n,) int32: position of segment B's first token (= length if none)
        nsp_labels.npy           (n,) int8: 0 IsNext, 1 NotNext, -100 without NSP
        word_starts.npy          (N,) bool, whole-word masking with dynamic masks only
        masked_ids.npy           (N,) static masking only: the input the model sees
        mlm_selected.npy         (N,) bool, static masking only: positions to predict
    eval/shard-00000/ ...        held-out documents (same layout), when eval_fraction > 0

Determinism: the same corpus, tokenizer and settings give byte-identical files. Documents are
split into train/eval by a seeded permutation; instance creation uses seeded generators; static
masks and the dynamic mask of instance i at epoch e are functions of (seed, e, i) only
(`bertkit.data.masking`), so a batch is the same whichever worker, rank or run builds it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from bertkit.data.corpus import Corpus, as_corpus
from bertkit.data.instances import (IS_NEXT, Instance, TokenizedDocuments,
                                    create_nsp_instances, create_packed_instances, create_sop_instances,
                                    tokenize_documents)
from bertkit.data.masking import IGNORE_INDEX, default_max_predictions, mask_keys, mask_tokens
from bertkit.fileio import atomic_path, atomic_write_json, check_writable_output
from bertkit.tokenizer import TOKENIZER_FILES, BertTokenizer

logger = logging.getLogger(__name__)

FORMAT_NAME = "bertkit-pretraining-data"
FORMAT_VERSION = 1
SPLITS = ("train", "eval")
# Instances per shard: ~30 MB of uint16 tokens at 128 tokens each; bounds memory while writing.
DEFAULT_SHARD_SIZE = 1 << 17
# What the sentence-pair labels are: none (packed sentences), NSP pairs, or SOP pairs.
OBJECTIVES = ("mlm", "mlm+nsp", "mlm+sop")
# Static masks are drawn with this pseudo-epoch, apart from every dynamic epoch (0, 1, 2, ...).
_STATIC_EPOCH = -1
# Batches pad to a multiple of 8 tokens: tensor-core friendly, and few distinct shapes to compile.
PAD_MULTIPLE = 8


# ---------------------------------------------------------------------------------------------
# prepare
# ---------------------------------------------------------------------------------------------
@dataclass
class PrepareStats:
    """What `prepare` wrote. Counts are per split ("train", "eval")."""

    out_dir: Path
    documents: dict[str, int]
    sentences: dict[str, int]
    tokens: dict[str, int]
    instances: dict[str, int]
    is_next_fraction: float | None  # share of IsNext among NSP instances (None without NSP)
    corpus: dict[str, Any]
    # read, tokenize, instances (building them and writing the shards), total
    seconds: dict[str, float] = field(default_factory=dict)
    # Documents too large for the held-out share, cut into sections (see `_cut_large_documents`):
    # {"documents", "sections", "max_tokens"}; None when nothing was cut.
    sections: dict[str, int] | None = None
    objective: str = "mlm+nsp"  # mlm | mlm+nsp | mlm+sop; with SOP, is_next_fraction is the in-order share

    @property
    def tokens_per_second(self) -> float:
        return sum(self.tokens.values()) / max(self.seconds.get("total", 0.0), 1e-9)

    def summary(self) -> str:
        lines = [f"prepared {self.out_dir}"]
        for split in self.instances:
            lines.append(f"  {split:5}: {self.documents[split]} documents, {self.sentences[split]} "
                         f"sentences, {self.tokens[split]} tokens -> {self.instances[split]} "
                         "instances")
        if self.sections:
            s = self.sections
            lines.append(f"  held-out split: {s['documents']} documents of more than {s['max_tokens']} "
                         f"tokens were cut at sentence boundaries into {s['sections']} sections, "
                         "each counted as a document above, so that the held-out share of tokens "
                         "is near eval_fraction")
        if self.is_next_fraction is not None:
            kind = "in-order (SOP label 0)" if self.objective == "mlm+sop" else "IsNext"
            lines.append(f"  {kind} share: {self.is_next_fraction:.3f}")
        skipped = self.corpus.get("skipped") or {}
        if skipped:
            lines.append(f"  skipped input: {', '.join(f'{n} {k}' for k, n in skipped.items())}")
        lines.append("  time: " + ", ".join(f"{k} {v:.2f}s" for k, v in self.seconds.items())
                     + f" ({self.tokens_per_second:,.0f} tokens/s)")
        return "\n".join(lines)


def prepare(corpus: Corpus | str | os.PathLike | Sequence[str | os.PathLike],
            tokenizer_dir: str | os.PathLike, out_dir: str | os.PathLike, *,
            max_seq_len: int = 128, nsp: bool = True, objective: str | None = None,
            short_seq_prob: float = 0.1,
            whole_word_mask: bool = False, static_masking: bool = False, dupe_factor: int = 1,
            mlm_probability: float = 0.15, max_predictions_per_seq: int | None = None,
            eval_fraction: float = 0.01, seed: int = 12345, workers: int = 1,
            shard_size: int = DEFAULT_SHARD_SIZE, overwrite: bool = False,
            corpus_format: str = "auto", text_field: str = "text",
            progress: bool = True) -> PrepareStats:
    """Tokenize a corpus once and write pre-training instances as memory-mapped shards.

    corpus: a `Corpus` or source(s) for `load_corpus` (files, directories, globs, builtin:NAME).
    nsp=True builds BERT's sentence pairs with NSP labels; False packs full sentences (RoBERTa).
    objective, when given, decides instead: "mlm+nsp" (nsp=True), "mlm" (nsp=False), or "mlm+sop":
    ALBERT's sentence-order pairs, labels stored where NSP's are (meta.json "nsp" is then true,
    "objective" says which).
    dupe_factor: passes over the corpus, each with its own random pairs (and static masks).
    static_masking fixes the masks here (mlm_probability, max_predictions_per_seq, default
    round(max_seq_len × mlm_probability)); otherwise `PretrainingBatches` draws new ones each epoch.
    whole_word_mask: WordPiece words, and jieba words for Chinese, are masked as a whole.
    eval_fraction of the documents (at least one when > 0) is held out as the "eval" split. A
    document of more than that share of the tokens (a whole file in `format="paragraphs"`)
    is first cut at sentence boundaries into sections that each count as a document, so that the
    held-out share of tokens stays near eval_fraction; the summary says so.
    workers: processes for Chinese word segmentation; tokenization uses the tokenizer's threads.
    Refuses a non-empty out_dir unless overwrite=True (then only our own files there are replaced).
    """
    started = time.perf_counter()
    if objective is None:
        objective = "mlm+nsp" if nsp else "mlm"
    elif not nsp and objective != "mlm":
        raise ValueError(f"--no-nsp (packed sentences) contradicts objective {objective}; pass one of them")
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; choose one of {', '.join(OBJECTIVES)}")
    nsp = objective != "mlm"  # sentence-pair labels present (NSP or SOP)
    _check_prepare_args(max_seq_len, short_seq_prob, dupe_factor, mlm_probability,
                        max_predictions_per_seq, eval_fraction, workers, shard_size)
    out = Path(out_dir)
    _check_out_dir(out, overwrite)  # refuse now, before minutes of work, but clear only later
    tokenizer = BertTokenizer.from_pretrained(tokenizer_dir)
    seconds: dict[str, float] = {}

    tick = time.perf_counter()
    corpus = as_corpus(corpus, format=corpus_format, text_field=text_field)
    seconds["read"] = time.perf_counter() - tick

    tick = time.perf_counter()
    with _Progress(progress, "tokenizing", "tok") as bar:
        docs = tokenize_documents(corpus.documents, tokenizer, whole_word_mask=whole_word_mask,
                                  workers=workers, on_tokens=bar.update)
    if docs.num_documents == 0:
        raise ValueError(f"no document of {corpus.stats.summary()} has any token; is the tokenizer "
                         f"at {tokenizer_dir} meant for this text?")
    seconds["tokenize"] = time.perf_counter() - tick

    tick = time.perf_counter()
    _clear_out_dir(out)
    token_dtype = np.uint16 if tokenizer.vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32
    settings = {"max_seq_len": max_seq_len, "nsp": nsp, "objective": objective, "short_seq_prob": short_seq_prob,
                "whole_word_mask": whole_word_mask, "static_masking": static_masking,
                "dupe_factor": dupe_factor, "mlm_probability": mlm_probability,
                "max_predictions_per_seq": max_predictions_per_seq,
                "eval_fraction": eval_fraction, "seed": seed}
    masker = _StaticMasker(tokenizer, settings) if static_masking else None
    docs, sections = _cut_large_documents(docs, eval_fraction)
    split_docs = _split_documents(docs.num_documents, eval_fraction, seed)
    splits_meta: dict[str, Any] = {}
    counts: dict[str, dict[str, int]] = {k: {} for k in ("documents", "sentences", "tokens",
                                                          "instances", "is_next")}
    for split, doc_ids in split_docs.items():
        part = docs.subset(doc_ids)
        writer = _ShardWriter(out / split, token_dtype, shard_size, masker,
                              keep_word_starts=whole_word_mask and not static_masking)
        for dupe in range(dupe_factor):
            rng = random.Random(_derive_seed(seed, "instances", split, dupe))
            for instance in _instances(part, objective, max_seq_len, short_seq_prob, rng, tokenizer):
                writer.add(instance)
        splits_meta[split] = writer.close()
        counts["documents"][split] = part.num_documents
        counts["sentences"][split] = part.num_sentences
        counts["tokens"][split] = part.num_tokens
        counts["instances"][split] = splits_meta[split]["num_instances"]
        counts["is_next"][split] = writer.is_next
    seconds["instances"] = time.perf_counter() - tick

    tokenizer.save_pretrained(out / "tokenizer")
    meta = {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "nsp": nsp,
        "objective": objective,
        "max_seq_len": max_seq_len,
        "vocab_size": tokenizer.vocab_size,
        "token_dtype": np.dtype(token_dtype).name,
        "tokenizer": {"fingerprint": tokenizer.fingerprint(), "source": str(tokenizer_dir)},
        "special_token_ids": {"pad": tokenizer.pad_token_id, "unk": tokenizer.unk_token_id,
                              "cls": tokenizer.cls_token_id, "sep": tokenizer.sep_token_id,
                              "mask": tokenizer.mask_token_id},
        "special_ids": sorted(tokenizer.special_ids),
        "settings": settings,
        "counts": counts,
        "sections": sections,
        "corpus": corpus.stats.to_dict(),
        "splits": splits_meta,
    }
    atomic_write_json(out / "meta.json", meta)  # last: only now does the directory load
    seconds["total"] = time.perf_counter() - started
    n_nsp = sum(counts["instances"].values()) if nsp else 0
    return PrepareStats(
        out_dir=out, documents=counts["documents"], sentences=counts["sentences"],
        tokens=counts["tokens"], instances=counts["instances"],
        is_next_fraction=(sum(counts["is_next"].values()) / n_nsp) if n_nsp else None,
        corpus=corpus.stats.to_dict(), seconds=seconds, sections=sections, objective=objective)


def _check_prepare_args(max_seq_len: int, short_seq_prob: float, dupe_factor: int,
                        mlm_probability: float, max_predictions: int | None, eval_fraction: float,
                        workers: int, shard_size: int) -> None:
    if max_seq_len < 8:
        raise ValueError(f"max_seq_len {max_seq_len} is too short for pre-training; use at least 8 "
                         "(BERT: 128, then 512)")
    if not 0.0 <= short_seq_prob <= 1.0:
        raise ValueError(f"short_seq_prob {short_seq_prob} must be in [0, 1] (BERT: 0.1)")
    if dupe_factor < 1:
        raise ValueError(f"dupe_factor {dupe_factor} must be at least 1")
    if not 0.0 < mlm_probability < 1.0:
        raise ValueError(f"mlm_probability {mlm_probability} must be between 0 and 1 (BERT: 0.15)")
    if max_predictions is not None and max_predictions < 1:
        raise ValueError(f"max_predictions_per_seq {max_predictions} must be at least 1")
    if not 0.0 <= eval_fraction < 1.0:
        raise ValueError(f"eval_fraction {eval_fraction} must be in [0, 1) (e.g. 0.01)")
    if workers < 1:
        raise ValueError(f"workers {workers} must be at least 1")
    if shard_size < 1:
        raise ValueError(f"shard_size {shard_size} must be at least 1")


def _check_out_dir(out: Path, overwrite: bool) -> None:
    """Refuse a file, a non-empty directory unless overwrite, and with overwrite any directory
    where replacing our files would touch something that is not ours."""
    check_writable_output(out, overwrite=None, kind="dir")
    if not out.exists() or not any(out.iterdir()):
        return
    if not overwrite:
        raise FileExistsError(f"{out} is not empty; choose a new directory or pass --overwrite")
    for path in _our_paths(out):
        if path.is_dir() and not all(_is_ours(path.name, entry) for entry in path.iterdir()):
            raise FileExistsError(f"{path} holds files prepare did not write; --overwrite "
                                  "replaces prepared data only, so choose another directory")


def _our_paths(out: Path) -> list[Path]:
    return [out / name for name in (*SPLITS, "tokenizer")]


def _is_ours(parent: str, entry: Path) -> bool:
    if entry.name.startswith(".") and entry.name.endswith(".tmp"):  # left by an interrupted write
        return True
    if parent == "tokenizer":
        return entry.name in TOKENIZER_FILES
    return entry.is_dir() and re.fullmatch(r"shard-\d{5}", entry.name) is not None


def _clear_out_dir(out: Path) -> None:
    """Remove what an earlier prepare wrote there (nothing else), and make sure out exists."""
    # meta.json first: if we are interrupted below, the directory no longer loads as valid.
    (out / "meta.json").unlink(missing_ok=True)
    for path in _our_paths(out):
        if path.is_dir():
            shutil.rmtree(path)
    out.mkdir(parents=True, exist_ok=True)


def _derive_seed(*parts: Any) -> int:
    """An independent 64-bit seed per purpose, stable across runs and Python versions."""
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "little")


def _cut_large_documents(docs: TokenizedDocuments,
                         eval_fraction: float) -> tuple[TokenizedDocuments, dict[str, int] | None]:
    """Cut documents too large for a held-out split near `eval_fraction` into sections.

    The split holds out whole documents, so a document of more than the eval share of the tokens
    overshoots it: three files read as three documents (`format="paragraphs"`) with
    eval_fraction 0.01 held out 42% of the tokens. A document of more than the eval share is
    cut at sentence boundaries into sections of at most that many tokens (a longer sentence stays
    whole); each section is then a document, for the split and for NSP, whose "next sentence"
    never crosses a cut. Corpora of many ordinary documents are left as they are.
    Returns (documents, {"documents": cut, "sections": made, "max_tokens": limit} or None).
    """
    if eval_fraction <= 0 or docs.num_documents == 0:
        return docs, None
    limit = max(1, int(eval_fraction * docs.num_tokens))
    lengths = np.diff(docs.sentence_offsets)  # (S,) tokens per sentence
    offsets, n_cut, n_sections = [0], 0, 0
    for d in range(docs.num_documents):
        sentences = docs.sentence_range(d)
        if int(lengths[sentences.start:sentences.stop].sum()) <= limit:
            offsets.append(sentences.stop)
            continue
        n_cut += 1
        size = 0
        for s in sentences:
            if size and size + lengths[s] > limit:  # close the section before this sentence
                offsets.append(s)
                n_sections += 1
                size = 0
            size += int(lengths[s])
        offsets.append(sentences.stop)
        n_sections += 1
    if not n_cut:
        return docs, None
    cut = TokenizedDocuments(docs.token_ids, docs.sentence_offsets,
                             np.asarray(offsets, dtype=np.int64), docs.word_starts)
    logger.info("held-out split: %d documents of more than %d tokens cut into %d sections",
                n_cut, limit, n_sections)
    return cut, {"documents": n_cut, "sections": n_sections, "max_tokens": limit}


def _split_documents(num_documents: int, eval_fraction: float, seed: int) -> dict[str, list[int]]:
    """Held-out documents by a seeded permutation; both lists in corpus order."""
    num_eval = 0
    if eval_fraction > 0 and num_documents >= 2:
        num_eval = min(num_documents - 1, max(1, round(num_documents * eval_fraction)))
    elif eval_fraction > 0:
        logger.warning("one document only: no eval split held out")
    order = list(range(num_documents))
    random.Random(_derive_seed(seed, "split")).shuffle(order)
    held_out = set(order[:num_eval])
    splits = {"train": [d for d in range(num_documents) if d not in held_out]}
    if num_eval:
        splits["eval"] = sorted(held_out)
    return splits


def _instances(docs: TokenizedDocuments, objective: str, max_seq_len: int, short_seq_prob: float,
               rng: random.Random, tokenizer: BertTokenizer) -> Iterable[Instance]:
    if objective == "mlm+sop":
        return create_sop_instances(docs, max_seq_len=max_seq_len, short_seq_prob=short_seq_prob,
                                    rng=rng, cls_id=tokenizer.cls_token_id,
                                    sep_id=tokenizer.sep_token_id)
    if objective == "mlm+nsp":
        return create_nsp_instances(docs, max_seq_len=max_seq_len, short_seq_prob=short_seq_prob,
                                    rng=rng, cls_id=tokenizer.cls_token_id,
                                    sep_id=tokenizer.sep_token_id)
    # Each pass packs the documents in its own order, so sequence boundaries differ between passes.
    order = list(range(docs.num_documents))
    rng.shuffle(order)
    return create_packed_instances(docs, max_seq_len=max_seq_len, cls_id=tokenizer.cls_token_id,
                                   sep_id=tokenizer.sep_token_id, document_order=order)


class _Progress:
    """A tqdm bar (tokens/s) when asked for, else a no-op with the same `update`."""

    def __init__(self, enabled: bool, desc: str, unit: str):
        self.bar = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(desc=desc, unit=unit, unit_scale=True, disable=None)

    def update(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def __enter__(self) -> "_Progress":
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.close()


class _StaticMasker:
    """Masks fixed at prepare time, drawn as the dynamic ones would be at a reserved epoch."""

    # Instances masked per vectorised call.
    chunk = 1024

    def __init__(self, tokenizer: BertTokenizer, settings: dict[str, Any]):
        self.special = _special_table(tokenizer.vocab_size, tokenizer.special_ids)
        self.replacement = np.flatnonzero(~self.special)
        self.pad_id = tokenizer.pad_token_id
        self.mask_id = tokenizer.mask_token_id
        self.seed = settings["seed"]
        self.mlm_probability = settings["mlm_probability"]
        self.max_predictions = settings["max_predictions_per_seq"] or default_max_predictions(
            settings["max_seq_len"], settings["mlm_probability"])

    def __call__(self, instances: Sequence[Instance], first_index: int
                 ) -> tuple[np.ndarray, np.ndarray]:
        """(masked ids, selected) of the instances, each flat over all their tokens in order."""
        masked_parts, selected_parts = [], []
        for lo in range(0, len(instances), self.chunk):
            part = instances[lo:lo + self.chunk]
            batch = collate(part, pad_id=self.pad_id, pad_to_multiple_of=1)
            special = self.special[batch["input_ids"]] | (batch["attention_mask"] == 0)  # (b, T)
            keys = mask_keys(self.seed, _STATIC_EPOCH,
                             np.arange(first_index + lo, first_index + lo + len(part)))
            has_words = part[0].word_starts is not None
            masked = mask_tokens(batch["input_ids"], special, keys, mask_token_id=self.mask_id,
                                 replacement_ids=self.replacement,
                                 mlm_probability=self.mlm_probability,
                                 max_predictions=self.max_predictions,
                                 word_starts=batch["word_starts"] if has_words else None)
            real = batch["attention_mask"].astype(bool)  # row-major: instance by instance
            masked_parts.append(masked.input_ids[real])
            selected_parts.append(masked.labels[real] != IGNORE_INDEX)
        return np.concatenate(masked_parts), np.concatenate(selected_parts)


class _ShardWriter:
    """Collects instances of one split and writes them shard by shard, each file atomically."""

    def __init__(self, split_dir: Path, token_dtype: type, shard_size: int,
                 masker: _StaticMasker | None, keep_word_starts: bool):
        self.split_dir = split_dir
        self.token_dtype = token_dtype
        self.shard_size = shard_size
        self.masker = masker
        self.keep_word_starts = keep_word_starts
        self.shards: list[dict[str, Any]] = []
        self.num_instances = 0
        self.is_next = 0
        self._reset()

    def _reset(self) -> None:
        self.ids: list[np.ndarray] = []
        self.segment_b: list[int] = []
        self.nsp: list[int] = []
        self.word_starts: list[np.ndarray] = []
        self.instances: list[Instance] = []  # kept only for static masking at flush time

    def add(self, instance: Instance) -> None:
        self.ids.append(instance.input_ids)
        self.segment_b.append(instance.segment_b_start)
        self.nsp.append(instance.nsp_label)
        self.is_next += instance.nsp_label == IS_NEXT
        if self.keep_word_starts:
            self.word_starts.append(instance.word_starts)
        if self.masker is not None:
            self.instances.append(instance)
        self.num_instances += 1
        if len(self.ids) == self.shard_size:
            self._flush()

    def _flush(self) -> None:
        if not self.ids:
            return
        name = f"shard-{len(self.shards):05d}"
        shard_dir = self.split_dir / name
        shard_dir.mkdir(parents=True, exist_ok=True)
        lengths = [len(ids) for ids in self.ids]
        arrays = {
            "input_ids": np.concatenate(self.ids).astype(self.token_dtype),
            "offsets": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
            "segment_b": np.asarray(self.segment_b, dtype=np.int32),
            "nsp_labels": np.asarray(self.nsp, dtype=np.int8),
        }
        if self.keep_word_starts:
            arrays["word_starts"] = np.concatenate(self.word_starts).astype(bool)
        if self.masker is not None:
            masked, selected = self.masker(self.instances, self.num_instances - len(self.ids))
            arrays["masked_ids"] = masked.astype(self.token_dtype)
            arrays["mlm_selected"] = selected
        for key, array in arrays.items():
            with atomic_path(shard_dir / f"{key}.npy") as tmp, open(tmp, "wb") as f:
                np.save(f, array, allow_pickle=False)
        self.shards.append({"dir": f"{self.split_dir.name}/{name}", "num_instances": len(lengths),
                            "num_tokens": int(sum(lengths))})
        self._reset()

    def close(self) -> dict[str, Any]:
        self._flush()
        return {"num_instances": self.num_instances,
                "num_tokens": sum(s["num_tokens"] for s in self.shards),
                "arrays": _array_names(self.keep_word_starts, self.masker is not None),
                "shards": self.shards}


def _array_names(word_starts: bool, static: bool) -> list[str]:
    names = ["input_ids", "offsets", "segment_b", "nsp_labels"]
    if word_starts:
        names.append("word_starts")
    if static:
        names += ["masked_ids", "mlm_selected"]
    return names


def _special_table(vocab_size: int, special_ids: Iterable[int]) -> np.ndarray:
    """(V,) bool: True for special token ids."""
    table = np.zeros(vocab_size, dtype=bool)
    table[list(special_ids)] = True
    return table


# ---------------------------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------------------------
class PretrainingData:
    """One split of a prepared data directory, memory-mapped.

    Attributes: meta (meta.json), num_instances, nsp, max_seq_len, vocab_size, tokenizer_dir
    (DATA_DIR/tokenizer, to copy into checkpoints), static_masking, whole_word_mask.
    tokenizer: a BertTokenizer or tokenizer directory to check against the data: a different
    fingerprint is a ValueError naming both directories.
    """

    def __init__(self, data_dir: str | os.PathLike, split: str = "train",
                 tokenizer: BertTokenizer | str | os.PathLike | None = None):
        self.data_dir = Path(data_dir)
        meta_path = self.data_dir / "meta.json"
        if not meta_path.exists():
            raise FileNotFoundError(f"{self.data_dir} is not prepared data (no meta.json; an "
                                    "interrupted prepare leaves none); run `bertkit prepare`")
        self.meta: dict[str, Any] = json.loads(meta_path.read_text(encoding="utf-8"))
        if self.meta.get("format") != FORMAT_NAME or self.meta.get("version") != FORMAT_VERSION:
            raise ValueError(f"{meta_path} is not {FORMAT_NAME} version {FORMAT_VERSION}; "
                             "re-run `bertkit prepare`")
        if split not in self.meta["splits"]:
            raise ValueError(f"{self.data_dir} has no split {split!r}; it has "
                             f"{', '.join(self.meta['splits'])}")
        self.split = split
        self.nsp: bool = self.meta["nsp"]
        # Data written before objectives existed had NSP pairs or packed sentences.
        self.objective: str = self.meta.get("objective", "mlm+nsp" if self.nsp else "mlm")
        self.max_seq_len: int = self.meta["max_seq_len"]
        self.vocab_size: int = self.meta["vocab_size"]
        self.static_masking: bool = self.meta["settings"]["static_masking"]
        self.whole_word_mask: bool = self.meta["settings"]["whole_word_mask"]
        self.tokenizer_dir = self.data_dir / "tokenizer"
        self.special_token_ids: dict[str, int] = self.meta["special_token_ids"]
        self.special_table = _special_table(self.vocab_size, self.meta["special_ids"])
        split_meta = self.meta["splits"][split]
        self.num_instances: int = split_meta["num_instances"]
        self._shard_meta: list[dict[str, Any]] = split_meta["shards"]
        self._array_names: list[str] = split_meta["arrays"]
        self._starts = np.cumsum([0] + [s["num_instances"] for s in self._shard_meta])
        self._shards: list[dict[str, np.ndarray]] | None = None
        self._open()  # now, so that a damaged directory fails here and not in a worker
        if tokenizer is not None:
            self.check_tokenizer(tokenizer)

    def check_tokenizer(self, tokenizer: BertTokenizer | str | os.PathLike) -> None:
        """ValueError unless `tokenizer` encodes exactly as the one the data was prepared with."""
        if isinstance(tokenizer, BertTokenizer):
            where, given = "the given tokenizer", tokenizer
        else:
            where, given = f"tokenizer {tokenizer}", BertTokenizer.from_pretrained(tokenizer)
        expected = self.meta["tokenizer"]["fingerprint"]
        if given.fingerprint() != expected:
            raise ValueError(f"{where} (fingerprint {given.fingerprint()}) differs from the one "
                             f"{self.data_dir} was prepared with ({self.tokenizer_dir}, "
                             f"fingerprint {expected}); use that tokenizer or re-run prepare")

    def __len__(self) -> int:
        return self.num_instances

    def instance(self, index: int) -> tuple[Instance, tuple[np.ndarray, np.ndarray] | None]:
        """Instance `index` of the split, and its static (masked_ids, mlm_selected) if stored."""
        if not 0 <= index < self.num_instances:
            raise IndexError(f"instance {index} out of range for {self.num_instances} instances")
        shards = self._open()
        s = int(np.searchsorted(self._starts, index, side="right")) - 1
        shard, local = shards[s], index - int(self._starts[s])
        lo, hi = int(shard["offsets"][local]), int(shard["offsets"][local + 1])
        word_starts = shard["word_starts"][lo:hi] if "word_starts" in shard else None
        instance = Instance(input_ids=np.asarray(shard["input_ids"][lo:hi], dtype=np.int64),
                            segment_b_start=int(shard["segment_b"][local]),
                            nsp_label=int(shard["nsp_labels"][local]),
                            word_starts=None if word_starts is None else np.asarray(word_starts))
        static = None
        if "masked_ids" in shard:
            static = (np.asarray(shard["masked_ids"][lo:hi], dtype=np.int64),
                      np.asarray(shard["mlm_selected"][lo:hi]))
        return instance, static

    def _open(self) -> list[dict[str, np.ndarray]]:
        if self._shards is None:
            shards = []
            for shard in self._shard_meta:
                arrays = {}
                for name in self._array_names:
                    path = self.data_dir / shard["dir"] / f"{name}.npy"
                    if not path.exists():
                        raise FileNotFoundError(f"{path} is missing; {self.data_dir} is damaged, "
                                                "re-run `bertkit prepare`")
                    arrays[name] = np.load(path, mmap_mode="r", allow_pickle=False)
                tokens, n = shard["num_tokens"], shard["num_instances"]
                if len(arrays["input_ids"]) != tokens or len(arrays["offsets"]) != n + 1:
                    raise ValueError(f"{self.data_dir / shard['dir']} does not match meta.json "
                                     f"({len(arrays['input_ids'])} tokens, expected {tokens}); the "
                                     "directory is damaged, re-run `bertkit prepare`")
                shards.append(arrays)
            self._shards = shards
        return self._shards

    # Memory maps are reopened, not pickled, when the dataset travels to a DataLoader worker.
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_shards"] = None
        return state


def collate(instances: Sequence[Instance], *, pad_id: int, max_seq_len: int | None = None,
            pad_to_multiple_of: int = PAD_MULTIPLE) -> dict[str, np.ndarray]:
    """Pad instances into numpy arrays: input_ids, token_type_ids, attention_mask (B, T) int64,
    word_starts (B, T) bool (False where unknown), nsp_labels (B,) int64.

    T is the longest instance rounded up to pad_to_multiple_of, but not beyond max_seq_len when the
    longest fits it (the model's position table may end there).
    """
    longest = max(len(inst.input_ids) for inst in instances)
    width = -(-longest // pad_to_multiple_of) * pad_to_multiple_of
    if max_seq_len is not None:
        width = min(width, max(max_seq_len, longest))
    batch = len(instances)
    input_ids = np.full((batch, width), pad_id, dtype=np.int64)  # (B, T)
    token_type_ids = np.zeros((batch, width), dtype=np.int64)  # (B, T)
    attention_mask = np.zeros((batch, width), dtype=np.int64)  # (B, T)
    word_starts = np.zeros((batch, width), dtype=bool)  # (B, T)
    for row, inst in enumerate(instances):
        length = len(inst.input_ids)
        input_ids[row, :length] = inst.input_ids
        attention_mask[row, :length] = 1
        token_type_ids[row, inst.segment_b_start:length] = 1
        if inst.word_starts is not None:
            word_starts[row, :length] = inst.word_starts
    nsp_labels = np.array([inst.nsp_label for inst in instances], dtype=np.int64)  # (B,)
    return {"input_ids": input_ids, "token_type_ids": token_type_ids,
            "attention_mask": attention_mask, "word_starts": word_starts, "nsp_labels": nsp_labels}


class PretrainingBatches(torch.utils.data.Dataset):
    """Map-style dataset of whole batches: item i is batch i of this rank in this epoch.

    The epoch's order is a permutation drawn from (seed, epoch). Global batch g is
    order[g × B × W : (g + 1) × B × W] (B = batch_size, W = world_size) and rank r takes the r-th
    slice of B. With drop_last=False the last global batch is completed with instances from the
    start of the order when W > 1 (every rank needs the same number of equal batches), and is
    simply shorter when W = 1. Dynamic masks depend on (seed, epoch, instance index) only.

    Items: input_ids, token_type_ids, attention_mask, mlm_labels (B, T) long, mlm_labels -100 where
    not predicted; nsp_labels (B,) long, -100 for data prepared without NSP.
    """

    def __init__(self, data: PretrainingData, batch_size: int, *, seed: int, epoch: int,
                 rank: int = 0, world_size: int = 1, mlm_probability: float = 0.15,
                 drop_last: bool = True):
        if batch_size < 1:
            raise ValueError(f"batch_size {batch_size} must be at least 1")
        if epoch < 0:
            raise ValueError(f"epoch {epoch} must be 0 or more")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in 0..{world_size - 1} (world_size {world_size})")
        if not 0.0 < mlm_probability < 1.0:
            raise ValueError(f"mlm_probability {mlm_probability} must be between 0 and 1")
        prepared_p = data.meta["settings"]["mlm_probability"]
        if data.static_masking and mlm_probability != prepared_p:
            raise ValueError(f"{data.data_dir} holds static masks drawn at mlm_probability "
                             f"{prepared_p}, not {mlm_probability}; pass {prepared_p} or prepare "
                             "without --static-masking")
        self.data = data
        self.batch_size = batch_size
        self.seed, self.epoch = seed, epoch
        self.rank, self.world_size = rank, world_size
        self.mlm_probability = mlm_probability
        self.drop_last = drop_last
        self.max_predictions = (data.meta["settings"]["max_predictions_per_seq"]
                                or default_max_predictions(data.max_seq_len, mlm_probability))
        self.replacement_ids = np.flatnonzero(~data.special_table)
        rng = np.random.default_rng([seed & 0xFFFFFFFF, seed >> 32 & 0xFFFFFFFF, epoch])
        self.order = rng.permutation(data.num_instances)  # (N,) the epoch's instance order
        global_batch = batch_size * world_size
        full, rest = divmod(data.num_instances, global_batch)
        self.num_batches = full + (1 if rest and not drop_last else 0)
        if self.num_batches == 0:
            raise ValueError(f"split {data.split!r} of {data.data_dir} has {data.num_instances} "
                             f"instances, fewer than one global batch of {global_batch} (batch "
                             f"size {batch_size} × world size {world_size}); lower --batch-size "
                             "or prepare more data (a larger corpus, or a higher --dupe-factor)")

    def __len__(self) -> int:
        return self.num_batches

    def indices(self, i: int) -> np.ndarray:
        """(b,) instance indices of this rank's batch i."""
        if not 0 <= i < self.num_batches:
            raise IndexError(f"batch {i} out of range for {self.num_batches} batches")
        global_batch = self.batch_size * self.world_size
        lo = i * global_batch
        chunk = self.order[lo:lo + global_batch]
        if len(chunk) < global_batch and self.world_size > 1:
            chunk = np.concatenate([chunk, np.resize(self.order, global_batch - len(chunk))])
        start = self.rank * self.batch_size
        return chunk[start:start + self.batch_size]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        indices = self.indices(i)
        rows = [self.data.instance(int(j)) for j in indices]
        data = self.data
        batch = collate([inst for inst, _ in rows], pad_id=data.special_token_ids["pad"],
                        max_seq_len=data.max_seq_len)
        padding = batch["attention_mask"] == 0  # (B, T)
        if data.static_masking:
            input_ids = batch["input_ids"].copy()
            labels = np.full_like(input_ids, IGNORE_INDEX)
            for row, (inst, (masked, selected)) in enumerate(rows):
                length = len(masked)
                input_ids[row, :length] = masked
                labels[row, :length] = np.where(selected, inst.input_ids, IGNORE_INDEX)
        else:
            special = data.special_table[batch["input_ids"]] | padding  # (B, T)
            masked = mask_tokens(batch["input_ids"], special,
                                 mask_keys(self.seed, self.epoch, indices),
                                 mask_token_id=data.special_token_ids["mask"],
                                 replacement_ids=self.replacement_ids,
                                 mlm_probability=self.mlm_probability,
                                 max_predictions=self.max_predictions,
                                 word_starts=batch["word_starts"] if data.whole_word_mask else None)
            input_ids, labels = masked.input_ids, masked.labels
        return {
            "input_ids": torch.from_numpy(input_ids),  # (B, T)
            "token_type_ids": torch.from_numpy(batch["token_type_ids"]),  # (B, T)
            "attention_mask": torch.from_numpy(batch["attention_mask"]),  # (B, T)
            "mlm_labels": torch.from_numpy(labels),  # (B, T)
            "nsp_labels": torch.from_numpy(batch["nsp_labels"]),  # (B,)
        }
