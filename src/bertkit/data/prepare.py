"""`prepare`: a corpus → pre-training shards, once (the format is `data.shards`'s docstring).

A corpus (files, directories or a built-in one) is tokenized once, in parallel for Chinese word
segmentation; documents are split into train and held-out (eval) by a seeded permutation; instances
are NSP / SOP pairs (`data.instances`) or packed sentences (RoBERTa's recipe), optionally with
static masks; they are written as memory-mapped shards, then `meta.json` last, so a directory
without it is not valid data. Same corpus, tokenizer and settings: byte-identical files.
"""

from __future__ import annotations

import hashlib
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

from bertkit.constants import IGNORE_INDEX
from bertkit.data.corpus import Corpus, as_corpus
from bertkit.data.instances import (
    IS_NEXT,
    Instance,
    TokenizedDocuments,
    create_nsp_instances,
    create_packed_instances,
    create_sop_instances,
    tokenize_documents,
)
from bertkit.data.masking import default_max_predictions, mask_keys, mask_tokens
from bertkit.data.shards import (
    DEFAULT_SHARD_SIZE,
    FORMAT_NAME,
    FORMAT_VERSION,
    OBJECTIVES,
    SPLITS,
    STATIC_EPOCH,
    collate,
    special_table,
)
from bertkit.data.tokenizer import TOKENIZER_FILES, BertTokenizer
from bertkit.util.fileio import atomic_path, atomic_write_json, check_writable_output

logger = logging.getLogger(__name__)


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


@dataclass
class PrepareConfig:
    """Every setting of `prepare`; the ones that shape the shards are written to
    DATA_DIR/meta.json under "settings" (`shard_settings`)."""

    # A `Corpus`, or source(s) for `load_corpus`: files, directories, globs, builtin:NAME.
    corpus: Corpus | str | os.PathLike | Sequence[str | os.PathLike]
    tokenizer_dir: str | os.PathLike  # the vocabulary the model will have (copied to DATA_DIR/tokenizer)
    out_dir: str | os.PathLike  # DATA_DIR: shards, tokenizer, meta.json
    max_seq_len: int = 128  # BERT's first phase (90% of its steps) ran at 128, the last 10% at 512
    nsp: bool = True  # BERT's sentence pairs with NSP labels; False packs full sentences (RoBERTa)
    # Decides instead of nsp when given: "mlm+nsp", "mlm" (packed) or "mlm+sop" (ALBERT's
    # sentence-order pairs, labels stored where NSP's are). Resolved on construction.
    objective: str | None = None
    # Share of pairs whose target length is drawn shorter, so that the model also sees the short
    # sequences of fine-tuning (create_pretraining_data.py's 0.1).
    short_seq_prob: float = 0.1
    whole_word_mask: bool = False  # WordPiece words (jieba words for Chinese) masked as a whole
    # Fix the masks here rather than drawing new ones each epoch (BERT's original recipe); off, as
    # RoBERTa found dynamic masking at least as good.
    static_masking: bool = False
    dupe_factor: int = 1  # passes over the corpus, each with its own random pairs (and static masks)
    mlm_probability: float = 0.15  # static masking only: the BERT paper's share of tokens
    max_predictions_per_seq: int | None = None  # static masking only; None = round(max_seq_len × mlm_probability)
    # Documents held out as the "eval" split (at least one when > 0): enough to watch the held-out
    # loss, little enough to leave the training data almost whole.
    eval_fraction: float = 0.01
    seed: int = 12345  # create_pretraining_data.py's default random seed
    workers: int = 1  # processes for Chinese word segmentation; tokenization uses the tokenizer's threads
    shard_size: int = DEFAULT_SHARD_SIZE  # instances per shard (the data.shards format)
    overwrite: bool = False  # replace prepared data in out_dir (only our own files there)
    corpus_format: str = "auto"  # load_corpus' format: by each file's suffix
    text_field: str = "text"  # the text column of JSON Lines / parquet rows
    progress: bool = True  # a tqdm bar of tokens while tokenizing

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Resolve objective and nsp; raise ValueError naming a bad value and the fix."""
        if self.objective is None:
            self.objective = "mlm+nsp" if self.nsp else "mlm"
        elif not self.nsp and self.objective != "mlm":
            raise ValueError(f"--no-nsp (packed sentences) contradicts objective {self.objective}; "
                             "pass one of them")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {self.objective!r}; choose one of {', '.join(OBJECTIVES)}")
        self.nsp = self.objective != "mlm"  # sentence-pair labels present (NSP or SOP)
        if self.max_seq_len < 8:
            raise ValueError(f"max_seq_len {self.max_seq_len} is too short for pre-training; use at "
                             "least 8 (BERT: 128, then 512)")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise ValueError(f"short_seq_prob {self.short_seq_prob} must be in [0, 1] (BERT: 0.1)")
        if self.dupe_factor < 1:
            raise ValueError(f"dupe_factor {self.dupe_factor} must be at least 1")
        if not 0.0 < self.mlm_probability < 1.0:
            raise ValueError(f"mlm_probability {self.mlm_probability} must be between 0 and 1 (BERT: 0.15)")
        if self.max_predictions_per_seq is not None and self.max_predictions_per_seq < 1:
            raise ValueError(f"max_predictions_per_seq {self.max_predictions_per_seq} must be at least 1")
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ValueError(f"eval_fraction {self.eval_fraction} must be in [0, 1) (e.g. 0.01)")
        if self.workers < 1:
            raise ValueError(f"workers {self.workers} must be at least 1")
        if self.shard_size < 1:
            raise ValueError(f"shard_size {self.shard_size} must be at least 1")

    def shard_settings(self) -> dict[str, Any]:
        """The settings that decide the shards' content, as meta.json records them."""
        return {"max_seq_len": self.max_seq_len, "nsp": self.nsp, "objective": self.objective,
                "short_seq_prob": self.short_seq_prob, "whole_word_mask": self.whole_word_mask,
                "static_masking": self.static_masking, "dupe_factor": self.dupe_factor,
                "mlm_probability": self.mlm_probability,
                "max_predictions_per_seq": self.max_predictions_per_seq,
                "eval_fraction": self.eval_fraction, "seed": self.seed}


def prepare(corpus: Corpus | str | os.PathLike | Sequence[str | os.PathLike],
            tokenizer_dir: str | os.PathLike, out_dir: str | os.PathLike, **settings: Any) -> PrepareStats:
    """`run_prepare` of a `PrepareConfig` made of these arguments; settings: any other of its
    fields (max_seq_len, nsp, objective, static_masking, eval_fraction, seed, overwrite, ...)."""
    return run_prepare(PrepareConfig(corpus=corpus, tokenizer_dir=tokenizer_dir, out_dir=out_dir, **settings))


def run_prepare(config: PrepareConfig) -> PrepareStats:
    """Tokenize a corpus once and write pre-training instances as memory-mapped shards.

    dupe_factor passes each draw their own random pairs (and static masks). static_masking fixes
    the masks here (mlm_probability, max_predictions_per_seq); otherwise `PretrainingBatches`
    draws new ones each epoch.
    eval_fraction of the documents (at least one when > 0) is held out as the "eval" split. A
    document of more than that share of the tokens (a whole file in `format="paragraphs"`)
    is first cut at sentence boundaries into sections that each count as a document, so that the
    held-out share of tokens stays near eval_fraction; the summary says so.
    Refuses a non-empty out_dir unless overwrite=True (then only our own files there are replaced).
    """
    started = time.perf_counter()
    out = Path(config.out_dir)
    _check_out_dir(out, config.overwrite)  # refuse now, before minutes of work, but clear only later
    tokenizer = BertTokenizer.from_pretrained(config.tokenizer_dir)
    seconds: dict[str, float] = {}

    tick = time.perf_counter()
    corpus = as_corpus(config.corpus, format=config.corpus_format, text_field=config.text_field)
    seconds["read"] = time.perf_counter() - tick

    tick = time.perf_counter()
    with _Progress(config.progress, "tokenizing", "tok") as bar:
        docs = tokenize_documents(corpus.documents, tokenizer, whole_word_mask=config.whole_word_mask,
                                  workers=config.workers, on_tokens=bar.update)
    if docs.num_documents == 0:
        raise ValueError(f"no document of {corpus.stats.summary()} has any token; is the tokenizer "
                         f"at {config.tokenizer_dir} meant for this text?")
    seconds["tokenize"] = time.perf_counter() - tick

    tick = time.perf_counter()
    _clear_out_dir(out)
    token_dtype = np.uint16 if tokenizer.vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32
    settings = config.shard_settings()
    masker = _StaticMasker(tokenizer, settings) if config.static_masking else None
    docs, sections = _cut_large_documents(docs, config.eval_fraction)
    split_docs = _split_documents(docs.num_documents, config.eval_fraction, config.seed)
    splits_meta: dict[str, Any] = {}
    counts: dict[str, dict[str, int]] = {k: {} for k in ("documents", "sentences", "tokens",
                                                          "instances", "is_next")}
    for split, doc_ids in split_docs.items():
        part = docs.subset(doc_ids)
        writer = _ShardWriter(out / split, token_dtype, config.shard_size, masker,
                              keep_word_starts=config.whole_word_mask and not config.static_masking)
        for dupe in range(config.dupe_factor):
            rng = random.Random(_derive_seed(config.seed, "instances", split, dupe))
            for instance in _instances(part, config.objective, config.max_seq_len, config.short_seq_prob,
                                       rng, tokenizer):
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
        "nsp": config.nsp,
        "objective": config.objective,
        "max_seq_len": config.max_seq_len,
        "vocab_size": tokenizer.vocab_size,
        "token_dtype": np.dtype(token_dtype).name,
        "tokenizer": {"fingerprint": tokenizer.fingerprint(), "source": str(config.tokenizer_dir)},
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
    n_nsp = sum(counts["instances"].values()) if config.nsp else 0
    return PrepareStats(
        out_dir=out, documents=counts["documents"], sentences=counts["sentences"],
        tokens=counts["tokens"], instances=counts["instances"],
        is_next_fraction=(sum(counts["is_next"].values()) / n_nsp) if n_nsp else None,
        corpus=corpus.stats.to_dict(), seconds=seconds, sections=sections, objective=config.objective)


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
        self.special = special_table(tokenizer.vocab_size, tokenizer.special_ids)
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
            keys = mask_keys(self.seed, STATIC_EPOCH,
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
