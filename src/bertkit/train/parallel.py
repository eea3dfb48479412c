"""Fine-tuning under `torchrun`: every task's trainer shares one global batch out among the ranks.

`torchrun --nproc_per_node N -m bertkit.cli finetune ...` starts N copies of the run; each joins
the process group (`util.distributed`: gloo on CPU, NCCL on CUDA), reads the whole training set
and draws the same batch order from the seed, then runs only its own contiguous slice of every
global batch of `batch_size` rows (`shard`). Gradients are averaged by PyTorch's
DistributedDataParallel; rank 0 alone writes files (metrics, steps, checkpoints, the model) and
scores the eval and test sets.

The update is the one a single process makes with the whole batch, not an approximation of it:

- A loss that is a mean over the batch's terms (rows, or the labelled tokens of NER) becomes this
  rank's share of the global mean, mean_r × terms_r / terms_all (`share`). DDP averages the
  ranks' gradients, so the share counts world_size times in `backward` (`for_backward`).
- A loss over the whole batch at once — in-batch negatives (embed, sparse) and SPLADE's FLOPS
  regulariser — gathers the embeddings of every rank with their gradients
  (`util.distributed.gather_with_grad`) and computes the global loss on every rank; its share is
  loss / world_size. GradCache (`--loss cached-mnrl`, `train.retrieval.gradcache`) gathers the
  embeddings it made without a graph the same way, then replays this rank's mini-batches, all but
  the last before DDP arms its hooks, so DDP all-reduces once, after the last.
- A batch with fewer rows than ranks (the short last batch of an epoch) runs whole on every rank
  (`Shard.replicated`), with the share loss / world_size.

Dropout draws differ from one process's: each rank has its own generator (seeded by the run's
seed and the rank), as rows run on different ranks. With dropout off, N processes and one
follow the same losses and weights up to float summation order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, Sequence, TypeVar

import torch
from torch import nn

from bertkit.train import state
from bertkit.util import distributed
from bertkit.util.distributed import DistInfo

Row = TypeVar("Row")


def check_batch_size(batch_size: int, info: DistInfo) -> None:
    """Every rank takes the same share of a full batch: batch_size must divide by the world size."""
    if batch_size % info.world_size:
        raise ValueError(f"--batch-size {batch_size} does not divide by the world size {info.world_size} "
                         f"(torchrun processes); pass a multiple of {info.world_size}")


@dataclass(frozen=True)
class Shard(Generic[Row]):
    """This rank's rows of one global batch."""

    rows: list[Row]
    replicated: bool  # the whole batch runs on every rank (fewer rows than ranks)
    info: DistInfo

    @property
    def group(self) -> DistInfo | None:
        """The ranks to gather a whole-batch loss's embeddings from; None when this rank holds the
        whole batch itself (one process, or a replicated short batch)."""
        return None if self.replicated or not self.info.enabled else self.info


def shard(batch: Sequence[Row], info: DistInfo) -> Shard[Row]:
    """The rows of `batch` (a global batch, in its order) that this rank runs."""
    if len(batch) < info.world_size or not info.enabled:
        return Shard(list(batch), replicated=True, info=info)
    return Shard(list(batch[distributed.rank_rows(len(batch), info)]), replicated=False, info=info)


def share(loss: torch.Tensor, part: Shard, terms: float | None = None, all_terms: float | None = None
          ) -> torch.Tensor:
    """This rank's part of the global batch's loss (the parts of all ranks sum to it), () float.

    loss: this rank's loss. A mean over `terms` terms (rows, or labelled tokens) of the batch's
    `all_terms` weighs by its terms; a loss over the whole batch (`terms` None: gathered, the same
    on every rank) or over a replicated batch counts 1 / world_size.
    """
    if terms is None or all_terms is None or part.replicated:
        return loss / part.info.world_size
    return loss * (terms / max(all_terms, 1.0))


def for_backward(part_loss: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """What to call `backward` on for the global loss's gradients: DDP averages the ranks'
    gradients, so each rank's share counts world_size times (the scaling pre-training uses)."""
    return part_loss * info.world_size


def global_loss(part_loss: torch.Tensor, info: DistInfo) -> float:
    """The global batch's loss, the same on every rank: the sum of the ranks' shares."""
    total = part_loss.detach().clone().reshape(1).float()
    return float(distributed.all_reduce_sum(total, info))


class LossModule(nn.Module):
    """`model` behind one forward that computes a step's loss, so that DistributedDataParallel
    wraps the whole step: its output is the loss alone (an encoder output the loss never reads,
    such as the pooler's, would otherwise leave DDP waiting for gradients that never come), and
    the several encoder calls of a step (queries, then passages) are one forward. The loss comes
    as a function of the model, which DDP passes through untouched (it would copy lists of rows
    and turn their tuples into lists)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, loss_of: Callable[[nn.Module], Any]) -> Any:
        return loss_of(self.model)


def data_parallel(model: nn.Module, info: DistInfo) -> nn.Module:
    """What a step calls with its loss function: `LossModule(model)`, under DDP when there are
    several ranks. find_unused_parameters: a head or pooler the task does not train gets no
    gradient."""
    step = LossModule(model)
    if not info.enabled:
        return step
    return nn.parallel.DistributedDataParallel(
        step, device_ids=[info.device.index] if info.device.type == "cuda" else None,
        find_unused_parameters=True)


def seed_dropout(seed: int, info: DistInfo) -> None:
    """Under torchrun, a dropout stream per rank (fixed by the seed); one process keeps its own."""
    if info.enabled:
        torch.manual_seed(seed * 1000 + 1 + info.rank)


def gather_in_batch(queries: torch.Tensor, candidates: torch.Tensor, rows: int, group: DistInfo | None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """In-batch negatives across ranks: this rank's queries (B_r, D) and candidates (C_r, D), its
    `rows` positives first then its hard negatives → the global batch's (B, D) queries and (C, D)
    candidates, laid out as one process lays them out (every positive in row order, then every
    hard negative), gradients kept. Unchanged when `group` is None."""
    if group is None:
        return queries, candidates
    positives = distributed.gather_with_grad(candidates[:rows], group)  # (B, D)
    negatives = distributed.gather_with_grad(candidates[rows:], group)  # (C - B, D)
    return distributed.gather_with_grad(queries, group), torch.cat([positives, negatives])


def rank_rng_states(info: DistInfo) -> list[dict[str, Any]]:
    """Every rank's generator states (`train.state.capture_rng_state`), in rank order; all ranks call."""
    return distributed.all_gather_object(state.capture_rng_state(), info)


def restore_rank_rng(saved: dict[str, Any], info: DistInfo) -> None:
    """This rank's generators from a training state (`rank_rngs`, else `rng`: one process's)."""
    ranks = saved.get("rank_rngs")
    if ranks and len(ranks) == info.world_size:
        state.restore_rng_state(ranks[info.rank])
    else:  # another world size: the batches still match; only dropout draws afresh
        state.restore_rng_state(saved["rng"])
        if info.enabled:
            torch.manual_seed(int(saved.get("step", 0)) * 7919 + 1 + info.rank)
