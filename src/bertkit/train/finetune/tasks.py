"""The fine-tuning tasks, one row each: what trains it and what a run of it is measured against.

`bertkit finetune --task T` and `run_finetune` read the same row; dispatch happens here, once:

    task      trainer                      settings              Task class    chance loss             baseline
    classify  labelled data (loop.py)      FinetuneConfig        ClassifyTask  ln(labels)              majority label
    pair      labelled data                FinetuneConfig        ClassifyTask  ln(labels)              majority label
    ner       labelled data                FinetuneConfig        NerTask       ln(tags)                every word O
    qa        labelled data                FinetuneConfig        QATask        ln(window)              —
    embed     bi-encoder (train.retrieval) RetrievalTrainConfig  —             ln(batch)               —
    rerank    cross-encoder (retrieval)    RetrievalTrainConfig  —             ln(1 + negatives), ln 2 first stage
    sparse    SPLADE (train.sparse)        SparseTrainConfig     —             ln(batch × (1 + hard))  —
    colbert   ColBERT (train.colbert)      ColbertTrainConfig    —             ln(batch × (1 + hard))  —

The head a task trains and the use that runs its result stay in the head table
(`encoder.tasks.FINETUNE_TASKS`, which the layers below training read); the names are
`constants.FINETUNE_TASKS` (a test checks that every name has its row). A new task is a trainer,
a row here, its name in constants and its head in the head table.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

from bertkit.encoder import tasks as heads
from bertkit.train import colbert, retrieval, sparse
from bertkit.train.finetune.config import FinetuneConfig
from bertkit.train.finetune.loop import train_labelled
from bertkit.train.finetune.task import ClassifyTask, NerTask, QATask, Task
from bertkit.train.retrieval import biencoder, crossencoder
from bertkit.util import distributed

Settings = Any  # the row's settings class: FinetuneConfig, RetrievalTrainConfig, SparseTrainConfig, ...


@dataclass(frozen=True)
class TaskRow:
    """One task of `bertkit finetune`."""

    name: str  # "rerank"
    trainer: Callable[[Settings], dict[str, Any]]  # runs a run's settings; returns eval.json's content
    settings: type  # the trainer's settings
    from_options: Callable[[dict[str, Any]], Settings]  # the settings from `bertkit finetune`'s options
    from_finetune: Callable[[FinetuneConfig], Settings]  # the settings a FinetuneConfig gives this task
    # The training loss of a uniform guess (settings, the model's BertConfig) → float, None: none.
    chance_loss: Callable[..., float | None]
    # The warning for a score no better than a predictor that ignores its input (scores, metric, split).
    baseline: Callable[[dict[str, Any], str, str], str | None]
    task_class: type[Task] | None = None  # labelled data: reads them, decides the labels, scores a model

    @property
    def head(self) -> heads.FinetuneTask:
        """The head it trains and the engine use that runs the result (the head table's row)."""
        return heads.FINETUNE_TASKS[self.name]


def _refuse(options: dict[str, Any], names: tuple[str, ...], tasks: str, task: str | None) -> None:
    """A ValueError naming the first of `names` given, as its flag, for a task that takes none."""
    given = [k for k in names if k in options]
    if given:
        raise ValueError(f"--{given[0].replace('_', '-')} applies to --task {tasks} only, not {task}")


def _finetune_config(options: dict[str, Any]) -> tuple[FinetuneConfig, dict[str, Any]]:
    """FinetuneConfig from the options (its defaults for those left out), and the retrieval
    options apart; the SPLADE options are refused."""
    _refuse(options, sparse.SPARSE_OPTIONS, "sparse", options.get("task"))
    _refuse(options, colbert.COLBERT_OPTIONS, "colbert", options.get("task"))
    extra = {k: v for k, v in options.items() if k in retrieval.RETRIEVAL_OPTIONS}
    return FinetuneConfig(**{k: v for k, v in options.items() if k not in extra}), extra


def _labelled_options(options: dict[str, Any]) -> FinetuneConfig:
    config, extra = _finetune_config(options)
    _refuse(extra, retrieval.RETRIEVAL_OPTIONS, "embed / rerank", config.task)
    return config


def _retrieval_options(options: dict[str, Any]) -> retrieval.RetrievalTrainConfig:
    config, extra = _finetune_config(options)
    return retrieval.from_finetune_config(config, **extra)


def _sparse_options(options: dict[str, Any]) -> sparse.SparseTrainConfig:
    """SparseTrainConfig's own defaults for the options left out."""
    return sparse.config_from_options({k: v for k, v in options.items() if k != "task"})


def _sparse_from_finetune(config: FinetuneConfig) -> sparse.SparseTrainConfig:
    """The fields a FinetuneConfig shares with SparseTrainConfig; the rest keep their defaults."""
    shared = {f.name for f in dataclasses.fields(sparse.SparseTrainConfig)} - {"task"}
    return _sparse_options({k: v for k, v in dataclasses.asdict(config).items() if k in shared})


def _colbert_options(options: dict[str, Any]) -> colbert.ColbertTrainConfig:
    """ColbertTrainConfig's own defaults for the options left out."""
    return colbert.config_from_options({k: v for k, v in options.items() if k != "task"})


def _colbert_from_finetune(config: FinetuneConfig) -> colbert.ColbertTrainConfig:
    """The fields a FinetuneConfig shares with ColbertTrainConfig (max_length: the documents'
    pieces); the rest keep their defaults."""
    shared = {f.name for f in dataclasses.fields(colbert.ColbertTrainConfig)} - {"task"}
    return _colbert_options({k: v for k, v in dataclasses.asdict(config).items() if k in shared})


def _labelled(name: str, task_class: type[Task]) -> TaskRow:
    """A task on labelled data: the one loop, with `task_class` reading and scoring them."""
    return TaskRow(name, trainer=partial(train_labelled, task_class=task_class), settings=FinetuneConfig,
                   from_options=_labelled_options, from_finetune=lambda config: config,
                   chance_loss=task_class.chance_loss, baseline=task_class.baseline, task_class=task_class)


def _retrieval(name: str, parts) -> TaskRow:
    """A retrieval model: the shared run, with the bi-encoder's or the cross-encoder's `parts`."""
    return TaskRow(name, trainer=retrieval.run, settings=retrieval.RetrievalTrainConfig,
                   from_options=_retrieval_options, from_finetune=retrieval.from_finetune_config,
                   chance_loss=parts.chance_loss, baseline=parts.baseline)


TASK_ROWS: dict[str, TaskRow] = {row.name: row for row in (
    _labelled("classify", ClassifyTask),
    _labelled("pair", ClassifyTask),
    _labelled("ner", NerTask),
    _labelled("qa", QATask),
    _retrieval("embed", biencoder),
    _retrieval("rerank", crossencoder),
    TaskRow("sparse", trainer=sparse.run, settings=sparse.SparseTrainConfig, from_options=_sparse_options,
            from_finetune=_sparse_from_finetune, chance_loss=sparse.chance_loss, baseline=sparse.baseline),
    TaskRow("colbert", trainer=colbert.run, settings=colbert.ColbertTrainConfig, from_options=_colbert_options,
            from_finetune=_colbert_from_finetune, chance_loss=colbert.chance_loss, baseline=colbert.baseline),
)}
# The Task class of each labelled task (distillation reads and scores its data with them).
TASK_CLASSES: dict[str, type[Task]] = {name: row.task_class for name, row in TASK_ROWS.items() if row.task_class}


def row_of(task: str) -> TaskRow:
    """The row of `task`, or a ValueError naming the tasks there are."""
    if task not in TASK_ROWS:
        raise ValueError(f"unknown task {task!r}; choose one of {', '.join(TASK_ROWS)}")
    return TASK_ROWS[task]


def finetune_settings(options: dict[str, Any]) -> Settings:
    """The settings of a run from `bertkit finetune`'s options (`task` among them; those left out
    take the task's defaults): a FinetuneConfig, or the retrieval or SPLADE trainer's own. An
    option of another task is refused, named as its flag."""
    return row_of(options.get("task")).from_options(options)


def run_finetune(config: Settings) -> dict[str, Any]:
    """Run one fine-tuning of any task: `config` is a FinetuneConfig (the retrieval and SPLADE
    tasks take the fields they share with it) or the task's own settings (`finetune_settings`).
    Under `torchrun` each process calls it with the same settings (see `train.parallel`).
    Returns eval.json's content."""
    row = row_of(config.task)
    settings = config if isinstance(config, row.settings) else row.from_finetune(config)
    # Under torchrun every rank runs this (`train.parallel`); the trainer finds the group joined.
    info = distributed.init_distributed(settings.device)
    try:
        summary = row.trainer(settings)
        distributed.leave_together(info)  # not before rank 0 has written its last files
        return summary
    finally:
        distributed.shutdown(info)


def finetune(task: str, model_dir: str, train_file: str, out_dir: str, *, eval_file: str | None = None,
             **settings: Any) -> dict[str, Any]:
    """Fine-tune `model_dir` (or a preset) on `train_file` for `task`; write the model to `out_dir`.

    settings: any other `FinetuneConfig` field (epochs, lr, batch_size, freeze_encoder, patience,
    max_length, tokenizer, test, ...). Returns the content of OUT_DIR/eval.json: the best epoch,
    its eval metrics, the test metrics, data reports.
    """
    config = FinetuneConfig(task=task, model=str(model_dir), train=str(train_file), out_dir=str(out_dir),
                            eval=None if eval_file is None else str(eval_file), **settings)
    return run_finetune(config)
