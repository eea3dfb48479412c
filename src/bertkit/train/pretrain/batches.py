"""What the training loop reads and counts: one DataLoader over the whole run, and the statistics
of a forward pass (summed on device, reduced across ranks once per log line)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
from typing import Any

import torch
from torch import nn

from bertkit.backend.precision import autocast
from bertkit.constants import IGNORE_INDEX
from bertkit.data.shards import PretrainingBatches


# ---------------------------------------------------------------------------------------------
# Data: one DataLoader for the whole run, over (epoch, batch index) pairs
# ---------------------------------------------------------------------------------------------
class RunBatches(torch.utils.data.Dataset):
    """Item (epoch, i) = micro-batch i of that epoch for this rank.

    Indexing by (epoch, i) lets one DataLoader — and its worker processes — serve every epoch of
    the run, and lets a resumed run start in the middle of an epoch by starting its index list
    there. Each worker builds the epoch's `PretrainingBatches` (a permutation) once and caches it.
    """

    def __init__(self, data, rank_batch_size: int, *, seed: int, mlm_probability: float,
                 rank: int, world_size: int):
        self.data = data
        self.kwargs = dict(seed=seed, rank=rank, world_size=world_size, mlm_probability=mlm_probability)
        self.rank_batch_size = rank_batch_size  # rows this rank reads per micro-batch
        self._epochs: dict[int, Any] = {}
        self.batches_per_epoch = len(self._epoch(0))

    def _epoch(self, epoch: int):
        if epoch not in self._epochs:  # keep one epoch: its permutation is all there is to cache
            self._epochs = {epoch: PretrainingBatches(self.data, self.rank_batch_size, epoch=epoch,
                                                       **self.kwargs)}
        return self._epochs[epoch]

    def __getitem__(self, key: tuple[int, int]) -> dict[str, torch.Tensor]:
        epoch, i = key
        return self._epoch(epoch)[i]

    def __len__(self) -> int:
        return self.batches_per_epoch

    def positions(self, start: int, stop: int) -> list[tuple[int, int]]:
        """(epoch, i) of the run's micro-batches number start .. stop-1 (counted from step 0)."""
        return [divmod(k, self.batches_per_epoch) for k in range(start, stop)]


def _ignore_stop_signals(worker_id: int) -> None:
    # Ctrl-C reaches the whole process group. The main process turns SIGINT / SIGTERM into a
    # checkpoint at the next step boundary; a worker dying on them instead would break the batch
    # that step still needs. Workers exit with their parent regardless (DataLoader watches it).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def loader_workers(requested: int | None, device: torch.device) -> int:
    """DataLoader workers: `requested`, or by default 1 on CUDA or when a core is free of torch's
    threads, else 0 (batches then build in the training process)."""
    if requested is not None:
        return requested
    spare_core = (os.cpu_count() or 1) > torch.get_num_threads()
    return 1 if device.type == "cuda" or spare_core else 0


def make_loader(dataset: torch.utils.data.Dataset, keys: list, num_workers: int,
                device: torch.device) -> torch.utils.data.DataLoader:
    """Batches are made whole by the dataset (batch_size=None); workers prefetch them in order."""
    return torch.utils.data.DataLoader(
        dataset, batch_size=None, sampler=keys, num_workers=num_workers,
        prefetch_factor=4 if num_workers > 0 else None,
        pin_memory=device.type == "cuda",
        worker_init_fn=_ignore_stop_signals if num_workers > 0 else None,
        # Our own generator: otherwise creating the iterator draws a seed from torch's global RNG,
        # which would shift the dropout stream of a resumed run against an uninterrupted one.
        generator=torch.Generator())


def data_digest(meta: dict) -> str:
    """Fingerprint of the prepared data, stored in checkpoints so a resume uses the same data."""
    return hashlib.sha256(json.dumps(meta, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# Statistics of one forward pass
# ---------------------------------------------------------------------------------------------
# Order of the per-window sums kept on device (one all-reduce per log line, not per step).
STATS = ("mlm_loss_sum", "mlm_correct", "mlm_count", "nsp_loss_sum", "nsp_correct", "nsp_count",
         "rtd_loss_sum", "rtd_correct", "rtd_count")


def batch_stats(out, mlm_labels: torch.Tensor, nsp_labels: torch.Tensor) -> torch.Tensor:
    """(9,) float64 sums for one micro-batch: see `STATS`. Needs `out.mlm_predictions` (M,); the
    replaced-token sums are zero for a model without that objective."""
    targets = mlm_labels[mlm_labels != IGNORE_INDEX]  # (M,)
    m = targets.numel()
    mlm_loss_sum = out.mlm_loss.detach().double() * m
    mlm_correct = (out.mlm_predictions == targets).sum().double()  # (M,) → ()
    has_nsp = nsp_labels != IGNORE_INDEX  # (B,)
    # Labels the model did not score (--objective mlm on pair data) do not count as NSP rows.
    n = int(has_nsp.sum()) if out.nsp_loss is not None else 0
    if out.nsp_loss is not None and n:
        nsp_loss_sum = out.nsp_loss.detach().double() * n
        nsp_correct = (out.nsp_logits.detach().argmax(-1)[has_nsp] == nsp_labels[has_nsp]).sum().double()
    else:
        nsp_loss_sum = nsp_correct = torch.zeros((), dtype=torch.float64, device=mlm_labels.device)
    rtd = getattr(out, "rtd_loss", None)
    if rtd is not None:
        rtd_count = float(out.rtd_count)
        rtd_sums = [rtd.detach().double() * rtd_count, out.rtd_correct.double(), rtd.new_tensor(rtd_count).double()]
    else:
        rtd_sums = [torch.zeros((), dtype=torch.float64, device=mlm_labels.device)] * 3
    return torch.stack([mlm_loss_sum, mlm_correct, mlm_loss_sum.new_tensor(float(m)),
                        nsp_loss_sum, nsp_correct, nsp_loss_sum.new_tensor(float(n)), *rtd_sums])


def summarise(stats: torch.Tensor, rtd_weight: float = 0.0) -> dict[str, float | None]:
    """Window sums → loss, mlm_loss, mlm_accuracy, nsp_loss, nsp_accuracy (None without NSP),
    and, for replaced-token detection only, rtd_loss and rtd_accuracy (its loss enters `loss`
    times rtd_weight, as it is trained)."""
    s = dict(zip(STATS, stats.tolist()))
    mlm_loss = s["mlm_loss_sum"] / s["mlm_count"] if s["mlm_count"] else float("nan")
    out: dict[str, float | None] = {
        "mlm_loss": mlm_loss,
        "mlm_accuracy": s["mlm_correct"] / s["mlm_count"] if s["mlm_count"] else None,
        "nsp_loss": s["nsp_loss_sum"] / s["nsp_count"] if s["nsp_count"] else None,
        "nsp_accuracy": s["nsp_correct"] / s["nsp_count"] if s["nsp_count"] else None,
    }
    out["loss"] = mlm_loss + (out["nsp_loss"] or 0.0)
    if s["rtd_count"]:  # the keys appear only in runs that train the objective
        out["rtd_loss"] = s["rtd_loss_sum"] / s["rtd_count"]
        out["rtd_accuracy"] = s["rtd_correct"] / s["rtd_count"]
        out["loss"] += rtd_weight * out["rtd_loss"]
    return out


@torch.no_grad()
def evaluation_sums(model: nn.Module, batches, *, device: torch.device, precision: str,
                    max_batches: int | None = None, use_nsp: bool = True) -> torch.Tensor:
    """(6,) sums (`STATS`) of a model over the first `max_batches` of `batches` (all if None).

    batches: a sequence of PretrainingBatches items. The model is put in eval mode (no dropout) and
    returned to its previous mode. `summarise(sums)` turns the result into losses and accuracies.
    use_nsp=False scores the MLM alone even where the batches carry NSP/SOP labels.
    """
    n = len(batches) if max_batches is None else min(max_batches, len(batches))
    total = torch.zeros(len(STATS), dtype=torch.float64, device=device)
    was_training = model.training
    model.eval()
    try:
        for i in range(n):
            batch = to_device(batches[i], device)
            has_nsp = use_nsp and bool((batch["nsp_labels"] != IGNORE_INDEX).any())
            with autocast(device, precision):
                out = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
                            mlm_labels=batch["mlm_labels"],
                            nsp_labels=batch["nsp_labels"] if has_nsp else None)
            total += batch_stats(out, batch["mlm_labels"], batch["nsp_labels"])
    finally:
        model.train(was_training)
    return total


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}
