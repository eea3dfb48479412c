"""Process-group set-up for data-parallel training under `torchrun`.

`torchrun --nproc_per_node=N` starts N copies of the same command and tells each its place through
environment variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). With WORLD_SIZE > 1
we join the group (NCCL when the process has a GPU, gloo on CPU); otherwise everything below is a
no-op, so the training loop reads the same in one process and in many.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


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
            dist.init_process_group(backend=backend, init_method="env://",
                                    device_id=dev if use_cuda else None)
    return DistInfo(rank=rank, world_size=world_size, local_rank=local_rank, device=dev,
                    backend=backend)


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
