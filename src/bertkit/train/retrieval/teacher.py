"""The rows each embed loss can read, and a cross-encoder teacher's scores for margin-mse and kl.

A teacher (`--teacher DIR`, a cross-encoder: a sequence classifier with one relevance logit, as
`bertkit finetune --task rerank` makes) scores every (query, passage) pair of the training rows
once: the positive and every negative of each row, its raw logit (sentence-transformers'
`CrossEncoder.predict(..., activation_fn=Identity())`, the form of the MS MARCO cross-encoder
score files that MarginMSELoss is trained on). The scores are kept in OUT_DIR/teacher_scores.json
with what they were computed from (the teacher's path and weight files, a digest of the rows); a
run into the same OUT_DIR (`--overwrite`) with the same teacher and rows reads them back instead
of scoring again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from bertkit.train.retrieval.common import Pair, RetrievalTrainConfig
from bertkit.train.retrieval.losses import EMBED_LOSSES, SCORED, TEACHER
from bertkit.util.fileio import atomic_write_json, model_directory

log = logging.getLogger(__name__)

CACHE = "teacher_scores.json"


def usable_pairs(pairs: list[Pair], config: RetrievalTrainConfig) -> list[Pair]:
    """The pairs config.loss can train on: all for mnrl / cached-mnrl; the scored ones (without
    negatives) for cosent / angle; for margin-mse / kl, those with at least hard_negatives
    negatives, with the teacher's scores attached. Rows left out are counted in a warning; none
    left is a ValueError saying what the data need."""
    data = EMBED_LOSSES[config.loss].data
    if data == SCORED:
        kept = [dataclasses.replace(p, negatives=[]) for p in pairs if p.score is not None]
        short = "pairs with a number 'score'"
        need = short + ": JSONL rows {\"sentence1\", \"sentence2\", \"score\"}"
    elif data == TEACHER:
        k = config.hard_negatives
        kept = [p for p in pairs if len(p.negatives) >= k]
        short = f"rows with at least {k} negatives"
        need = (f"rows with at least {k} negatives (--hard-negatives {k}); `bertkit mine-negatives` "
                "adds them to a file of (query, positive) pairs")
    else:
        return pairs
    if not kept:
        raise ValueError(f"--loss {config.loss} needs {need}; {config.train} has none of its {len(pairs)} rows")
    if len(kept) < len(pairs):
        log.warning("--loss %s: %d of %d rows are not %s and are left out", config.loss,
                    len(pairs) - len(kept), len(pairs), short)
    if data == TEACHER:
        scores = teacher_scores(config.teacher, kept, Path(config.out_dir), config.device)
        kept = [dataclasses.replace(p, teacher=s) for p, s in zip(kept, scores)]
    return kept


def check_teacher(directory: str, flag: str = "--teacher") -> Path:
    """The teacher's directory, or an error saying it is not a cross-encoder (`flag`: how the
    command line names it)."""
    from bertkit.encoder.config import BertConfig
    from bertkit.encoder.tasks import architecture_kinds, is_cross_encoder

    path = model_directory(directory, flag)
    config = BertConfig.from_json(path / "config.json")
    kinds = architecture_kinds(config)
    if kinds[:1] != ["ForSequenceClassification"] or not is_cross_encoder(config):
        found = (f"its config.json names {', '.join(config.extra.get('architectures') or []) or 'no architecture'}"
                 + (f" with {config.num_labels} labels" if kinds[:1] == ["ForSequenceClassification"] else ""))
        raise ValueError(f"{flag} {directory} is not a cross-encoder ({found}); pass a sequence classifier "
                         "with one relevance logit, as `bertkit finetune --task rerank` makes")
    return path


def teacher_scores(directory: str, pairs: list[Pair], out_dir: Path, device: str = "cpu") -> list[list[float]]:
    """Each pair's [score of the positive, score of each negative] by the cross-encoder at
    `directory` (raw logits), read from out_dir/teacher_scores.json when it was computed from
    the same teacher and pairs, else computed and written there."""
    path = check_teacher(directory)
    stamp = _stamp(path, pairs)
    cache = out_dir / CACHE
    if cache.is_file():
        try:
            saved = json.loads(cache.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            saved = {}
        if {k: saved.get(k) for k in stamp} == stamp:
            log.info("teacher scores of %d pairs read from %s", len(pairs), cache)
            return saved["scores"]
        log.info("%s was computed from another teacher or other rows: scoring again", cache)
    from bertkit.inference.classify import logits
    from bertkit.retrieval.search import load_reranker

    engine = load_reranker(path, device=device)
    queries = [p.query for p in pairs for _ in range(1 + len(p.negatives))]
    passages = [d for p in pairs for d in (p.positive, *p.negatives)]
    flat = logits(engine, queries, passages)[:, 0].tolist()  # (P,) every pair, row by row
    scores, start = [], 0
    for p in pairs:
        scores.append(flat[start:start + 1 + len(p.negatives)])
        start += 1 + len(p.negatives)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(cache, {**stamp, "scores": scores})
    log.info("teacher scores of %d (query, passage) pairs written to %s", len(flat), cache)
    return scores


def _stamp(teacher: Path, pairs: list[Pair]) -> dict[str, Any]:
    """What the scores depend on: the teacher (its path, and each weight file's size and time)
    and the rows' texts in order."""
    weights = sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in teacher.iterdir()
                     if f.suffix in (".safetensors", ".bin"))
    rows = hashlib.sha256(json.dumps([[p.query, p.positive, p.negatives] for p in pairs],
                                     ensure_ascii=False).encode("utf-8")).hexdigest()
    return {"teacher": str(teacher.resolve()), "weights": [list(w) for w in weights], "rows_sha256": rows}
