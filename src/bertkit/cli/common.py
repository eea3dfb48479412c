"""What several rooms of the CLI share: the option groups (the engine's, adapters, the training loop,
a run's), the engine options they make, JSON lines out, the web stack check."""

from __future__ import annotations

import argparse
import json
from typing import Any

from bertkit.constants import ENGINE_PRECISIONS, POOLINGS, TRAINING_PRECISIONS

# int8 is dynamic quantisation for inference; training needs gradients, so its commands stop at bf16.
DEVICES = ["auto", "cpu", "cuda"]
BATCH_TOKENS_HELP = "real tokens per batch (8192)"


def add_engine_arguments(p: argparse.ArgumentParser, *, explain_precision: bool = False,
                         max_batch_tokens_help: str | None = None, max_length_help: str | None = None,
                         truncate: bool = False, device: str = "cpu", calibration: bool = False) -> None:
    """The inference engine's flags, for every command that builds one: --precision and --device
    always; --max-batch-tokens and --max-length where a help text is given (search batches its
    queries itself; serve limits inputs with its own --max-input-length, as text-embeddings-inference
    names it); --no-truncate with `truncate`; --calibration (int8-static's text) with `calibration`.
    Defaults are the engine's: exact fp32 on the CPU (`predict` keeps its own: the GPU when
    there is one)."""
    p.add_argument("--precision", choices=ENGINE_PRECISIONS, default="fp32",
                   help="fp32 (default, exact); bf16; int8 (dynamic, per-token; CPU); int8-static "
                   "(calibrated: --calibration FILE, or a directory from `bertkit calibrate`; CPU); auto = "
                   "the faster of fp32 and bf16, measured on this machine" if explain_precision else None)
    if calibration:
        p.add_argument("--calibration", metavar="FILE", default=None,
                       help="int8-static: text to measure activation ranges on, one text a line")
    if max_batch_tokens_help is not None:
        p.add_argument("--max-batch-tokens", type=int, default=8192, help=max_batch_tokens_help)
    if max_length_help is not None:
        p.add_argument("--max-length", type=int, default=None, help=max_length_help)
    if truncate:
        p.add_argument("--no-truncate", action="store_false", dest="truncate",
                       help="refuse inputs over the limit instead of truncating them with a warning")
    p.add_argument("--device", choices=DEVICES, default=device)


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """Engine.load's keyword arguments from the flags `add_engine_arguments` declared: --precision,
    --device, and --max-batch-tokens and --no-truncate where the command has them; --max-length
    and --calibration only when given, so that the model's own limit and saved scales apply
    otherwise."""
    options = {"precision": args.precision, "device": args.device}
    for name in ("max_batch_tokens", "truncate"):
        if name in vars(args):
            options[name] = getattr(args, name)
    for name in ("max_length", "calibration"):
        if getattr(args, name, None):
            options[name] = getattr(args, name)
    return options


def add_adapter_arguments(p: argparse.ArgumentParser, adapter_help: str, *, model: str = "MODEL") -> None:
    """--adapter DIR (a LoRA adapter run over `model`, its base; `adapter_help` says what it
    brings) and --base, for the commands that run a model directory or an adapter over it."""
    p.add_argument("--adapter", metavar="DIR", help=adapter_help)
    add_base_argument(p, model=model)


def add_base_argument(p: argparse.ArgumentParser, *, model: str = "MODEL") -> None:
    """--base DIR: the base of an adapter dir given as `model` (the flag or positional that
    names it), when the base its adapter_config.json names is not a directory here."""
    p.add_argument("--base", metavar="DIR",
                   help=f"the base model of an adapter given as {model}, when its adapter_config.json's "
                   "base_model_name_or_path is not a directory here")


def add_pooling_argument(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """--pooling of the commands that embed with a model's own pooling unless told otherwise."""
    p.add_argument("--pooling", choices=POOLINGS, default=None,
                   help="default: the model's sentence-transformers pooling, else mean")


def add_training_engine_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup, *,
                                  explain_precision: bool = False) -> None:
    """--device and --precision of the training commands. No defaults here: those parsers suppress
    what the user left out, so their config class's defaults apply (auto precision picks bf16 on
    CUDA)."""
    p.add_argument("--device", choices=DEVICES)
    p.add_argument("--precision", choices=TRAINING_PRECISIONS,
                   help="auto = bf16 on CUDA; on CPU the faster of fp32 / bf16, measured here"
                   if explain_precision else None)


# The optimisation settings the trainers' config classes share (PretrainConfig, FinetuneConfig,
# DistillConfig): what each flag parses (--epochs: see add_loop_arguments). The help stays with each
# command, whose defaults differ.
LOOP_FLAGS: dict[str, dict[str, Any]] = {
    "max_steps": {"type": int}, "batch_size": {"type": int}, "grad_accum": {"type": int},
    "lr": {"type": float}, "weight_decay": {"type": float},
    "schedule": {"choices": ["linear", "cosine", "constant"]}, "warmup_ratio": {"type": float},
    "warmup_steps": {"type": int}, "max_grad_norm": {"type": float},
}


def add_loop_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup, *, epochs_type: type = int,
                       **helps: str) -> None:
    """A training command's optimisation flags, in the order given: each keyword names epochs or a
    setting of LOOP_FLAGS (lr → --lr) and gives its help. epochs_type: float where a fraction of a
    pass is a run of its own (pre-training), else whole passes."""
    for name, text in helps.items():
        parse = {"type": epochs_type} if name == "epochs" else LOOP_FLAGS[name]
        p.add_argument("--" + name.replace("_", "-"), help=text, **parse)


def add_run_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup, *, resume: str,
                      overwrite: str) -> None:
    """--resume, --overwrite and --no-progress of a command that writes a run or a file; the help
    of the first two says what they do to that command's output."""
    p.add_argument("--resume", action="store_true", help=resume)
    p.add_argument("--overwrite", action="store_true", help=overwrite)
    p.add_argument("--no-progress", action="store_false", dest="progress", help="no progress bar")


def config_settings(args: argparse.Namespace, *leave_out: str) -> dict[str, Any]:
    """The parsed options as a config class's keyword arguments: all but the subcommand's own
    (command, func) and `leave_out`."""
    return {k: v for k, v in vars(args).items() if k not in ("command", "func", *leave_out)}


def print_json(rows) -> None:
    """One JSON object a line (--json)."""
    for row in rows:
        print(json.dumps(row, ensure_ascii=False))


def print_file_job(summary: dict, engine=None) -> None:
    """What a file job did, for people (one line, and one for truncated inputs), then its JSON."""
    skipped = summary.get("skipped") or 0
    precision = engine.precision if engine is not None else summary.get("precision")
    print(f"{summary['rows']:,} row{'' if summary['rows'] == 1 else 's'} → {summary['out']} "
          f"({precision}, {summary.get('rows_per_second') or 0:,.0f} rows/s"
          f"{f', {skipped:,} bad row' + ('' if skipped == 1 else 's') + ' skipped' if skipped else ''})")
    truncated = engine.stats.truncated if engine is not None else summary.get("truncated", 0)
    if truncated:
        max_length = engine.max_length if engine is not None else summary.get("max_length")
        print(f"{truncated:,} input{'' if truncated == 1 else 's'} over {max_length} tokens truncated")
    print(json.dumps(summary, ensure_ascii=False, default=str))


def need_web_stack(command: str) -> None:
    """The `serve` extra's packages, or an error with the line that installs them."""
    import importlib.util

    # pydantic: the request and answer models; swagger_ui_bundle: the /docs page (bertkit.util.webapi).
    for module in ("starlette", "uvicorn", "prometheus_client", "pydantic", "swagger_ui_bundle"):
        if importlib.util.find_spec(module) is None:
            raise ValueError(f"bertkit {command} needs the web stack ({module} is not installed): "
                             "pip install 'bertkit[serve]'")
