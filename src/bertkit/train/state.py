"""Run-directory checkpoints: written atomically, pruned to the last K, resumed exactly.

Layout of a run directory:

    RUN_DIR/
      pretrain_config.json        every setting of the run
      metrics.jsonl               one JSON line per logged step / eval
      checkpoints/step-N/         Hugging Face model dir + tokenizer files + trainer_state.pt
      model/                      the newest good model (same files, no trainer state)

A checkpoint is first written to `checkpoints/.tmp-step-N` and renamed to `step-N` only when every
file is on disk, so any `step-N` that exists is complete: a kill at any moment leaves at worst a
`.tmp-*` directory, which the next run removes. `trainer_state.pt` holds only tensors and plain
Python values, so it loads with `torch.load(weights_only=True)` and can never run code.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

from bertkit.constants import TRAINING_PRECISIONS
from bertkit.data.report import json_lines, read_text
from bertkit.util.fileio import atomic_path, atomic_write_text, check_writable_output

logger = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
MODEL = "model"
TRAINER_STATE = "trainer_state.pt"
_STEP_DIR = re.compile(r"^step-(\d+)$")


# ------------------------------------------------------------------------------------ RNG state
def capture_rng_state() -> dict[str, Any]:
    """The generators a training step may draw from (dropout uses torch's), as plain values."""
    np_state = np.random.get_state(legacy=False)
    state = {
        "python": random.getstate(),
        "numpy": {"bit_generator": np_state["bit_generator"],
                  "key": np_state["state"]["key"].tolist(), "pos": int(np_state["state"]["pos"]),
                  "has_gauss": int(np_state["has_gauss"]), "gauss": float(np_state["gauss"])},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of `capture_rng_state`."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = state["numpy"]
    np.random.set_state({"bit_generator": np_state["bit_generator"],
                         "state": {"key": np.array(np_state["key"], dtype=np.uint32),
                                   "pos": np_state["pos"]},
                         "has_gauss": np_state["has_gauss"], "gauss": np_state["gauss"]})
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ----------------------------------------------------------------------------- finding checkpoints
def list_checkpoints(run_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run as (step, path), oldest first."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and (child / TRAINER_STATE).is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint directory, or None."""
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def remove_partial_checkpoints(run_dir: str | os.PathLike) -> list[Path]:
    """Delete `.tmp-*` leftovers of a run killed while saving; returns what was removed."""
    removed = []
    for parent in (Path(run_dir) / CHECKPOINTS, Path(run_dir)):
        if parent.is_dir():
            for child in parent.iterdir():
                if child.name.startswith(".tmp-") and child.is_dir():
                    shutil.rmtree(child, ignore_errors=True)
                    removed.append(child)
    return removed


# ------------------------------------------------------------------------------------- saving
def model_is_finite(model: nn.Module) -> bool:
    """False if any parameter holds NaN or ±inf (such a model must never replace a good one)."""
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


def _fsync_tree(directory: Path) -> None:
    # Renaming only guarantees atomicity; fsync makes the content survive a power loss too.
    for path in directory.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())
    _fsync_dir(directory)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # some platforms cannot open a directory; the rename is still atomic
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(run_dir: str | os.PathLike, step: int, model: nn.Module,
                    tokenizer_dir: str | os.PathLike | None, trainer_state: dict[str, Any],
                    keep: int, *, write_model: Callable[[nn.Module, Path], Any] | None = None,
                    publish: bool = True) -> Path:
    """Write `checkpoints/step-<step>` atomically, refresh `model/`, keep the newest `keep`.

    model: anything with `save_pretrained(dir)` (the unwrapped model, not the DDP wrapper).
    tokenizer_dir: its files (vocab.txt, tokenizer.json, ...) are copied next to the weights, so the
    checkpoint is a complete Hugging Face model directory; None copies none.
    trainer_state: tensors and plain values only (see module docstring).
    write_model: how the model's files are written into the checkpoint (default its
    save_pretrained; fine-tuning with LoRA keeps the frozen base and the adapters apart).
    publish: refresh RUN_DIR/model from the checkpoint (pre-training, distillation); fine-tuning
    publishes its best epoch itself.
    Raises RuntimeError, saving nothing, if the model holds non-finite values.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    if not model_is_finite(model):
        raise RuntimeError(f"refusing to save step {step}: the model has non-finite weights; "
                           "the last good checkpoint is kept")
    root = Path(run_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step}"
    tmp = root / f".tmp-step-{step}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    if write_model is None:
        model.save_pretrained(tmp)
    else:
        write_model(model, tmp)
    if tokenizer_dir is not None:
        # A companion model saved beside the main one (ELECTRA's generator/) gets the tokenizer
        # too, so that each directory loads on its own.
        for model_dir in (tmp, *(sub for sub in tmp.iterdir() if (sub / "config.json").is_file())):
            copy_tokenizer_files(tokenizer_dir, model_dir)
    torch.save(trainer_state, tmp / TRAINER_STATE)
    _fsync_tree(tmp)
    if final.exists():  # the same step saved again (e.g. end of run right after a periodic save)
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    if publish:
        publish_model(final, Path(run_dir) / MODEL)
    for _, old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def copy_tokenizer_files(tokenizer_dir: str | os.PathLike, out_dir: str | os.PathLike) -> None:
    """Copy every regular file of `tokenizer_dir` into `out_dir` (config.json excepted)."""
    src = Path(tokenizer_dir)
    if not src.is_dir():
        raise FileNotFoundError(f"tokenizer directory {src} does not exist")
    for path in src.iterdir():
        # The model's config.json is the one that describes the weights; never clobber it.
        if path.is_file() and path.name != "config.json":
            shutil.copy2(path, Path(out_dir) / path.name)


def publish_model(checkpoint_dir: Path, model_dir: Path) -> None:
    """Make `model_dir` a copy of the checkpoint's model files (trainer state left out).

    Files are hard-linked where the filesystem allows (no extra disk, instant) and the directory is
    swapped in by rename, so `model_dir` is always either the old complete model or the new one.
    """
    tmp = model_dir.parent / f".tmp-{model_dir.name}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    _link_tree(checkpoint_dir, tmp, skip=TRAINER_STATE)
    old = model_dir.parent / f".tmp-old-{model_dir.name}"
    if model_dir.exists():
        if old.exists():
            shutil.rmtree(old)
        os.replace(model_dir, old)
    os.replace(tmp, model_dir)
    shutil.rmtree(old, ignore_errors=True)


def _link_tree(src: Path, dst: Path, skip: str) -> None:
    """Hard-link (or copy) every file under `src` into `dst`, subdirectories included, but `skip`."""
    for path in src.iterdir():
        if path.is_dir():
            (dst / path.name).mkdir()
            _link_tree(path, dst / path.name, skip)
        elif path.is_file() and path.name != skip:
            try:
                os.link(path, dst / path.name)
            except OSError:
                shutil.copy2(path, dst / path.name)


def load_trainer_state(checkpoint_dir: str | os.PathLike) -> dict[str, Any]:
    """The trainer state of a checkpoint, loaded with `weights_only=True`."""
    path = Path(checkpoint_dir) / TRAINER_STATE
    if not path.is_file():
        raise FileNotFoundError(f"{checkpoint_dir} is not a complete checkpoint: {TRAINER_STATE} "
                                "is missing")
    return torch.load(path, map_location="cpu", weights_only=True)


# ----------------------------------------------------------------------------- pre-flight checks
def checkpoint_bytes(model: nn.Module) -> int:
    """Rough size of one checkpoint: fp32 weights + AdamW's two moments, plus 10% slack."""
    n = sum(p.numel() for p in model.parameters())
    return int(n * 4 * 3 * 1.1)


def check_output_dir(run_dir: str | os.PathLike, need_bytes: int) -> None:
    """Fail before training if `run_dir` cannot be written or its disk lacks `need_bytes` free."""
    run_dir = Path(run_dir)
    probe_parent = run_dir
    while not probe_parent.exists():
        probe_parent = probe_parent.parent
    if not probe_parent.is_dir():
        raise NotADirectoryError(f"cannot create run directory {run_dir}: {probe_parent} is a file")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        with atomic_path(run_dir / ".write-test") as tmp:
            tmp.write_bytes(b"ok")
        (run_dir / ".write-test").unlink()
    except OSError as err:
        raise ValueError(f"run directory {run_dir} is not writable ({err.strerror}); "
                         "choose another --out") from None
    free = shutil.disk_usage(run_dir).free
    if free < need_bytes:
        raise ValueError(f"only {free / 2**20:.0f} MiB free at {run_dir}, but checkpoints need about "
                         f"{need_bytes / 2**20:.0f} MiB; free some space, lower --keep or choose "
                         "another --out")


# ------------------------------------------------------------------------------ resume check
def check_same_settings(out: str | os.PathLike, saved: dict[str, Any], current: dict[str, Any],
                        source: Path, may_differ: set[str] | frozenset[str], fix: str) -> None:
    """A resumed run must make the same updates as the one it continues: every setting but the
    operational ones (`may_differ`: threads, progress, save interval, ...) as `saved` in `source`.
    `fix`: the sentence that ends the error, saying what to do instead."""
    changed = sorted(k for k in current if k not in may_differ and saved.get(k) != current[k])
    if changed:
        details = ", ".join(f"{k}: {saved.get(k)!r} → {current[k]!r}" for k in changed)
        raise ValueError(f"cannot resume {out} with different settings ({details}; saved in {source}). {fix}")


def resume_checkpoint(out: str | os.PathLike, settings: dict[str, Any], settings_file: Path,
                      may_differ: set[str] | frozenset[str]) -> Path | None:
    """The newest training state of a run directory to continue from, once `settings` are found
    to be the ones the run wrote to `settings_file` (but `may_differ`); None when the run saved
    none yet (it then starts from step 0)."""
    checkpoint = latest_checkpoint(out)
    if checkpoint is None:
        logger.info("no training state in %s yet; starting from step 0", out)
        return None
    check_same_settings(out, saved_settings(settings_file), settings, settings_file, may_differ,
                        "Resume with the original settings, or start over with --overwrite")
    return checkpoint


def check_run_outputs(out_dir: str | os.PathLike, outputs: tuple[str, ...], *, overwrite: bool,
                      resume: bool) -> Path:
    """OUT may be new or hold no run's files; a previous run's are continued only with `resume`
    and replaced only with `overwrite`. Checked before any work, so a bad --out fails at once."""
    out = check_writable_output(out_dir, overwrite=None, kind="dir")
    existing = [name for name in outputs if (out / name).exists()]
    if existing and not (overwrite or resume):
        raise FileExistsError(f"{out} already holds {', '.join(existing)}; choose another --out, "
                              "pass --resume to continue it or --overwrite to replace it")
    return out


def saved_settings(path: Path) -> dict[str, Any]:
    """The settings a run wrote at its start ({} when it had not yet written them)."""
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


# ------------------------------------------------------------------------------- metrics log
METRICS = "metrics.jsonl"


def read_metrics(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """Every record of `RUN_DIR/metrics.jsonl`, in file order (a torn last line is skipped)."""
    path = Path(run_dir) / METRICS
    if not path.is_file():
        raise FileNotFoundError(f"no {METRICS} in {run_dir}; pass the --out directory of "
                                "`bertkit pretrain` or `bertkit finetune`")
    return read_records(path)


def read_records(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON Lines log, in file order. A run killed mid-write leaves at most
    one partial line: it is skipped."""
    lines = enumerate(read_text(path).splitlines(), start=1)
    return [record for _, record, error in json_lines(lines) if error is None and isinstance(record, dict)]


class MetricsLog:
    """Appends one JSON object per line to `RUN_DIR/metrics.jsonl` (or another `name`), flushed at once.

    On resume from step N, `truncate_after(N)` first drops lines that a killed run wrote after its
    last checkpoint, so the file holds every step exactly once.
    """

    def __init__(self, run_dir: str | os.PathLike, name: str = METRICS):
        self.path = Path(run_dir) / name

    def truncate_after(self, step: int) -> None:
        if not self.path.is_file():
            return
        kept = [r for r in read_records(self.path) if r.get("step", 0) <= step]
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))

    def write(self, record: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")


def run_problems(*, lr: float | None, warmup_ratio: float, resume: bool, overwrite: bool,
                 precision: str) -> list[str]:
    """What is wrong with the settings every training run shares, one message a problem, each
    naming the value (lr None: the task's own default, nothing to check)."""
    problems = []
    if lr is not None and not lr > 0:
        problems.append(f"lr must be > 0, got {lr!r}")
    if not 0 <= warmup_ratio < 1:
        problems.append(f"warmup_ratio must be in [0, 1), got {warmup_ratio!r}")
    if resume and overwrite:
        problems.append("resume and overwrite exclude each other; pass one")
    if precision not in TRAINING_PRECISIONS:
        problems.append(f"precision must be one of {', '.join(TRAINING_PRECISIONS)}, got {precision!r}")
    return problems
