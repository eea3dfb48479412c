"""Fine-tuning on the four downstream task types: classify, pair, ner, qa (and embed / rerank,
trained by `train.retrieval`, and SPLADE's sparse, by `train.sparse`; `run_finetune` runs them all).

`finetune(task, model, train, out_dir, eval_file=..., ...)` trains a task head on a pre-trained
encoder (Devlin et al. 2019, section 4): full fine-tuning with AdamW, linear warmup then linear
decay, or the head alone with `freeze_encoder`. The peak learning rate defaults by the model's
width (`default_lr`): 3e-5 for BERT-base and wider (the paper searched 2e-5 … 5e-5), higher
for the small models, which learn next to nothing in an epoch at base's rate. After every epoch
the eval set is scored; the best model so far is written to OUT_DIR at once, so a crash or a kill
later loses nothing already learned; `patience` epochs without improvement stop the run.

Resumable exactly, as pre-training is (`loop.py`). Every task runs under `torchrun` too, the
global batch shared out among the processes (`bertkit.train.parallel`).

OUT_DIR is a Hugging Face model directory (config.json with id2label / label2id,
model.safetensors, tokenizer files) that `transformers`' matching `BertFor…` class loads with the
same predictions, plus:
  finetune_config.json   every setting of the run (`bertkit predict` reads the task and lengths from it)
  metrics.jsonl          one line per epoch: train loss, learning rate, eval metrics
  steps.jsonl            one line per optimizer step: epoch, loss, learning rate
  eval.json              the best epoch's eval metrics, test metrics of the best model, data
    reports; on a crash, the error and what had been saved

`model` is a model directory or a preset name (tiny … large) for a randomly initialised encoder of
that size, whose tokenizer then comes from `tokenizer`. Data come from files (see
`bertkit.data.formats`) or built-in sets (`builtin:NAME[:SPLIT]`, see `bertkit.data.labelled`): a
built-in train split brings its dev split as eval set and its test split as test set.

Evaluation runs on the inference engine with the uses' own decoding (`task.py`), so a run's dev
score is measured on what `bertkit classify|ner|qa` and `bertkit predict`
(`inference.jobs.predict_file`) answer.

    tasks.py   the task table: each task's trainer, settings, Task class, chance loss and
               baseline; `run_finetune` and `finetune`, which run any task of it
    config.py  FinetuneConfig: every setting of a run
    task.py    the Task protocol and the three tasks (reading, labels, features, evaluation)
    setup.py   the tokenizer, the model, the device, the output directory
    loop.py    the run on labelled data: its epochs, the training state, resume
"""

from bertkit.train.finetune.config import TASKS, FinetuneConfig
from bertkit.train.finetune.loop import CONFIG_FILE, RUN_OUTPUTS, features_digest, shuffled_batches, train_labelled
from bertkit.train.finetune.setup import EVAL_FILE, METRICS_FILE, STEPS_FILE, build_model, device_for
from bertkit.train.finetune.task import ClassifyTask, NerTask, QATask, Task
from bertkit.train.finetune.tasks import (
    TASK_CLASSES,
    TASK_ROWS,
    TaskRow,
    finetune,
    finetune_settings,
    row_of,
    run_finetune,
)
from bertkit.train.optim import default_lr

__all__ = ["CONFIG_FILE", "EVAL_FILE", "METRICS_FILE", "RUN_OUTPUTS", "STEPS_FILE", "TASKS", "TASK_CLASSES",
           "TASK_ROWS", "ClassifyTask", "FinetuneConfig", "NerTask", "QATask", "Task", "TaskRow", "build_model",
           "default_lr", "device_for", "features_digest", "finetune", "finetune_settings", "row_of",
           "run_finetune", "shuffled_batches", "train_labelled"]
