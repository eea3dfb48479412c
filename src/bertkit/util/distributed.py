"""Process-group set-up for data-parallel training under `torchrun`.

`torchrun --nproc_per_node=N` starts N copies of the same command and tells each its place through
environment variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). With WORLD_SIZE > 1
we join the group (NCCL when the process has a GPU, gloo on CPU); otherwise everything below is a
no-op, so the training loop reads the same in one process and in many. Below the set-up, the
collectives the trainers share: sums, Python objects, the rows of a batch a rank takes, and a
gather that keeps gradients (in-batch negatives across ranks).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

# How long a collective waits for the other ranks. Fine-tuning's rank 0 scores the dev and test
# sets alone while the others wait at the next collective; PyTorch's defaults (10 minutes on
# NCCL, 30 on gloo) would end a run whose evaluation takes longer. A rank that dies still ends
# the run at once: torchrun stops the others.
GROUP_TIMEOUT = timedelta(hours=2)


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits: `rank` of `world_size`, its `device`, and the backend in use."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str | None  # None when running as a single process

    @property
    def is_main(self) -> bool:
        """Rank 0 logs, shows the progress bar and writes checkpoints."""
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer; "
                         "start distributed runs with torchrun") from None


def init_distributed(device: str = "auto") -> DistInfo:
    """Join the process group if WORLD_SIZE > 1 and pick this process's device.

    device: "auto" (CUDA if available, else CPU), "cpu" or "cuda". Under torchrun each process
    takes GPU LOCAL_RANK. On CPU the cores are shared out between the local processes, so N
    processes do not each start one thread per core and thrash.
    """
    world_size = _env_int("WORLD_SIZE", 1)
    rank = _env_int("RANK", 0)
    local_rank = _env_int("LOCAL_RANK", 0)
    local_world = _env_int("LOCAL_WORLD_SIZE", world_size)
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"unknown device {device!r}; choose auto, cpu or cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was given but no CUDA device is available; use --device cpu")
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())

    if use_cuda:
        if local_rank >= torch.cuda.device_count():
            raise ValueError(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPUs are "
                             "visible; lower --nproc_per_node")
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
        if world_size > 1 and "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, local_world)))

    backend = None
    if world_size > 1:
        backend = "nccl" if use_cuda else "gloo"
        if not dist.is_initialized():
            # env:// reads MASTER_ADDR / MASTER_PORT / RANK / WORLD_SIZE set by torchrun.
            dist.init_process_group(backend=backend, init_method="env://", timeout=GROUP_TIMEOUT,
                                    device_id=dev if use_cuda else None)
    return DistInfo(rank=rank, world_size=world_size, local_rank=local_rank, device=dev,
                    backend=backend)


# How long a rank that is done lets gloo's worker threads finish with the last collectives before
# the interpreter exits (see `leave_together`).
GLOO_DRAIN_SECONDS = 0.2


def leave_together(info: DistInfo) -> None:
    """The end of a successful run on every rank: wait for the others, then give gloo's worker
    threads the GIL for a moment before the interpreter exits.

    Collectives launched during a backward (DDP's all-reduces) hold PyTorch's autograd context, a
    Python object (`torch.autograd.graph._engine_run_backward` stashes it in thread-local state,
    which every collective copies). A gloo worker thread drops its last reference to a finished
    collective a moment after the caller wakes, and that needs the GIL; if the interpreter is
    already finalizing by then, the thread exits mid-destructor and the process aborts
    ("terminate called without an active exception", SIGABRT: 1 run in 5 of a rank that exits
    right after its backward, 1 in 40 with a barrier alone, which only holds on to the
    collectives before it). Sleeping releases the GIL, so that drop happens while Python is alive.
    Not on an error path: a barrier there would wait for ranks that may never come."""
    barrier(info)
    if info.enabled and info.backend == "gloo":
        time.sleep(GLOO_DRAIN_SECONDS)


def shutdown(info: DistInfo) -> None:
    """Leave the process group (safe to call when none was joined)."""
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(tensor: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """Sum `tensor` over all ranks in place (no-op in a single process); returns it."""
    if info.enabled:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_true(flag: bool, info: DistInfo) -> bool:
    """True only if `flag` is true on every rank: lets all ranks take the same branch."""
    if not info.enabled:
        return flag
    t = torch.tensor([0.0 if flag else 1.0], device=info.device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.item() == 0.0


def broadcast_object(obj, info: DistInfo, src: int = 0):
    """Rank `src`'s `obj` on every rank (a picklable Python value)."""
    if not info.enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src, device=info.device if info.backend == "nccl" else None)
    return box[0]


def barrier(info: DistInfo) -> None:
    if info.enabled:
        if info.backend == "nccl":
            dist.barrier(device_ids=[info.local_rank])
        else:
            dist.barrier()


def all_gather_object(obj, info: DistInfo) -> list:
    """Every rank's `obj` (a picklable value), in rank order; [obj] in a single process."""
    if not info.enabled:
        return [obj]
    gathered: list = [None] * info.world_size
    dist.all_gather_object(gathered, obj)
    return gathered


def rank_rows(n: int, info: DistInfo) -> slice:
    """The rows of a global batch of `n` rows that this rank takes: a contiguous run, the first
    `n % world_size` ranks one row more, so ranks in order hold the batch in its own order."""
    size, extra = divmod(n, info.world_size)
    start = info.rank * size + min(info.rank, extra)
    return slice(start, start + size + (1 if info.rank < extra else 0))


class _GatherWithGrad(torch.autograd.Function):
    """all_gather along dim 0 (ranks may hold different row counts) that lets gradients through.

    Backward sums the gradient of the gathered tensor over ranks and hands each rank the rows
    it gave, as `torch.distributed.nn.functional.all_gather` does and as sentence-transformers'
    gathered MultipleNegativesRankingLoss and FlagEmbedding's `negatives_cross_device` rely on:
    when every rank computes the same loss over the gathered rows, each rank's share of the
    gradient is then world_size × its own, and DDP's mean over ranks gives the exact gradient.
    """

    @staticmethod
    def forward(ctx, tensor: torch.Tensor, sizes: list[int], rank: int) -> torch.Tensor:
        ctx.sizes, ctx.rank = sizes, rank
        longest = max(sizes)
        if longest == 0:  # nothing on any rank (no hard negatives): nothing to send
            return tensor.new_zeros((0, *tensor.shape[1:]))
        # all_gather needs one shape on every rank: pad to the longest, cut the padding off after.
        padded = tensor.new_zeros((longest, *tensor.shape[1:]))
        padded[:len(tensor)] = tensor
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded.contiguous())
        return torch.cat([part[:size] for part, size in zip(parts, sizes)])  # (sum(sizes), ...)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        if not sum(ctx.sizes):
            return grad, None, None
        grad = grad.clone(memory_format=torch.contiguous_format)  # reduced in place: never autograd's buffer
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        start = sum(ctx.sizes[:ctx.rank])
        return grad[start:start + ctx.sizes[ctx.rank]], None, None


def gather_with_grad(tensor: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """(n_r, ...) on each rank → (Σ n_r, ...) on every rank, rank 0's rows first; gradients flow
    back to each rank's own rows (see `_GatherWithGrad`). The tensor itself in a single process."""
    if not info.enabled:
        return tensor
    count = torch.tensor([len(tensor)], device=tensor.device)
    counts = [torch.zeros_like(count) for _ in range(info.world_size)]
    dist.all_gather(counts, count)
    return _GatherWithGrad.apply(tensor, [int(c) for c in counts], info.rank)
