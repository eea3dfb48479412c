"""Linear layers whose low-rank terms differ row by row: many adapters in one batch.

The engine packs a batch's sequences end to end (N token rows); here each sequence may belong
to another adapter. A `RoutedLinear` wraps one base Linear (nn.Linear, or the engine's
Int8Linear) and keeps, per adapter slot, the LoRA terms trained on it:

    y = x Wᵀ + b                            the base, once over all N rows (fused, int8: as ever)
    y[rows_s, lo:hi] += (x[rows_s] A_sᵀ) B_sᵀ   for each adapter s in the batch, on its rows only

so no adapter ever has a copy of W, and a row's output is what W + B_s A_s (the merged twin)
gives it, up to float summation order. This is S-LoRA's / Punica's batched LoRA in its
plainest CPU form: a gather of the adapter's rows (`index_select`), two small matmuls and a
scatter-add (`index_add_`); a batch of one adapter takes no gather at all.

`Routing` says which slot each row has during one engine batch; it is set by the engine
(`Engine.run`, under the routing's lock) and read by every RoutedLinear of the encoder. A layer
sees either all N token rows, or B rows (one per sequence: the pooler, and the last layer when a
[CLS] head reads the first token only, `forward_packed_first`), and picks the grouping by size.

Precision: the deltas are kept in the engine's float dtype (fp32 under fp32 and int8: only the
base's Linear is int8; bf16 under bf16).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator, Sequence

import torch
from torch import nn

Groups = list[tuple[int, torch.Tensor | None]]  # (slot, its rows; None = every row)


class Routing:
    """Which adapter slot every row of the batch running now belongs to (None: the base alone)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._tokens: Groups = []
        self._sequences: Groups = []
        self._n = self._b = -1

    @staticmethod
    def _groups(slots: list[int | None], device: torch.device) -> Groups:
        present = sorted({s for s in slots if s is not None})
        if len(present) == 1 and None not in slots:
            return [(present[0], None)]
        index = torch.tensor([-1 if s is None else s for s in slots], device=device)
        return [(s, (index == s).nonzero().squeeze(1)) for s in present]

    @contextlib.contextmanager
    def route(self, lengths: Sequence[int], slots: Sequence[int | None], device: torch.device) -> Iterator[None]:
        """Within the block, layers see sequences of `lengths` (packed order) with these slots."""
        with self.lock:
            distinct = set(slots)
            if len(distinct) == 1:  # one adapter (or the base) for the whole batch: no index at all
                (only,) = distinct
                self._tokens = self._sequences = [] if only is None else [(only, None)]
            else:
                per_token = [s for s, n in zip(slots, lengths) for _ in range(n)]
                self._tokens = self._groups(per_token, device)
                self._sequences = self._groups(list(slots), device)
            self._n, self._b = sum(lengths), len(lengths)
            try:
                yield
            finally:
                self._tokens, self._sequences, self._n, self._b = [], [], -1, -1

    def groups(self, rows: int) -> Groups:
        """The slots of a layer input of `rows` rows (N tokens or B sequences)."""
        if rows == self._n:
            return self._tokens
        if rows == self._b:
            return self._sequences
        if self._n < 0:
            return []  # outside an engine batch (a direct forward): the base alone
        raise RuntimeError(f"a routed layer got {rows} rows in a batch of {self._b} sequences and "
                           f"{self._n} tokens")


class RoutedLinear(nn.Module):
    """A base Linear plus per-slot low-rank terms (see the module docstring). `weight`, `bias`,
    `in_features` and `out_features` are the base's."""

    def __init__(self, base: nn.Module, routing: Routing):
        super().__init__()
        self.base = base
        self.routing = routing
        self.in_features, self.out_features = base.in_features, base.out_features
        # slot → [(lo, hi, A (r, in), B·scale (hi - lo, r))]; plain tensors, not parameters: nothing trains here
        self.terms: dict[int, list[tuple[int, int, torch.Tensor, torch.Tensor]]] = {}
        # slot → (W (out, in), b (out,)): a layer the adapter brings whole (its own pooler); its rows'
        # outputs are replaced, so only a layer called without a fused residual may have one
        self.dense: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def weight(self) -> torch.Tensor:
        return self.base.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.base.bias

    def active(self, rows: int) -> Groups:
        """This batch's groups of rows that have terms in this layer."""
        return [(s, r) for s, r in self.routing.groups(rows) if s in self.terms or s in self.dense]

    def add_rows(self, x: torch.Tensor, y: torch.Tensor, groups: Groups) -> torch.Tensor:
        """y (N, out) the base's output for x (N, in) → each group's rows as its adapter has them
        (in place): a replaced layer's own output first, then the low-rank terms."""
        for slot, rows in groups:
            xs = x if rows is None else x.index_select(0, rows)  # (n, in)
            if slot in self.dense:
                w, b = self.dense[slot]
                own = torch.addmm(b, xs, w.T)  # (n, out)
                if rows is None:
                    y.copy_(own)
                else:
                    y.index_copy_(0, rows, own)
            for lo, hi, a, b in self.terms.get(slot, ()):
                delta = (xs @ a.T) @ b.T  # (n, r) → (n, hi - lo)
                if rows is None:
                    y[:, lo:hi] += delta
                else:
                    y[:, lo:hi].index_add_(0, rows, delta)
        return y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        groups = self.active(x.shape[0])
        return self.add_rows(x, y, groups) if groups else y

    def add_slot(self, slot: int, terms: list[tuple[int, int, torch.Tensor, torch.Tensor]] | None = None,
                 dense: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        if terms:
            self.terms[slot] = terms
        if dense is not None:
            self.dense[slot] = dense

    def drop_slot(self, slot: int) -> None:
        self.terms.pop(slot, None)
        self.dense.pop(slot, None)

    def extra_repr(self) -> str:
        return f"adapters={sorted(set(self.terms) | set(self.dense))}"


__all__ = ["Routing", "RoutedLinear"]
