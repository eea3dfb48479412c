"""What a fine-tuning run starts from and writes to: tokenizer, model, device, output directory."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bertkit.data.tokenizer import BertTokenizer
from bertkit.encoder.checkpoint import load_into, read_state_dict, to_hf_state_dict
from bertkit.encoder.config import PRESETS, BertConfig
from bertkit.encoder.heads import task_class
from bertkit.train import card, lora
from bertkit.train import state as train_state
from bertkit.train.finetune.config import FinetuneConfig
from bertkit.util import distributed
from bertkit.util.fileio import missing_model_dir, model_directory

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
EVAL_FILE = "eval.json"
STEPS_FILE = "steps.jsonl"
HEAD_PREFIXES = ("classifier.", "qa_outputs.")  # Hugging Face names of the task heads' tensors


def load_tokenizer(config: FinetuneConfig) -> BertTokenizer:
    """The run's tokenizer: --tokenizer, else the model directory's own."""
    source = config.tokenizer
    if source is None:
        if config.model in PRESETS:
            raise ValueError(f"--model {config.model} is a preset (random init) and has no tokenizer; "
                             "pass --tokenizer DIR (e.g. the directory of a pre-trained model)")
        if not Path(config.model).exists():
            raise FileNotFoundError(missing_model_dir(config.model, "--model") + f", or a preset "
                                    f"({', '.join(PRESETS)}) with --tokenizer")
        source = model_directory(config.model, "--model")
    return BertTokenizer.from_pretrained(source)


def build_model(task: str, model: str, vocab_size: int, label_overrides: dict[str, Any],
                seed: int) -> nn.Module:
    """The task model: a preset of fresh weights (seeded), or a directory's weights with the head
    for `label_overrides`. A head of a different size in the directory (an earlier task's) is
    dropped and initialised afresh; a head of the same labels is kept."""
    cls = task_class(task)
    torch.manual_seed(seed)  # the new head (and a preset's encoder) start from the run's seed
    if model in PRESETS:
        return cls(BertConfig.preset(model, vocab_size=vocab_size, **label_overrides))
    if not Path(model).exists():
        raise FileNotFoundError(missing_model_dir(model, "--model") + f", or a preset "
                                f"({', '.join(PRESETS)})")
    directory = model_directory(model, "--model")
    config = BertConfig.from_json(directory)
    if config.vocab_size != vocab_size:
        raise ValueError(f"the model's vocab_size {config.vocab_size} differs from the tokenizer's "
                         f"{vocab_size}; use the tokenizer the model was trained with")
    config = config.replace(**label_overrides) if label_overrides else config
    net = cls(config)
    state = read_state_dict(directory)
    own_shapes = {k: v.shape for k, v in to_hf_state_dict(net.state_dict()).items()}
    stale = [k for k, v in state.items() if k.startswith(HEAD_PREFIXES) and k in own_shapes
             and tuple(v.shape) != tuple(own_shapes[k])]
    if stale:
        log.warning("%s: task head %s has another label set; it is initialised afresh", model,
                    ", ".join(stale))
        state = {k: v for k, v in state.items() if k not in stale}
    net.load_report = load_into(net, state, str(directory))
    return net


def device_for(name: str) -> torch.device:
    """The device of a single-process run (distillation; fine-tuning runs under torchrun too, see
    `train.parallel`)."""
    info = distributed.init_distributed(name)
    if info.world_size > 1:
        raise ValueError("distillation runs in a single process; start it without torchrun")
    return info.device


def start_out_dir(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in (METRICS_FILE, EVAL_FILE, STEPS_FILE):
        (out / name).unlink(missing_ok=True)  # stale results must not mix with this run's
    card.drop_stale(out)  # an earlier run's card would describe that run until this one ends
    shutil.rmtree(out / train_state.CHECKPOINTS, ignore_errors=True)


def save_model(model: nn.Module, out: Path, config: FinetuneConfig) -> None:
    """The model OUT_DIR holds: itself, or with LoRA merged / as PEFT adapters (`lora_save`)."""
    if config.lora:
        lora.save_lora(model, out, config.lora_save, base_model=str(Path(config.model).resolve()))
    else:
        model.save_pretrained(out)


def load_best(model: nn.Module, out: Path, config: FinetuneConfig, label_overrides: dict) -> nn.Module:
    """The best model saved in OUT_DIR, for the test score: as `save_model` wrote it."""
    if config.lora and config.lora_save == "adapters":
        best = build_model(config.task, config.model, model.config.vocab_size, label_overrides, config.seed)
        lora.apply_lora(best, lora.LoraSpec.parse(config.lora))
        lora.load_adapters(best, out)
        return best.eval()
    return type(model).from_pretrained(out)
