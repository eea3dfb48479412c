"""What the retrieval trainers share: the bi-encoder's and the cross-encoder's settings, the
training pairs (JSONL / TSV / built-in sets, bad rows named and skipped), drawing hard negatives,
tokenizing a batch and one update."""

from __future__ import annotations

import dataclasses
import json
import logging
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn

from bertkit.constants import FINETUNE_CONFIG, TRAINED_POOLINGS
from bertkit.data.report import DataReport, read_text
from bertkit.train.state import CHECKPOINTS

log = logging.getLogger(__name__)

TASKS = ("embed", "rerank")
POOLINGS = TRAINED_POOLINGS
MINERS = ("bm25", "biencoder", "none")
LOSSES = ("listwise", "bce")  # rerank losses
EMBED_LOSSES = ("mnrl", "cached-mnrl", "cosent", "angle", "margin-mse", "kl")  # train.retrieval.losses
BUILTIN_PREFIX = "builtin:"
# A run's files: an OUT_DIR holding any of them is continued (--resume) or replaced (--overwrite).
OUTPUTS = ("config.json", "model.safetensors", FINETUNE_CONFIG, "eval.json", "steps.jsonl", "modules.json",
           CHECKPOINTS)


@dataclass
class RetrievalTrainConfig:
    """Every setting of a bi-encoder / cross-encoder run; written to OUT_DIR/finetune_config.json."""

    task: str  # embed | rerank
    model: str  # a BERT model directory (any family bertkit loads)
    train: str  # JSONL / TSV file, or builtin:NAME[:SPLIT]
    out_dir: str
    eval: str | None = None  # scored at the end: MRR@10 / Recall@10 (default: a builtin's dev split)
    epochs: int = 1
    batch_size: int = 32  # embed: in-batch negatives grow with it (sentence-transformers: 32-128)
    lr: float | None = None  # None: embed 2e-5 (sentence-transformers' default); rerank RERANK_LR
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    max_grad_norm: float = 1.0
    max_length: int = 128  # pieces per text (embed) or per query+passage pair (rerank)
    max_train_examples: int | None = None
    seed: int = 42
    # embed
    pooling: str = "mean"  # mean (sentence-transformers' usual) | cls
    scale: float = 20.0  # cosine → logit; 1 / temperature
    hard_negatives: int = 1  # embed: at most this many of a row's negatives join the batch's candidates
    # embed's loss is one of EMBED_LOSSES (`losses.py`); None: mnrl for embed, listwise for rerank
    mini_batch_size: int = 32  # cached-mnrl: rows embedded at a time (sentence-transformers' default)
    matryoshka_dims: list[int] | None = None  # embed: the loss also on these prefixes, e.g. [768, 256, 64]
    teacher: str | None = None  # margin-mse / kl: a cross-encoder directory whose scores are the targets
    temperature: float = 1.0  # kl: both softmaxes' temperature (sentence-transformers' default)
    # rerank
    negatives: int = 3  # negatives per positive
    loss: str | None = None  # rerank: listwise (softmax over positive + negatives) | bce (per pair)
    mine: str = "bm25"  # where negatives come from beyond the row's own
    mine_model: str | None = None  # bi-encoder directory for mine="biencoder"
    mine_depth: int = 30  # mined negatives are drawn from this many top candidates
    # LoRA (`bertkit.train.lora`): adapters on the frozen encoder (and a rerank head), saved merged
    # or as PEFT adapter files that `--adapter` and `serve --adapter` run over the base
    lora: str | None = None
    lora_save: str = "merged"
    # execution
    device: str = "cpu"
    progress: bool = True
    overwrite: bool = False
    resume: bool = False  # continue OUT_DIR from its training state (`resumable.run`)
    # A training state every this many steps: the labelled tasks' default (`FinetuneConfig`), which
    # `bertkit finetune` passes on.
    save_every: int = 200

    def __post_init__(self) -> None:
        for name in ("model", "train", "out_dir", "eval", "mine_model", "teacher"):
            if getattr(self, name) is not None:
                setattr(self, name, str(getattr(self, name)))
        problems = []
        if self.task not in TASKS:
            problems.append(f"task must be one of {', '.join(TASKS)}, got {self.task!r}")
        if self.loss is None:
            self.loss = "mnrl" if self.task == "embed" else "listwise"
        if self.matryoshka_dims is not None:
            from bertkit.train.retrieval.losses import parse_dims

            try:
                self.matryoshka_dims = parse_dims(self.matryoshka_dims)
            except ValueError as err:
                problems.append(str(err))
        problems += positive_int_problems(
            self, ("epochs", "batch_size", "max_length", "mine_depth", "mini_batch_size", "save_every"))
        for name in ("hard_negatives", "negatives"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                problems.append(f"{name} must be an integer ≥ 0, got {getattr(self, name)!r}")
        if self.task == "embed" and self.batch_size < 2:
            problems.append("embed needs batch_size ≥ 2: the other rows of a batch are the negatives")
        if self.pooling not in POOLINGS:
            problems.append(f"pooling must be one of {', '.join(POOLINGS)}, got {self.pooling!r}")
        task_losses = EMBED_LOSSES if self.task == "embed" else LOSSES
        if self.loss not in task_losses:
            problems.append(f"loss must be one of {', '.join(task_losses)} for task {self.task}, got {self.loss!r}")
        teacher_loss = self.loss in ("margin-mse", "kl")
        if teacher_loss and not self.teacher:
            problems.append(f"loss {self.loss} learns from a teacher's scores: pass --teacher CROSS_ENCODER_DIR")
        if self.teacher and not teacher_loss:
            problems.append(f"--teacher is read by --loss margin-mse or kl only, not {self.loss}")
        if teacher_loss and self.hard_negatives < 1:
            problems.append(f"loss {self.loss} compares each positive with negatives: hard_negatives must be ≥ 1")
        if self.matryoshka_dims and self.task != "embed":
            problems.append("--matryoshka-dims applies to --task embed only")
        if not self.temperature > 0:
            problems.append(f"temperature must be > 0, got {self.temperature!r}")
        if self.task == "rerank" and self.loss == "listwise" and self.negatives < 1:
            problems.append("loss listwise needs negatives ≥ 1: the positive is ranked against them")
        if self.mine not in MINERS:
            problems.append(f"mine must be one of {', '.join(MINERS)}, got {self.mine!r}")
        if self.mine == "biencoder" and self.task == "rerank" and not self.mine_model:
            problems.append("mine biencoder needs mine_model (--mine-model DIR)")
        if not self.scale > 0:
            problems.append(f"scale must be > 0, got {self.scale!r}")
        problems += run_problems(self)
        if problems:
            raise ValueError("invalid retrieval training settings: " + "; ".join(problems))


def positive_int_problems(settings: Any, names: Sequence[str]) -> list[str]:
    """A problem for each of `names` that is not a positive integer on `settings`."""
    problems = []
    for name in names:
        value = getattr(settings, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            problems.append(f"{name} must be a positive integer, got {value!r}")
    return problems


def run_problems(settings: Any) -> list[str]:
    """The problems every retrieval trainer's settings share: lr (None: the default) and resume
    with overwrite."""
    problems = []
    if settings.lr is not None and not settings.lr > 0:
        problems.append(f"lr must be > 0, got {settings.lr!r}")
    if settings.resume and settings.overwrite:
        problems.append("resume and overwrite exclude each other; pass one")
    return problems


# Options of `bertkit finetune` that only the retrieval tasks take.
RETRIEVAL_OPTIONS = ("pooling", "scale", "hard_negatives", "negatives", "loss", "mine", "mine_model",
                     "mine_depth", "mini_batch_size", "matryoshka_dims", "teacher", "temperature")


def from_finetune_config(config: Any, **extra: Any) -> RetrievalTrainConfig:
    """The retrieval settings of a `train.finetune.FinetuneConfig` whose task is embed / rerank
    (fields the two share, plus `extra` RETRIEVAL_OPTIONS; the rest keep their defaults)."""
    shared = {f.name for f in dataclasses.fields(RetrievalTrainConfig)}
    values = {k: v for k, v in dataclasses.asdict(config).items() if k in shared}
    values.update(extra)
    if values.get("device") == "auto":
        values["device"] = "cuda" if torch.cuda.is_available() else "cpu"
    return RetrievalTrainConfig(**values)


@dataclass
class Pair:
    query: str
    positive: str
    negatives: list[str]
    where: str  # file:line
    score: float | None = None  # a scored pair's gold score (cosent, angle)
    teacher: list[float] | None = None  # a teacher's scores of the positive, then each negative


# ---------------------------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------------------------

def read_pairs(spec: str, default_split: str = "train") -> tuple[list[Pair], DataReport]:
    """Training pairs from a JSONL / TSV file or builtin:NAME[:SPLIT] (see the module docstring)."""
    if spec.startswith(BUILTIN_PREFIX):
        from bertkit.retrieval.datasets import load_retrieval

        name, _, split = spec[len(BUILTIN_PREFIX):].partition(":")
        queries = load_retrieval(name).queries
        split = split or default_split
        if split not in queries:
            raise ValueError(f"{spec}: unknown split {split!r}; choose one of {', '.join(queries)}")
        pairs = [Pair(q.text, q.positive, [], f"{spec}:{q.id}") for q in queries[split]]
        return pairs, DataReport(spec, n_kept=len(pairs))
    path = Path(spec)
    if not path.is_file():
        raise FileNotFoundError(f"no such training file: {path}" if not path.is_dir()
                                else f"{path} is a directory; pass a .jsonl or .tsv file")
    text = read_text(path)
    report = DataReport(str(path))
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        pairs = _jsonl_pairs(path, text, report)
    elif suffix in (".tsv", ".txt"):
        pairs = _tsv_pairs(path, text, report)
    else:
        raise ValueError(f"{path}: retrieval training data are .jsonl ({{query, positive, "
                         f"negatives?}}) or .tsv (query, document, label), not {suffix!r}")
    report.n_kept = len(pairs)
    if report.n_skipped:
        log.warning("%s", report.summary())
    report.require_rows()
    return pairs, report


def _jsonl_pairs(path: Path, text: str, report: DataReport) -> list[Pair]:
    pairs = []
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{line_no}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            report.skip(where, f"invalid JSON ({err.msg})")
            continue
        if not isinstance(row, dict):
            report.skip(where, "not a JSON object")
            continue
        # A scored pair (cosent, angle) may name its sides as sentence-transformers' STS sets do.
        query, positive = row.get("query", row.get("sentence1")), row.get("positive", row.get("sentence2"))
        negatives, score = row.get("negatives", []), row.get("score")
        if not isinstance(query, str) or not query.strip():
            report.skip(where, "no 'query' (or 'sentence1') string")
        elif not isinstance(positive, str) or not positive.strip():
            report.skip(where, "no 'positive' (or 'sentence2') string")
        elif not isinstance(negatives, list) or not all(isinstance(n, str) and n.strip() for n in negatives):
            report.skip(where, "'negatives' must be a list of non-empty strings")
        elif score is not None and (not isinstance(score, (int, float)) or isinstance(score, bool)):
            report.skip(where, f"'score' must be a number, got {score!r}")
        else:
            pairs.append(Pair(query.strip(), positive.strip(), [n.strip() for n in negatives], where,
                              None if score is None else float(score)))
    return pairs


def _tsv_pairs(path: Path, text: str, report: DataReport) -> list[Pair]:
    positives: dict[str, list[tuple[str, str]]] = {}
    negatives: dict[str, list[str]] = {}
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{line_no}"
        cells = line.split("\t")
        if len(cells) != 3:
            report.skip(where, f"{len(cells)} columns, expected 3 (query, document, label)")
            continue
        query, document, label = (c.strip() for c in cells)
        try:
            value = float(label)
        except ValueError:
            if line_no == 1:  # a header row
                continue
            report.skip(where, f"label {label!r} is not a number (1 relevant, 0 not)")
            continue
        if not query or not document:
            report.skip(where, "empty query or document")
        elif value > 0:
            positives.setdefault(query, []).append((document, where))
        else:
            negatives.setdefault(query, []).append(document)
    pairs = [Pair(q, doc, negatives.get(q, []), where) for q, docs in positives.items() for doc, where in docs]
    only_negative = [q for q in negatives if q not in positives]
    if only_negative:
        log.warning("%s: %d queries have negatives but no positive row and are not used (e.g. %r)",
                    path, len(only_negative), only_negative[0])
    return pairs



def evaluation_set(spec: str) -> tuple[list[Pair], list[str], dict[str, set[str]]]:
    """What a trained retriever is scored on: `spec`'s queries (a built-in set's dev split), the
    corpus searched (a built-in set's whole corpus, else every passage of the file) and the qrels
    (query i → its positive's position in the corpus, both as text)."""
    pairs, _ = read_pairs(spec, default_split="dev")
    if spec.startswith(BUILTIN_PREFIX):
        from bertkit.retrieval.datasets import load_retrieval

        corpus = list(load_retrieval(spec[len(BUILTIN_PREFIX):].split(":")[0]).corpus.values())
    else:
        corpus = sorted({p.positive for p in pairs} | {n for p in pairs for n in p.negatives})
    position = {text: i for i, text in enumerate(corpus)}
    qrels = {str(i): {str(position[p.positive])} for i, p in enumerate(pairs)}
    return pairs, corpus, qrels


def draw_negatives(own: Sequence[str], mined: Sequence[str], k: int, rng: random.Random) -> list[str]:
    """Up to k hard negatives: the row's `own` first (k drawn from them when it has more), then
    drawn from the `mined` ones (the very top hits are most often unlabelled positives, so drawn,
    not taken in order)."""
    drawn = list(own) if len(own) <= k else rng.sample(own, k)
    return drawn + rng.sample(mined, min(k - len(drawn), len(mined)))


def encode(tokenizer, texts: Sequence[str], pairs: Sequence[str] | None, max_length: int, device):
    """Texts (or text pairs) as a padded batch on `device`: input_ids, token_type_ids,
    attention_mask, each (B, T)."""
    batch = tokenizer(list(texts), list(pairs) if pairs is not None else None, max_length=max_length)
    return {k: v.to(device) for k, v in batch.items()}


def optimizer_step(loss: torch.Tensor, model: nn.Module, optimizer, schedule, max_grad_norm: float,
                   step: int) -> None:
    """One update from `loss` (step: the updates done so far): refused if the loss is not finite,
    gradients clipped to `max_grad_norm`, then the optimizer and the schedule step."""
    if not torch.isfinite(loss):
        raise FloatingPointError(f"the loss became {float(loss)} at step {step + 1}; lower --lr")
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    schedule.step()
    optimizer.zero_grad(set_to_none=True)


def config_from_options(cls: type, options: dict[str, Any], task: str):
    """A trainer's config dataclass `cls` from `bertkit finetune`'s options (those given; the rest
    keep the class's defaults); an option of another task is refused, named as its flag."""
    shared = {f.name for f in dataclasses.fields(cls)}
    unknown = [k for k in options if k not in shared]
    if unknown:
        raise ValueError(f"--{unknown[0].replace('_', '-')} does not apply to --task {task}")
    values = dict(options)
    if values.get("device") == "auto":
        values["device"] = "cuda" if torch.cuda.is_available() else "cpu"
    return cls(**values)
