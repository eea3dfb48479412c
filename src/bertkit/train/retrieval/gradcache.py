"""A large batch's loss at the memory of a small one: GradCache (Gao et al. 2021, "Scaling Deep
Contrastive Learning Batch Size under Memory Limited Setup"), the method of sentence-transformers'
CachedMultipleNegativesRankingLoss.

One step (`cached_loss`):
1. every batch is embedded mini-batch by mini-batch without a graph, each mini-batch's random
   state kept, so that its replay draws again the dropout it drew;
2. the loss is computed from those embeddings; under torchrun the loss function gathers every
   rank's embeddings first (`train.parallel.gather_in_batch`), so it is the global batch's loss;
3. its gradient with respect to this rank's embeddings: the only backward through the loss (the
   gather's backward sums what every rank sends back, as in the uncached loss);
4. each mini-batch is embedded again with a graph and back-propagated with its slice of that
   gradient, so the encoder's activations are held for one mini-batch at a time.

Memory (`bench/cached_loss.py`, docs/benchmarks.md): what a step holds beyond one mini-batch's
activations grows with the batch by its embeddings and their gradients only ((B_i, H) each), and
the loss, whose (B, C) logits `losses.multiple_negatives_ranking_loss` builds a chunk of rows at a
time. Two things made the process grow with the number of mini-batches instead, and are cut here:
- step 1 runs the encoder's training ops (`fused.unfused`), as the replay does: the fused oneDNN
  path of inference kept a cached primitive per token count, one per mini-batch of another length
  (~16 MiB over a 1,024-row batch of MiniLM), and its embeddings now equal the replay's exactly;
- on the CPU, glibc's free pages go back to the kernel before each replay (`malloc_trim`): each
  replay's activations, freed, left holes in the heap that the next replay's, of another token
  count, did not fit, so the resident heap crept by ~2 MiB a mini-batch (+120 MiB from the first
  of 64 replays to the last, while the memory in use stayed flat).

Step 4 runs at once for every mini-batch but the last; the last one's graph joins the returned
loss, so the caller's `loss.backward()` runs it. Under DistributedDataParallel this is GradCache's
own recipe (`no_sync` for every mini-batch but the last, then one all-reduce): the step runs
inside DDP's forward, before DDP arms its gradient hooks for the backward, so the early
mini-batches' gradients add up locally, and the caller's backward, the last mini-batch's, fires
each parameter's hook once and all-reduces the sum once. A replay inside the loss's backward
(this module's earlier design, and sentence-transformers') would fire the armed hooks once per
mini-batch, which DDP refuses.

The parameters' gradients are those of the uncached loss: tests/test_losses.py checks it to 1e-5
in one process, tests/test_finetune_ddp.py two processes against one.

Where we differ from sentence-transformers on purpose: it replays every mini-batch from a hook on
the loss, scaled by the gradient that reaches the loss; here all but the last mini-batch have been
back-propagated with gradient 1 before the caller's backward, so the loss must be back-propagated
as it is (as a training step does; the share and re-scaling of `train.parallel` multiply to 1).
Any other gradient is refused with an error rather than giving wrong gradients.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

import torch

from bertkit.backend.malloc import glibc
from bertkit.encoder import fused

Batch = dict[str, torch.Tensor]


def cached_loss(embed: Callable[[Batch], torch.Tensor], batches: Sequence[Batch],
                loss_of: Callable[..., torch.Tensor], mini_batch_size: int) -> torch.Tensor:
    """`loss_of(embed(batches[0]), embed(batches[1]), ...)`, () float, with each embedding
    (B_i, H) computed `mini_batch_size` rows at a time and the encoder's graph held for one
    mini-batch at a time. With grad enabled, the parameters have received the gradients of every
    mini-batch but the last when this returns; back-propagating the returned loss (gradient 1)
    adds the last one's (see the module docstring).

    batches: padded batches (input_ids, token_type_ids, attention_mask, each (B_i, T_i), padding
    on the right); each mini-batch drops the padding columns none of its rows needs, as
    sentence-transformers does, which changes no embedding.
    """
    if mini_batch_size < 1:
        raise ValueError(f"mini_batch_size must be a positive integer, got {mini_batch_size!r}; pass "
                         "--mini-batch-size 32 (sentence-transformers' default)")
    chunks = [[_rows(batch, start, min(start + mini_batch_size, len(batch["attention_mask"])))
               for start in range(0, len(batch["attention_mask"]), mini_batch_size)] for batch in batches]
    states: list[_RandomState] = []
    embeddings = []
    with torch.no_grad(), fused.unfused():  # step 1, by the replay's ops (module docstring)
        for parts in chunks:
            outputs = []
            for part in parts:
                states.append(_RandomState(part))
                outputs.append(embed(part))  # (b, H)
            embeddings.append(torch.cat(outputs))  # (B_i, H)
    if not torch.is_grad_enabled():  # nothing to back-propagate (an evaluation)
        return loss_of(*embeddings)
    leaves = [e.requires_grad_() for e in embeddings]  # outputs of no_grad: leaves of the loss's graph
    loss = loss_of(*leaves)  # step 2
    # step 3, each (B_i, H); an embedding the loss does not read (no hard negatives) gets zeros
    grads = torch.autograd.grad(loss, leaves, allow_unused=True, materialize_grads=True)
    replays = []
    for parts, grad in zip(chunks, grads):
        start = 0
        for part in parts:
            rows = len(part["attention_mask"])
            replays.append((part, grad[start:start + rows]))  # (b, H)
            start += rows
    release = _release_freed(batches)
    for (part, grad), state in zip(replays[:-1], states[:-1]):  # step 4: all but the last, now
        release()
        out = _replay(embed, part, state)  # (b, H)
        if out.requires_grad:  # a frozen encoder has nothing to replay into
            torch.autograd.backward(out, grad)
    (part, grad), state = replays[-1], states[-1]
    release()
    out = _replay(embed, part, state)  # (b, H), its graph kept for the caller's backward
    if not out.requires_grad:
        return loss.detach()
    surrogate = (out * grad).sum()  # () its gradient w.r.t. the parameters: the last mini-batch's share
    joined = loss.detach() + (surrogate - surrogate.detach())  # the loss's value, the last graph
    joined.register_hook(_as_is)
    return joined


def _as_is(grad: torch.Tensor) -> None:
    """Refuse a backward that scales the loss: the earlier mini-batches were back-propagated with 1."""
    if not bool((grad == 1).all()):
        raise RuntimeError(f"a GradCache loss was back-propagated with gradient {grad.tolist()}, not 1: its "
                           "earlier mini-batches were back-propagated with 1 when it was computed; call "
                           "backward on the loss itself and scale inside the loss function instead")


def _release_freed(batches: Sequence[Batch]) -> Callable[[], None]:
    """What gives the C heap's free pages back to the kernel before a replay: glibc's
    malloc_trim(0) for batches on the CPU (module docstring), nothing on a GPU or another libc."""
    libc = glibc() if all(v.device.type == "cpu" for batch in batches for v in batch.values()) else None
    if libc is None:
        return lambda: None
    return lambda: libc.malloc_trim(0)


def _replay(embed: Callable[[Batch], torch.Tensor], part: Batch, state: _RandomState) -> torch.Tensor:
    """`embed(part)` with its graph, drawing the random numbers its first pass drew."""
    with torch.enable_grad(), state.replay():
        return embed(part)


def _rows(batch: Batch, start: int, end: int) -> Batch:
    """Rows start:end of a padded batch, cut to their own longest sequence: each (b, t ≤ T)."""
    width = int(batch["attention_mask"][start:end].sum(dim=1).max())
    return {k: v[start:end, :width] for k, v in batch.items()}


class _RandomState:
    """The random state a mini-batch's forward drew from (CPU and, for CUDA tensors, CUDA's),
    to draw the same dropout again when it is replayed."""

    def __init__(self, chunk: Batch) -> None:
        self.cpu = torch.get_rng_state()
        self.devices = sorted({v.device.index or 0 for v in chunk.values() if v.device.type == "cuda"})
        self.cuda = [torch.cuda.get_rng_state(d) for d in self.devices]

    @contextmanager
    def replay(self) -> Iterator[None]:
        """Run under this state; the caller's own state is as it was afterwards."""
        with torch.random.fork_rng(devices=self.devices):
            torch.set_rng_state(self.cpu)
            for device, state in zip(self.devices, self.cuda):
                torch.cuda.set_rng_state(state, device)
            yield
