"""Training the two BERT stages of retrieval: a bi-encoder (`embed`) and a cross-encoder (`rerank`).

embed — a bi-encoder from any BERT directory. Query and passage go through the same encoder,
pooled (mean over every token, [CLS] and [SEP] included, as sentence-transformers; or [CLS])
and normalised. Loss: in-batch negatives, MultipleNegativesRankingLoss (Henderson et al. 2017;
sentence-transformers' name): for B queries the candidates are the B positives plus each row's
hard negatives, the logits are cosine × `scale` (20 as sentence-transformers, a temperature of
0.05) and the target of query i is its own positive. OUT_DIR is a Hugging Face BertModel
directory and also a sentence-transformers model (modules.json, 1_Pooling/config.json,
sentence_bert_config.json): `SentenceTransformer(OUT_DIR)` gives the vectors
`bertkit.inference.embed(OUT_DIR, ...)` gives.

rerank — a cross-encoder: [CLS] query [SEP] passage [SEP] → one logit (a sequence-classification
head with one label), trained on each positive and `negatives` hard negatives per query: the
row's own, then mined by BM25 (`mine="bm25"`, lexical look-alikes, the usual first stage) or by a
bi-encoder (`mine="biencoder"`, `mine_model`) from every passage of the training file. A row
with more negatives than `negatives` (or a mined list) is a pool: each epoch draws afresh from it.
Two losses: `loss="bce"`, binary cross-entropy on every (query, passage, 0/1) pair, batch_size
pairs a step; `loss="listwise"`, softmax cross-entropy over one query's positive and its
negatives (the positive must outscore them all; Nogueira & Cho's pointwise BCE vs the listwise
"localized contrastive" loss of Gao et al. 2021), batch_size queries a step. The pair length
(`max_length`) is written as the tokenizer's `model_max_length`: `search.load_reranker` and
sentence-transformers' `CrossEncoder(OUT_DIR)` cut pairs where training did, and the latter
scores as `bertkit.inference.rerank` does (sigmoid of the logit).

Inputs: JSONL rows {"query", "positive", "negatives"?: [..]} or TSV rows query<TAB>document<TAB>label
(label 1 relevant, 0 a negative of that query; an optional header), or builtin:NAME[:SPLIT] of
`bertkit.retrieval.datasets`. Bad rows are named file:line, counted and skipped.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bertkit.data.report import DataReport, read_text
from bertkit.train import health, lora
from bertkit.util.fileio import atomic_write_json, atomic_write_text, check_writable_output, model_directory

log = logging.getLogger(__name__)

TASKS = ("embed", "rerank")
POOLINGS = ("mean", "cls")
MINERS = ("bm25", "biencoder", "none")
LOSSES = ("listwise", "bce")  # rerank losses
# The rerank default learning rate: a fresh one-logit head over an encoder that was never
# trained to read a pair has to move far in the few hundred steps a CPU budget allows. Measured
# (issue 15; MiniLM, 200 BBC train queries x (1 + 3), 25 listwise steps, 50 dev queries' BM25
# top 20 at MRR@10 0.736): lr 1e-4 leaves the loss at chance (1.39 -> 1.35) and reranks to 0.504;
# 3e-4 reaches 0.50 and 0.767. 2e-5 (sentence-transformers' default) is made for thousands of steps.
RERANK_LR = 3e-4
BUILTIN_PREFIX = "builtin:"
CONFIG_FILE = "finetune_config.json"
OUTPUTS = ("config.json", "model.safetensors", CONFIG_FILE, "eval.json", "steps.jsonl", "modules.json")


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
    # rerank
    negatives: int = 3  # negatives per positive
    loss: str = "listwise"  # rerank: listwise (softmax over positive + negatives) | bce (per pair)
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

    def __post_init__(self) -> None:
        for name in ("model", "train", "out_dir", "eval", "mine_model"):
            if getattr(self, name) is not None:
                setattr(self, name, str(getattr(self, name)))
        problems = []
        if self.task not in TASKS:
            problems.append(f"task must be one of {', '.join(TASKS)}, got {self.task!r}")
        for name in ("epochs", "batch_size", "max_length", "mine_depth"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                problems.append(f"{name} must be a positive integer, got {value!r}")
        for name in ("hard_negatives", "negatives"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                problems.append(f"{name} must be an integer ≥ 0, got {getattr(self, name)!r}")
        if self.task == "embed" and self.batch_size < 2:
            problems.append("embed needs batch_size ≥ 2: the other rows of a batch are the negatives")
        if self.pooling not in POOLINGS:
            problems.append(f"pooling must be one of {', '.join(POOLINGS)}, got {self.pooling!r}")
        if self.loss not in LOSSES:
            problems.append(f"loss must be one of {', '.join(LOSSES)}, got {self.loss!r}")
        if self.task == "rerank" and self.loss == "listwise" and self.negatives < 1:
            problems.append("loss listwise needs negatives ≥ 1: the positive is ranked against them")
        if self.mine not in MINERS:
            problems.append(f"mine must be one of {', '.join(MINERS)}, got {self.mine!r}")
        if self.mine == "biencoder" and self.task == "rerank" and not self.mine_model:
            problems.append("mine biencoder needs mine_model (--mine-model DIR)")
        if not self.scale > 0:
            problems.append(f"scale must be > 0, got {self.scale!r}")
        if self.lr is not None and not self.lr > 0:
            problems.append(f"lr must be > 0, got {self.lr!r}")
        if problems:
            raise ValueError("invalid retrieval training settings: " + "; ".join(problems))


@dataclass
class Pair:
    query: str
    positive: str
    negatives: list[str]
    where: str  # file:line


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
        query, positive, negatives = row.get("query"), row.get("positive"), row.get("negatives", [])
        if not isinstance(query, str) or not query.strip():
            report.skip(where, "no 'query' string")
        elif not isinstance(positive, str) or not positive.strip():
            report.skip(where, "no 'positive' string")
        elif not isinstance(negatives, list) or not all(isinstance(n, str) and n.strip() for n in negatives):
            report.skip(where, "'negatives' must be a list of non-empty strings")
        else:
            pairs.append(Pair(query.strip(), positive.strip(), [n.strip() for n in negatives], where))
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


# ---------------------------------------------------------------------------------------------
# sentence-transformers files
# ---------------------------------------------------------------------------------------------
def write_sentence_transformers_files(out: Path, hidden_size: int, pooling: str, max_length: int,
                                      normalize: bool = True) -> None:
    """modules.json, 1_Pooling/config.json, sentence_bert_config.json: what makes a BertModel
    directory a SentenceTransformer (and what `inference.Pooling.read` reads back)."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
        (out / "2_Normalize").mkdir(exist_ok=True)
    atomic_write_json(out / "modules.json", modules)
    (out / "1_Pooling").mkdir(exist_ok=True)
    atomic_write_json(out / "1_Pooling" / "config.json", {
        "word_embedding_dimension": hidden_size, "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean", "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": False, "include_prompt": True})
    atomic_write_json(out / "sentence_bert_config.json", {"max_seq_length": max_length,
                                                          "do_lower_case": False})


# ---------------------------------------------------------------------------------------------
# losses
# ---------------------------------------------------------------------------------------------
def pool_padded(hidden: torch.Tensor, attention_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """(B, T, H) states + (B, T) mask → (B, H): mean over real tokens ([CLS]/[SEP] included), or [CLS]."""
    if mode == "cls":
        return hidden[:, 0]
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
    return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)  # (B, H)


def multiple_negatives_ranking_loss(queries: torch.Tensor, candidates: torch.Tensor,
                                    scale: float = 20.0) -> torch.Tensor:
    """queries (B, H), candidates (C, H) with C ≥ B, candidate i the positive of query i and the
    rest (other positives, hard negatives) its negatives → mean cross-entropy of scale × cosine."""
    logits = scale * F.normalize(queries, dim=-1) @ F.normalize(candidates, dim=-1).T  # (B, C)
    return F.cross_entropy(logits, torch.arange(len(queries), device=logits.device))


# ---------------------------------------------------------------------------------------------
# training
# ---------------------------------------------------------------------------------------------
def finetune_retrieval(**settings: Any) -> dict[str, Any]:
    """`RetrievalTrainConfig(**settings)` trained; returns eval.json's content."""
    return run(RetrievalTrainConfig(**settings))


# Options of `bertkit finetune` that only the retrieval tasks take.
RETRIEVAL_OPTIONS = ("pooling", "scale", "hard_negatives", "negatives", "loss", "mine", "mine_model",
                     "mine_depth")


def from_finetune_config(config: Any, **extra: Any) -> RetrievalTrainConfig:
    """The retrieval settings of a `train.finetune.FinetuneConfig` whose task is embed / rerank
    (fields the two share, plus `extra` RETRIEVAL_OPTIONS; the rest keep their defaults)."""
    if config.resume:
        raise ValueError(f"--resume is not available for --task {config.task} (its runs are short "
                         "and restart from the model); run it again with --overwrite")
    shared = {f.name for f in dataclasses.fields(RetrievalTrainConfig)}
    values = {k: v for k, v in dataclasses.asdict(config).items() if k in shared}
    values.update(extra)
    if values.get("device") == "auto":
        values["device"] = "cuda" if torch.cuda.is_available() else "cpu"
    return RetrievalTrainConfig(**values)


def run(config: RetrievalTrainConfig) -> dict[str, Any]:
    from bertkit.data.tokenizer import BertTokenizer
    from bertkit.train import optim

    started = time.time()
    out = check_writable_output(config.out_dir, overwrite=True if config.overwrite else False,
                                kind="dir", outputs=OUTPUTS)
    model_directory(config.model, "--model")
    pairs, report = read_pairs(config.train)
    if config.max_train_examples:
        pairs = pairs[:config.max_train_examples]
    if config.eval is None and config.train.startswith(BUILTIN_PREFIX):
        config.eval = config.train.split(":")[0] + ":" + config.train.split(":")[1] + ":dev"
    tokenizer = BertTokenizer.from_pretrained(config.model)
    device = torch.device(config.device)
    rng = random.Random(config.seed)
    torch.manual_seed(config.seed)
    model = _build(config).to(device)
    if config.lora:
        log.info("%s", lora.apply_lora(model, lora.LoraSpec.parse(config.lora)).summary())
    config.lr = config.lr or (RERANK_LR if config.task == "rerank" else 2e-5)
    groups = _rerank_groups(pairs, config) if config.task == "rerank" else []
    if config.task == "embed":
        examples: list[Any] = pairs
    else:
        examples = _rerank_epoch(groups, config, rng)
    steps_per_epoch = math.ceil(len(examples) / config.batch_size)
    total = steps_per_epoch * config.epochs
    optimizer = optim.build_optimizer(model, config.lr, weight_decay=config.weight_decay)
    schedule = optim.lr_schedule(optimizer, round(config.warmup_ratio * total), total, "linear")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / CONFIG_FILE, dataclasses.asdict(config))
    from tqdm.auto import tqdm

    steps, step = [], 0
    model.train()
    n_pairs = sum(1 + len(e[2]) for e in examples) if config.loss == "listwise" and groups else len(examples)
    for epoch in range(1, config.epochs + 1):
        if groups and epoch > 1:  # fresh negatives from each query's pool
            examples = _rerank_epoch(groups, config, rng)
        order = list(range(len(examples)))
        rng.shuffle(order)
        batches = [order[i:i + config.batch_size] for i in range(0, len(order), config.batch_size)]
        for batch in tqdm(batches, desc=f"epoch {epoch}/{config.epochs}", disable=not config.progress):
            if config.task == "embed":
                loss = _embed_loss(model, tokenizer, [examples[i] for i in batch], config, device)
            else:
                loss = _rerank_loss(model, tokenizer, [examples[i] for i in batch], config, device)
            optimizer_step(loss, model, optimizer, schedule, config.max_grad_norm, step)
            step += 1
            steps.append({"step": step, "epoch": epoch, "loss": loss.item(),
                          "lr": schedule.get_last_lr()[0]})
    model.eval()
    adapters = bool(config.lora) and config.lora_save == "adapters"
    if config.lora:
        lora.save_lora(model, out, config.lora_save, str(Path(config.model).resolve()), use=config.task,
                       max_length=config.max_length, pooling=config.pooling if config.task == "embed" else None)
    else:
        model.save_pretrained(out)
    if config.task == "rerank":
        # The pair length it was trained at is the one to score at: load_reranker and
        # sentence-transformers' CrossEncoder both read it from tokenizer_config.json. Scoring
        # BBC bodies at the model's 512 instead cost 4.5x the time of 128 (issue 15).
        tokenizer.model_max_length = config.max_length
    tokenizer.save_pretrained(out)
    if config.task == "embed" and not adapters:
        write_sentence_transformers_files(out, model.config.hidden_size, config.pooling, config.max_length)
    atomic_write_text(out / "steps.jsonl", "".join(json.dumps(s) + "\n" for s in steps))
    losses = [s["loss"] for s in steps]
    summary: dict[str, Any] = {
        "status": "done", "task": config.task, "model": config.model, "steps": step,
        "first_loss": losses[0] if losses else None,
        "last_loss": float(np.mean(losses[-max(1, len(losses) // 10):])) if losses else None,
        "train": report.to_dict(), "train_examples": n_pairs}
    if config.eval:
        from bertkit.adapters import load_engine

        summary["eval"] = evaluate(load_engine(config.model, out) if adapters else out, config.task, config.eval)
    summary["warnings"] = _warnings(config, summary, len(examples))
    for warning in summary["warnings"]:
        log.warning("warning: %s", warning)
    summary["seconds"] = round(time.time() - started, 2)
    atomic_write_json(out / "eval.json", summary)
    return summary


def _warnings(config: RetrievalTrainConfig, summary: dict[str, Any], examples: int) -> list[str]:
    """`train.health`'s checks: too few steps, a loss still at chance, a reranker that does not
    beat its own first stage."""
    chance = health.chance_loss(config.task, negatives=config.negatives, loss=config.loss,
                                batch_size=config.batch_size)
    found = [health.step_warning(summary["steps"], examples=examples, batch_size=config.batch_size,
                                 epochs=config.epochs),
             health.loss_warning(summary["last_loss"], chance)]
    scores = summary.get("eval") or {}
    if "first_stage" in scores:
        first = scores["first_stage"]
        found.append(health.baseline_warning("MRR@10", scores.get("mrr@10"), first.get("mrr@10"),
                                             f"the first stage's own order ({first['name']})", "eval"))
    return health.collect(*found)


def _build(config: RetrievalTrainConfig) -> nn.Module:
    from bertkit.encoder.checkpoint import load_into, read_state_dict
    from bertkit.encoder.config import BertConfig
    from bertkit.encoder.heads import BertForSequenceClassification
    from bertkit.encoder.model import BertModel

    directory = Path(config.model)
    if config.task == "embed":
        return BertModel.from_pretrained(directory)
    model_config = BertConfig.from_json(directory).replace(id2label={0: "LABEL_0"}, label2id={"LABEL_0": 0})
    net = BertForSequenceClassification(model_config)
    state = read_state_dict(directory)
    # A classifier of another label count (an earlier task's) is dropped and initialised afresh.
    state = {k: v for k, v in state.items() if not k.startswith("classifier.") or v.shape[0] == 1}
    load_into(net, state, str(directory))
    return net


def _encode(tokenizer, texts: Sequence[str], pairs: Sequence[str] | None, max_length: int, device):
    batch = tokenizer(list(texts), list(pairs) if pairs is not None else None, max_length=max_length)
    return {k: v.to(device) for k, v in batch.items()}


def _embed_loss(model, tokenizer, rows: list[Pair], config: RetrievalTrainConfig, device) -> torch.Tensor:
    candidates = [r.positive for r in rows]
    candidates += [n for r in rows for n in r.negatives[:config.hard_negatives]]
    q = _encode(tokenizer, [r.query for r in rows], None, config.max_length, device)
    d = _encode(tokenizer, candidates, None, config.max_length, device)
    qv = pool_padded(model(**q).last_hidden_state, q["attention_mask"], config.pooling)  # (B, H)
    dv = pool_padded(model(**d).last_hidden_state, d["attention_mask"], config.pooling)  # (C, H)
    return multiple_negatives_ranking_loss(qv, dv, config.scale)


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

def listwise_loss(logits: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """logits (G, 1 + K): column 0 each query's positive, the rest its negatives; mask (G, 1 + K)
    bool, False where a query has fewer negatives → mean cross-entropy of the positive against
    its own list (a softmax over one query's candidates, not the batch's)."""
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    return F.cross_entropy(logits, torch.zeros(len(logits), dtype=torch.long, device=logits.device))


def _rerank_loss(model, tokenizer, rows: list, config, device) -> torch.Tensor:
    """bce: rows are (query, passage, label); listwise: (query, positive, [negatives])."""
    if config.loss == "bce":
        batch = _encode(tokenizer, [r[0] for r in rows], [r[1] for r in rows], config.max_length, device)
        logits = model(**batch).logits[:, 0]  # (B,)
        labels = torch.tensor([r[2] for r in rows], dtype=logits.dtype, device=device)
        return F.binary_cross_entropy_with_logits(logits, labels)
    width = 1 + max(len(r[2]) for r in rows)
    queries = [r[0] for r in rows for _ in range(1 + len(r[2]))]
    passages = [d for r in rows for d in (r[1], *r[2])]
    batch = _encode(tokenizer, queries, passages, config.max_length, device)
    flat = model(**batch).logits[:, 0]  # (P,) every pair of the batch, query by query
    mask = torch.zeros(len(rows), width, dtype=torch.bool, device=device)  # (G, 1 + K)
    for g, r in enumerate(rows):
        mask[g, :1 + len(r[2])] = True
    logits = flat.new_zeros(len(rows), width).masked_scatter(mask, flat)  # (G, 1 + K) row-major
    return listwise_loss(logits, mask)


@dataclass
class _Group:
    """One training query: its positive, its own negatives and the mined ones to draw from."""
    query: str
    positive: str
    own: list[str]
    mined: list[str]


def _rerank_groups(pairs: list[Pair], config: RetrievalTrainConfig) -> list[_Group]:
    """Each pair with the top `mine_depth` mined passages that are not its positive."""
    pool = sorted({p.positive for p in pairs} | {n for p in pairs for n in p.negatives})
    mined: list[list[int]] = [[] for _ in pairs]
    wanted = [max(0, config.negatives - len(p.negatives)) for p in pairs]
    if config.mine != "none" and any(wanted) and len(pool) > 1:
        depth = min(config.mine_depth, len(pool))
        if config.mine == "bm25":
            from bertkit.retrieval.bm25 import BM25

            bm25 = BM25.fit(pool)
            mined = [bm25.top_k(p.query, depth) if w else [] for p, w in zip(pairs, wanted)]
        else:
            from bertkit.inference import embed
            from bertkit.retrieval.search import top_k_inner_product

            vectors = embed(config.mine_model, pool).numpy()
            queries = embed(config.mine_model, [p.query for p in pairs]).numpy()
            mined = top_k_inner_product(vectors, queries, depth)[1].tolist()
    return [_Group(p.query, p.positive, list(p.negatives),
                   [pool[i] for i in found if pool[i] != p.positive and pool[i] not in p.negatives])
            for p, found in zip(pairs, mined)]


def _rerank_epoch(groups: list[_Group], config: RetrievalTrainConfig, rng: random.Random) -> list[tuple]:
    """One epoch's examples: `negatives` per query, its own first (drawn from them when it has
    more), then drawn from the mined top `mine_depth` — hard, but the very top ones are most often
    unlabelled positives, so drawn rather than the first taken. bce: (query, passage, label)
    rows; listwise: (query, positive, [negatives]) rows."""
    rows: list[tuple] = []
    k = config.negatives
    for g in groups:
        negatives = list(g.own) if len(g.own) <= k else rng.sample(g.own, k)
        negatives += rng.sample(g.mined, min(k - len(negatives), len(g.mined)))
        if config.loss == "listwise":
            if negatives:  # a query without negatives has nothing to be ranked against
                rows.append((g.query, g.positive, negatives))
        else:
            rows.append((g.query, g.positive, 1.0))
            rows += [(g.query, n, 0.0) for n in negatives]
    if not rows:
        raise ValueError(f"no query has a negative to rank its positive against ({len(groups)} "
                         "queries): give rows negatives, or --mine bm25 with more than one passage")
    return rows


# ---------------------------------------------------------------------------------------------
# evaluation
# ---------------------------------------------------------------------------------------------
def evaluate(model_dir: Any, task: str, spec: str, *, candidates: int = 20,
             first_stage: str | None = None) -> dict[str, Any]:
    """MRR@10 / Recall@k / nDCG@10 of a trained model on `spec`'s queries.

    embed: exact search over the corpus (a builtin set's whole corpus, else every passage of the
    file). rerank: the top `candidates` of BM25 (or the `first_stage` bi-encoder) reranked; the
    first stage's own scores on the same candidates come under "first_stage", the baseline a
    reranker has to beat.
    """
    from bertkit.inference import embed, rerank
    from bertkit.retrieval.bm25 import BM25
    from bertkit.retrieval.metrics import evaluate_run
    from bertkit.retrieval.search import load_reranker, top_k_inner_product

    pairs, _ = read_pairs(spec, default_split="dev")
    if spec.startswith(BUILTIN_PREFIX):
        from bertkit.retrieval.datasets import load_retrieval

        corpus = list(load_retrieval(spec[len(BUILTIN_PREFIX):].split(":")[0]).corpus.values())
    else:
        corpus = sorted({p.positive for p in pairs} | {n for p in pairs for n in p.negatives})
    position = {text: i for i, text in enumerate(corpus)}
    qrels = {str(i): {str(position[p.positive])} for i, p in enumerate(pairs)}
    run: dict[str, list[str]] = {}
    reranker = None
    if task == "rerank":  # a model dir, or an adapter's engine (LoRA saved as adapters)
        reranker = load_reranker(model_dir) if isinstance(model_dir, (str, Path)) else model_dir
    if task == "embed" or first_stage:
        encoder = model_dir if task == "embed" else first_stage
        rows = top_k_inner_product(embed(encoder, corpus).numpy(),
                                   embed(encoder, [p.query for p in pairs]).numpy(),
                                   100 if task == "embed" else candidates)[1].tolist()
    else:
        bm25 = BM25.fit(corpus)
        rows = [bm25.top_k(p.query, candidates) for p in pairs]
    first_run = {str(i): [str(j) for j in found] for i, found in enumerate(rows)}
    for i, (pair, found) in enumerate(zip(pairs, rows)):
        if task == "rerank":
            order = rerank(reranker, pair.query, [corpus[j] for j in found]) if found else []
            found = [found[o["index"]] for o in order]
        run[str(i)] = [str(j) for j in found]
    def rounded(scores: dict[str, Any]) -> dict[str, Any]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in scores.items()}

    result = rounded(evaluate_run(run, qrels))
    if task == "rerank":
        result["first_stage"] = {"name": f"{'bi-encoder' if first_stage else 'BM25'} top {candidates}",
                                 **rounded(evaluate_run(first_run, qrels))}
    return result
