"""Embeddings of a large batch at the memory of a small one: GradCache (Gao et al. 2021, "Scaling
Deep Contrastive Learning Batch Size under Memory Limited Setup"), the method of
sentence-transformers' CachedMultipleNegativesRankingLoss.

Forward: the batch is embedded mini-batch by mini-batch without a graph (each mini-batch's random
state is kept, so dropout draws again what it drew). The loss is computed on the whole batch's
embeddings as usual; its backward gives the gradient with respect to each embedding. Backward:
each mini-batch is embedded again with a graph and back-propagated with its slice of that
gradient, one at a time, so the encoder's activations are held for one mini-batch only. The
parameters' gradients are those of the uncached loss (tests/test_losses.py checks it to 1e-5).

The embeddings come out of a `torch.autograd.Function`, so whatever sits between them and the
loss (truncation, a gather across ranks) back-propagates into them as into any tensor; the
replay is a backward inside the backward, as PyTorch's reentrant activation checkpointing does.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

import torch

Batch = dict[str, torch.Tensor]


def cached_embeddings(embed: Callable[[Batch], torch.Tensor], batch: Batch, mini_batch_size: int) -> torch.Tensor:
    """`embed(batch)` (B, H) computed `mini_batch_size` rows at a time, its encoder graph rebuilt
    one mini-batch at a time when the result is back-propagated.

    batch: a padded batch (input_ids, token_type_ids, attention_mask, each (B, T), padding on the
    right); each mini-batch drops the padding columns none of its rows needs, as
    sentence-transformers does, which changes no embedding.
    """
    if mini_batch_size < 1:
        raise ValueError(f"mini_batch_size must be a positive integer, got {mini_batch_size!r}; pass "
                         "--mini-batch-size 32 (sentence-transformers' default)")
    size = batch["attention_mask"].shape[0]
    chunks = [_rows(batch, start, min(start + mini_batch_size, size)) for start in range(0, size, mini_batch_size)]
    # A Function's output asks for a gradient only when an input does; the encoder's parameters
    # are not inputs here, so this empty leaf stands for them (as reentrant checkpointing does).
    anchor = torch.empty(0, requires_grad=True)
    return _Replay.apply(embed, chunks, anchor)


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


class _Replay(torch.autograd.Function):
    @staticmethod
    def forward(ctx, embed, chunks, anchor):  # grad mode is off inside a Function's forward
        ctx.embed, ctx.chunks, ctx.states = embed, chunks, []
        outputs = []
        for chunk in chunks:
            ctx.states.append(_RandomState(chunk))
            outputs.append(embed(chunk))  # (b, H)
        return torch.cat(outputs)  # (B, H)

    @staticmethod
    def backward(ctx, grad):  # grad: (B, H), the loss's gradient with respect to each embedding
        start = 0
        for chunk, state in zip(ctx.chunks, ctx.states):
            with torch.enable_grad(), state.replay():
                out = ctx.embed(chunk)  # (b, H), as in the forward, now with its graph
            torch.autograd.backward(out, grad[start:start + len(out)])
            start += len(out)
        return None, None, None
