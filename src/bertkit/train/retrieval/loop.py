"""Embed and rerank on the one retrieval run (`resumable.run`): the bi-encoder's and the
cross-encoder's modules (`biencoder`, `crossencoder`) made into its `Parts`, with what the two
share beside them: the tokenizer, LoRA, saving (merged or as adapters) and evaluation.

Each module gives what differs: `build` the model, `DEFAULT_LR`, `prepare` the pairs and draw an
epoch's `epoch_examples` from them, `count_pairs`, the batch `loss` (with `GATHERS`, a loss over
the whole batch that takes the ranks to gather embeddings from under torchrun), the `pooling` a
LoRA side file records, the files it `save_extras` beside the model, its `chance_loss` and
`baseline`. Their epochs come from one generator seeded once (`random.Random(seed)`: an epoch's
draws, then its order), drawn again from the start when a run resumes (`resumable.run`), so a
resumed run trains the epoch in progress as the whole run did. Training states hold the model by
`lora.save_weights`: a LoRA model's frozen base and its adapters apart, read back by
`lora.load_weights` into the model the run built and adapted.
"""

from __future__ import annotations

import logging
import random
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from torch import nn

from bertkit.train import lora
from bertkit.train.retrieval import biencoder, crossencoder
from bertkit.train.retrieval.common import OUTPUTS, Pair, RetrievalTrainConfig
from bertkit.train.retrieval.evaluate import evaluate
from bertkit.train.retrieval.resumable import Parts, Step
from bertkit.train.retrieval.resumable import run as run_parts

log = logging.getLogger(__name__)


def finetune_retrieval(**settings: Any) -> dict[str, Any]:
    """`RetrievalTrainConfig(**settings)` trained; returns eval.json's content."""
    return run(RetrievalTrainConfig(**settings))


def run(config: RetrievalTrainConfig) -> dict[str, Any]:
    """Train a bi-encoder (embed) or a cross-encoder (rerank) as `config` says; returns eval.json's
    content (written to OUT_DIR/eval.json). Under torchrun each rank runs its slice of every
    batch, the bi-encoder's in-batch negatives gathered from all ranks (`train.parallel`); rank 0
    writes OUT_DIR and evaluates."""
    return run_parts(config, parts(config.task))


def parts(task: str) -> Parts:
    """The run's parts for `task` (embed: `biencoder`; rerank: `crossencoder`)."""
    trainer = biencoder if task == "embed" else crossencoder
    return Parts(
        task, load=_tokenizer, build=partial(_build, trainer), epochs=partial(_epochs, trainer),
        loss=partial(_loss, trainer), save=partial(_save, trainer), evaluate=_evaluate,
        chance_loss=trainer.chance_loss, lr=lambda directory, config: trainer.DEFAULT_LR, baseline=trainer.baseline,
        count=trainer.count_pairs, adapt=_adapt,
        # One pair is trained on: a bi-encoder's row may bring its own hard negatives, and a
        # cross-encoder's query reads its own pairs only.
        in_batch=_never, whole_batch=trainer.GATHERS, outputs=OUTPUTS,
        write_state=lora.save_weights, restore=_restore)


def _never(config: RetrievalTrainConfig) -> bool:
    return False


def _tokenizer(directory: Path, config: RetrievalTrainConfig):
    from bertkit.data.tokenizer import BertTokenizer

    return BertTokenizer.from_pretrained(directory)


def _build(trainer: ModuleType, directory: Path, config: RetrievalTrainConfig) -> nn.Module:
    """The trainer's model from config.model, whatever `directory` is (a training state's weights
    are loaded by `_restore`, into the model the run adapted)."""
    return trainer.build(config)


def _restore(model: nn.Module, state: Path, config: RetrievalTrainConfig) -> None:
    """A training state's weights (and adapters) into the model, adapted as the run's was."""
    lora.load_weights(model, state)


def _adapt(model: nn.Module, config: RetrievalTrainConfig) -> None:
    """LoRA adapters (`config.lora`) on the model, once it is on its device (their A matrices are
    drawn by that device's generator)."""
    if config.lora:
        log.info("%s", lora.apply_lora(model, lora.LoraSpec.parse(config.lora)).summary())


def _epochs(trainer: ModuleType, pairs: list[Pair], config: RetrievalTrainConfig) -> Callable[[int], list[Any]]:
    """The trainer's prepared pairs, then each epoch its `epoch_examples` and their order, both
    drawn from one generator (a cross-encoder draws fresh negatives from each query's pool)."""
    pool = trainer.prepare(pairs, config)
    rng = random.Random(config.seed)

    def epoch(number: int) -> list[Any]:
        examples = trainer.epoch_examples(pool, config, rng)
        order = list(range(len(examples)))
        rng.shuffle(order)
        return [examples[i] for i in order]

    return epoch


def _loss(trainer: ModuleType, engine, tokenizer, step: Step, config: RetrievalTrainConfig, device):
    """The trainer's batch loss; the step's record holds nothing more. A loss over the whole
    batch (`GATHERS`) gathers the embeddings of every rank's rows (`step.group`)."""
    group = {"group": step.group} if trainer.GATHERS else {}
    return engine(partial(trainer.loss, tokenizer=tokenizer, rows=step.rows, config=config, device=device,
                          **group)), {}


def _adapters(config: RetrievalTrainConfig) -> bool:
    return bool(config.lora) and config.lora_save == "adapters"


def _save(trainer: ModuleType, model: nn.Module, tokenizer, out: Path, config: RetrievalTrainConfig) -> None:
    """The model (with LoRA merged, or its adapters with a side file), the trainer's files beside
    it, then the tokenizer (the cross-encoder's extras set the length it saves)."""
    if config.lora:
        lora.save_lora(model, out, config.lora_save, str(Path(config.model).resolve()), use=config.task,
                       max_length=config.max_length, pooling=trainer.pooling(config))
    else:
        model.save_pretrained(out)
    trainer.save_extras(model, tokenizer, out, config, _adapters(config))
    tokenizer.save_pretrained(out)


def _evaluate(out: Path, spec: str, config: RetrievalTrainConfig) -> dict[str, Any]:
    """MRR@10 / Recall@k / nDCG@10 on `spec` (`retrieval.evaluate`), adapters run over their base."""
    model: Any = out
    if _adapters(config):
        from bertkit.adapters import load_engine

        model = load_engine(config.model, out)
    return evaluate(model, config.task, spec, dims=config.matryoshka_dims, scored=config.loss in ("cosent", "angle"))
