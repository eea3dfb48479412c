"""The processes that share one file under torchrun: rank 0 decides, the others follow.

A file job joins a process group when WORLD_SIZE > 1 (gloo: it needs only barriers and small
messages, whatever device the model runs on) and stays in it for the process's lifetime; a
single process gets a `Group` whose barrier and broadcast do nothing.
"""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class Group:
    """This process's place among the ranks sharing one file; a no-op for a single process."""

    rank: int = 0
    world_size: int = 1
    backend: str | None = None

    def _device(self):
        import torch

        return torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else None

    def barrier(self) -> None:
        if self.world_size > 1:
            import torch.distributed as dist

            if self.backend == "nccl":
                dist.barrier(device_ids=[self._device().index])
            else:
                dist.barrier()

    def broadcast(self, value: Any) -> Any:
        """Rank 0's `value` (picklable) on every rank."""
        if self.world_size == 1:
            return value
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=0, device=self._device())
        return box[0]


def join_group(distributed: Any) -> Group:
    """distributed: "auto" (join when WORLD_SIZE > 1), False (one process whatever the environment),
    True (require WORLD_SIZE > 1) or a `bertkit.util.distributed.DistInfo` already set up."""
    if distributed is False:
        return Group()
    if hasattr(distributed, "world_size") and hasattr(distributed, "rank"):
        return Group(distributed.rank, distributed.world_size, getattr(distributed, "backend", None))
    if distributed not in ("auto", True):
        raise ValueError(f"distributed must be 'auto', True, False or a DistInfo, got {distributed!r}")
    raw = os.environ.get("WORLD_SIZE", "") or "1"
    try:
        world_size = int(raw)
    except ValueError:
        raise ValueError(f"environment variable WORLD_SIZE={raw!r} is not an integer; start "
                         "several processes with torchrun") from None
    if world_size <= 1:
        if distributed is True:
            raise ValueError(f"distributed=True but WORLD_SIZE is {raw}; start the command with "
                             "torchrun --nproc_per_node N")
        return Group()
    import torch.distributed as dist

    if dist.is_initialized():  # the caller (e.g. for a model on GPUs) already joined
        return Group(dist.get_rank(), dist.get_world_size(), dist.get_backend())
    from bertkit.util.distributed import init_distributed

    # Sharing out a file needs only barriers and small messages: gloo on CPU is enough, whatever
    # device the caller's model runs on.
    info = init_distributed("cpu")
    # The group stays for the process's lifetime: a second file in the same process reuses it
    # (leaving and joining again races with ranks still leaving), and it is left at exit.
    atexit.register(_leave_group)
    return Group(info.rank, info.world_size, info.backend)


def _leave_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def on_rank0(group: Group, fn: Callable[[], Any]) -> Any:
    """Run `fn` on rank 0 and hand its value to every rank; an error there is raised on every rank
    (the others would otherwise wait for rank 0 until a timeout)."""
    outcome: tuple = ("ok", None)
    error: BaseException | None = None
    if group.rank == 0:
        try:
            outcome = ("ok", fn())
        except Exception as err:  # noqa: BLE001 - re-raised below, on every rank
            error = err
            outcome = ("error", type(err).__name__, str(err))
    outcome = group.broadcast(outcome)
    if error is not None:
        raise error
    if outcome[0] == "error":
        kinds = {"FileExistsError": FileExistsError, "FileNotFoundError": FileNotFoundError,
                 "IsADirectoryError": IsADirectoryError, "NotADirectoryError": NotADirectoryError}
        raise kinds.get(outcome[1], ValueError)(f"(rank 0) {outcome[2]}")
    return outcome[1]
