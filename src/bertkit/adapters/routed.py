"""Linear layers whose low-rank terms differ row by row: many adapters in one batch.

The engine packs a batch's sequences end to end (N token rows); here each sequence may belong
to another adapter. A `RoutedLinear` wraps one base Linear (nn.Linear, or the engine's
Int8Linear) and keeps, per adapter slot, the LoRA terms trained on it:

    y = x Wᵀ + b                                  the base, once over all N rows (fused, int8: as ever)
    y[rows_s] += (x[rows_s] A_sᵀ) B_sᵀ            for each adapter s in the batch, on its rows only

so no adapter ever has a copy of W, and a row's output is what W + B_s A_s (the merged twin)
gives it, up to float summation order. An adapter's terms on one Linear (LoRA on query and
value, which share the fused Q/K/V Linear) are kept as one A_s (R, in) — the terms' A stacked —
and one B_s (out, R) holding each term's B (scale included) in its output rows and zeros
elsewhere: one pair of matrices per slot and layer, however many terms the slot has there.

This is S-LoRA's / Punica's segmented batched LoRA in its plain CPU form. `Routing.route` sorts
the batch's rows by slot once per batch (`Plan`), and every layer then runs, for the K slots
present, the same five calls however large K is:

    xs = x[index]                     the adapters' rows, gathered slot-major into (K, n, in),
                                      each slot padded to the largest slot's n rows
    h = xs @ A_kᵀ, h[pads] = 0        one batched matmul (K, n, R); padding rows zeroed
    y.index_add_(0, index, h @ B_kᵀ)  one batched matmul (K, n, out), scattered back (pads add 0)

A_k, B_k are the slots' stacked terms, padded to the largest rank with zeros (`bank`). Against a
loop of two matmuls per slot, the batched pair makes the calls per layer independent of K; a
scatter into a column slice of y per slot (torch copies the strided slice around `index_add_`)
was the first version's main cost (docs/design.md, serving measurements). A batch of one adapter takes
no gather at all.

A layer sees either all N token rows, or B rows (one per sequence: the pooler, and the last
layer when a [CLS] head reads the first token only, `forward_packed_first`), and `Routing`
keeps a plan for each. Precision: the deltas are kept in the engine's float dtype (fp32 under
fp32 and int8: only the base's Linear is int8; bf16 under bf16).
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import torch
from torch import nn


@dataclass
class Plan:
    """A batch's rows grouped by adapter slot: `perm` (M,) the rows that have a slot, sorted by
    slot (None: every row, in order, all of one slot), and each slot's [start, end) in it."""
    perm: torch.Tensor | None = None
    segments: list[tuple[int, int, int]] = field(default_factory=list)  # (slot, start, end)
    _padded: dict = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, slots: Sequence[int | None], device: torch.device) -> "Plan":
        present = {s for s in slots if s is not None}
        if not present:
            return cls()
        if len(present) == 1 and None not in slots:
            return cls(None, [(present.pop(), 0, len(slots))])
        rows = sorted((row for row, s in enumerate(slots) if s is not None), key=lambda row: slots[row])
        segments: list[tuple[int, int, int]] = []
        for i, row in enumerate(rows):
            if segments and segments[-1][0] == slots[row]:
                segments[-1] = (slots[row], segments[-1][1], i + 1)
            else:
                segments.append((slots[row], i, i + 1))
        return cls(torch.tensor(rows, device=device), segments)

    def padded(self, slots: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """For these slots (of this plan, in its order): the rows to gather, slot-major and each
        slot padded to the longest slot's n rows, (K·n,) long (pads repeat the slot's first row),
        and (K, n, 1) `dtype` 1 for a real row, 0 for a pad. Made once per batch, slot set and dtype."""
        found = self._padded.get((slots, dtype))
        if found is None:
            assert self.perm is not None
            wanted = set(slots)
            spans = [(start, end) for s, start, end in self.segments if s in wanted]
            n = max(end - start for start, end in spans)
            index = torch.cat([torch.cat([self.perm[start:end], self.perm[start].expand(n - (end - start))])
                               for start, end in spans])  # (K·n,)
            sizes = torch.tensor([end - start for start, end in spans], device=self.perm.device)  # (K,)
            mask = (torch.arange(n, device=self.perm.device) < sizes[:, None]).to(dtype)[..., None]  # (K, n, 1)
            found = self._padded[slots, dtype] = (index, mask)
        return found


_NOTHING = Plan()


class Routing:
    """Which adapter slot every row of the batch running now belongs to (None: the base alone)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._tokens = self._sequences = _NOTHING
        self._n = self._b = -1

    @contextlib.contextmanager
    def route(self, lengths: Sequence[int], slots: Sequence[int | None], device: torch.device) -> Iterator[None]:
        """Within the block, layers see sequences of `lengths` (packed order) with these slots."""
        with self.lock:
            self._n, self._b = sum(lengths), len(lengths)
            self._sequences = Plan.of(list(slots), device)
            if self._sequences.perm is None:  # one adapter (or the base) for the whole batch: no index
                self._tokens = Plan(None, [(s, 0, self._n) for s, _, _ in self._sequences.segments])
            else:
                self._tokens = Plan.of([s for s, n in zip(slots, lengths) for _ in range(n)], device)
            try:
                yield
            finally:
                self._tokens, self._sequences, self._n, self._b = _NOTHING, _NOTHING, -1, -1

    def plan(self, rows: int) -> Plan:
        """The plan of a layer input of `rows` rows (N tokens or B sequences)."""
        if rows == self._n:
            return self._tokens
        if rows == self._b:
            return self._sequences
        if self._n < 0:
            return _NOTHING  # outside an engine batch (a direct forward): the base alone
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
        # slot → [(lo, hi, A (r, in), B·scale (hi - lo, r))], as the adapter brought them
        self.terms: dict[int, list[tuple[int, int, torch.Tensor, torch.Tensor]]] = {}
        # every slot's terms stacked (module docstring): A (S, R, in), B (S, out, R), R the largest
        # rank here, and each slot's place in them; plain tensors, not parameters: nothing trains here
        self.bank: tuple[torch.Tensor, torch.Tensor] | None = None
        self.place: dict[int, int] = {}
        # slot → (W (out, in), b (out,)): a layer the adapter brings whole (its own pooler); its rows'
        # outputs are replaced, so only a layer called without a fused residual may have one
        self.dense: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def weight(self) -> torch.Tensor:
        return self.base.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.base.bias

    def active(self, rows: int) -> Plan | None:
        """This batch's plan when any of its slots has terms in this layer, else None."""
        plan = self.routing.plan(rows)
        if any(s in self.place or s in self.dense for s, _, _ in plan.segments):
            return plan
        return None

    def add_rows(self, x: torch.Tensor, y: torch.Tensor, plan: Plan) -> torch.Tensor:
        """y (N, out) the base's output for x (N, in) → each slot's rows as its adapter has them
        (in place): a replaced layer's own output first, then the low-rank terms."""
        for slot, start, end in plan.segments:
            if slot in self.dense:
                w, b = self.dense[slot]
                if plan.perm is None:
                    torch.addmm(b, x, w.T, out=y)
                else:
                    rows = plan.perm[start:end]
                    y.index_copy_(0, rows, torch.addmm(b, x.index_select(0, rows), w.T))  # (n, out)
        slots = tuple(s for s, _, _ in plan.segments if s in self.place)
        if not slots:
            return y
        bank_a, bank_b = self.bank
        if plan.perm is None:  # one slot, every row
            a, b = bank_a[self.place[slots[0]]], bank_b[self.place[slots[0]]]  # (R, in), (out, R)
            return y.add_((x @ a.T) @ b.T)
        index, mask = plan.padded(slots, x.dtype)  # (K·n,), (K, n, 1)
        places = [self.place[s] for s in slots]
        if places != list(range(len(self.place))):
            chosen = torch.tensor(places, device=x.device)
            bank_a, bank_b = bank_a.index_select(0, chosen), bank_b.index_select(0, chosen)
        xs = x.index_select(0, index).view(len(slots), -1, self.in_features)  # (K, n, in)
        h = torch.bmm(xs, bank_a.transpose(1, 2)).mul_(mask)  # (K, n, R), pads 0
        delta = torch.bmm(h, bank_b.transpose(1, 2))  # (K, n, out)
        return y.index_add_(0, index, delta.view(-1, self.out_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        plan = self.active(x.shape[0])
        return self.add_rows(x, y, plan) if plan is not None else y

    def add_slot(self, slot: int, terms: list[tuple[int, int, torch.Tensor, torch.Tensor]] | None = None,
                 dense: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        if terms:
            self.terms[slot] = terms
            self._stack()
        if dense is not None:
            self.dense[slot] = dense

    def drop_slot(self, slot: int) -> None:
        if self.terms.pop(slot, None) is not None:
            self._stack()
        self.dense.pop(slot, None)

    def _stack(self) -> None:
        """The bank again from `terms`: each slot's A (its terms' A stacked, zero rows up to the
        largest rank) and B (each term's B in its output rows and rank columns, zeros elsewhere)."""
        self.place = {slot: i for i, slot in enumerate(sorted(self.terms))}
        if not self.terms:
            self.bank = None
            return
        ranks = {slot: sum(t[2].shape[0] for t in terms) for slot, terms in self.terms.items()}
        some = next(iter(self.terms.values()))[0][2]
        bank_a = some.new_zeros((len(self.place), max(ranks.values()), self.in_features))  # (S, R, in)
        bank_b = some.new_zeros((len(self.place), self.out_features, max(ranks.values())))  # (S, out, R)
        for slot, i in self.place.items():
            column = 0
            for lo, hi, a, b in self.terms[slot]:
                bank_a[i, column:column + a.shape[0]] = a
                bank_b[i, lo:hi, column:column + a.shape[0]] = b
                column += a.shape[0]
        self.bank = (bank_a, bank_b)

    def extra_repr(self) -> str:
        return f"adapters={sorted(set(self.terms) | set(self.dense))}"


__all__ = ["Routing", "RoutedLinear", "Plan"]
