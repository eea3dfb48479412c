"""bertkit distill: a teacher distilled into a student with fewer layers (general or per task)."""

from __future__ import annotations

import argparse
import json

from bertkit.cli.common import add_loop_arguments, add_run_arguments, add_training_engine_arguments, config_settings
from bertkit.constants import DISTILL_TASKS


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("distill", help="distil a teacher into a student with fewer layers",
                       description="General distillation on prepared pre-training data (--data) or "
                       "task distillation from a fine-tuned teacher (--task classify|ner --train, "
                       "optionally --unlabeled): the student copies teacher layers spread over the "
                       "depth and learns loss = alpha_ce * KL * T^2 + alpha_hard * (MLM or label CE) "
                       "+ alpha_cos * (1 - cos) of last hidden states. Options left out take the "
                       "defaults of bertkit.train.distill.DistillConfig. OUT holds model/ (the "
                       "student), metrics.jsonl, checkpoints/ and summary.json.",
                       argument_default=argparse.SUPPRESS)
    p.add_argument("--teacher", required=True, help="teacher model directory (fine-tuned for --task)")
    p.add_argument("--out", required=True, dest="out_dir", help="output directory")
    p.add_argument("--task", choices=DISTILL_TASKS, help="task distillation (default: general)")
    p.add_argument("--data", help="general: DATA_DIR made by `bertkit prepare` with the teacher's tokenizer")
    p.add_argument("--train", help="task: labelled training file or builtin:NAME[:SPLIT]")
    p.add_argument("--unlabeled", help="task: inputs without labels (soft labels from the teacher only)")
    p.add_argument("--eval", help="task: scored after every epoch")
    p.add_argument("--test", help="task: scored at the end")
    p.add_argument("--student-layers", type=int, help="layers of the student (6)")
    p.add_argument("--layers", type=lambda text: [int(i) for i in text.split(",")], metavar="I,J,...",
                   help="the teacher layers to copy (default: spread over the depth, 12 -> 6: 0,2,4,7,9,11)")
    p.add_argument("--temperature", type=float, help="softmax temperature T (2.0)")
    p.add_argument("--alpha-ce", type=float, help="weight of the soft loss (5 general, 1 task)")
    p.add_argument("--alpha-hard", type=float, help="weight of MLM / label cross-entropy (2 general, 0 task)")
    p.add_argument("--alpha-cos", type=float,
                   help="weight of the hidden-state cosine loss (1 general, 0 task)")
    add_loop_arguments(p, epochs="passes over the data (3)", max_steps="stop after N steps",
                       batch_size="examples per step (32)", lr="peak learning rate (5e-4)",
                       warmup_ratio="share of steps warming up (0.05)")
    p.add_argument("--max-length", type=int, help="task: pieces per example (128)")
    p.add_argument("--max-train-examples", type=int, help="task: train on the first N examples only")
    p.add_argument("--seed", type=int)
    p.add_argument("--log-every", type=int, help="steps per metrics.jsonl line (10)")
    p.add_argument("--save-every", type=int, help="steps between checkpoints (200; also at the end)")
    add_training_engine_arguments(p)
    add_run_arguments(p, resume="continue OUT from its latest checkpoint",
                      overwrite="replace the results in an existing OUT")
    p.set_defaults(func=_run_distill)


def _run_distill(args: argparse.Namespace) -> None:
    import logging

    from bertkit.train.distill import DistillConfig, distill

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    config = DistillConfig(**config_settings(args))
    summary = distill(config)
    line = (f"student saved in {summary['model']} ({len(summary['layers'])} of "
            f"{summary['teacher_layers']} layers)")
    for split in ("eval", "test"):
        scores = summary.get(split) or {}
        for metric in ("accuracy", "f1"):
            if isinstance(scores.get(metric), (int, float)):
                line += f"; {split} {metric} {scores[metric]:.4f}"
    print(line)
    print(json.dumps(summary, ensure_ascii=False))
