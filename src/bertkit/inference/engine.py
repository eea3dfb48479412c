"""The inference engine: one batched, padding-free forward under every use of a model.

Every use (`embed`, `fill_mask`, `classify`, `ner`, `qa`, `rerank`; through them `bertkit predict`,
fine-tuning's evaluation, the HTTP service and the explorer) hands the engine token sequences and a
small `head` function, and the engine does the rest the same way:

- tokenization once per text, batched in Rust (`tokenizers`), texts over the model's limit
  truncated with a warning that counts them, or refused (`truncate=False`);
- token-budget batches: sequences sorted by length (longest first) fill each batch up to
  `max_batch_tokens` real tokens; results come back in input order;
- no compute on padding anywhere: sequences are packed end to end (`packing.Packed`), every dense
  layer sees only real tokens and attention runs per run of equal-length neighbours (CPU) or as
  one variable-length flash call (CUDA, 16-bit);
- `torch.inference_mode`, a precision (fp32, bf16, dynamic int8, static int8 calibrated on
  text, or `auto`, decided by measuring) and a thread count.

A sequence's result does not depend on its neighbours: one text alone gives the same numbers as
in any batch, in any order (fp32: within 1e-5, the float summation order of the matmuls).
"""

from __future__ import annotations

import copy
import functools
import itertools
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn

from bertkit.backend.malloc import bound_op_caches, keep_freed_memory
from bertkit.constants import ENGINE_PRECISIONS
from bertkit.data.formats.common import WordPieces
from bertkit.data.tokenizer import BertTokenizer
from bertkit.encoder import tasks
from bertkit.encoder.checkpoint import missing_from
from bertkit.encoder.heads import use_class
from bertkit.encoder.m3 import M3Heads, read_m3_heads
from bertkit.encoder.model import encoder_of
from bertkit.encoder.packing import Packed
from bertkit.encoder.sentence_transformers import Pooling, sparse_encoder_length
from bertkit.util.fileio import model_directory

log = logging.getLogger(__name__)

DEFAULT_MAX_BATCH_TOKENS = 8192  # large enough to keep 2 cores' GEMMs efficient, small for memory

# ---------------------------------------------------------------------------------------------
# batching
# ---------------------------------------------------------------------------------------------
def token_budget_batches(lengths: Sequence[int], max_batch_tokens: int) -> Iterator[list[int]]:
    """Indices of sequences grouped into batches of at most `max_batch_tokens` real tokens.

    Sorted longest first (ties in input order), so equal lengths sit together and attend as one
    call; a sequence longer than the budget gets a batch of its own.
    """
    if max_batch_tokens < 1:
        raise ValueError(f"max_batch_tokens must be positive, got {max_batch_tokens}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batch: list[int] = []
    tokens = 0
    for i in order:
        if batch and tokens + lengths[i] > max_batch_tokens:
            yield batch
            batch, tokens = [], 0
        batch.append(i)
        tokens += lengths[i]
    if batch:
        yield batch


@dataclass
class Batch:
    """One forward's worth of packed sequences, as a `head` function receives it."""
    index: list[int]  # (B,) positions of the sequences in the caller's list, in packed order
    input_ids: torch.Tensor  # (N,) long, all sequences end to end
    token_type_ids: torch.Tensor  # (N,) long
    packed: Packed
    # (B,) the adapter slot of each sequence (None: the base alone), when the engine has adapters
    adapters: list[int | None] | None = None

    def split(self, rows: torch.Tensor) -> list[torch.Tensor]:
        """A per-token output (N, ...) cut into one (T_i, ...) tensor per sequence."""
        return list(rows.split(self.packed.lengths))


@dataclass
class Stats:
    """What the engine has done since it was made (read by the CLI summaries and `/metrics`).
    Counted through `add`, so runs on several threads at once (a server's model threads) lose
    no count."""
    sequences: int = 0
    tokens: int = 0
    batches: int = 0
    truncated: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)


# ---------------------------------------------------------------------------------------------
# precision
# ---------------------------------------------------------------------------------------------
def resolve_precision(precision: str, device: torch.device) -> str:
    """'auto' → the faster of fp32 and bf16 on this machine, measured (`bertkit.backend.precision`).

    int8 is never chosen by 'auto': it changes results (cosine ≈ 0.99 against fp32), so it has
    to be asked for.
    """
    if precision not in ENGINE_PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(ENGINE_PRECISIONS)}")
    if precision in ("int8", "int8-static") and device.type != "cpu":
        raise ValueError(f"precision {precision} runs on the CPU only; use bf16 on {device.type}")
    if precision != "auto":
        return precision
    from bertkit.backend.precision import resolve_precision as measured

    return measured("auto", device)


def prepare_model(model: nn.Module, precision: str, device: torch.device, scales: Any = None) -> nn.Module:
    """The model in eval mode on `device`, in the precision's form.

    bf16: weights cast to bfloat16 (no per-call casts, unlike autocast); LayerNorm and softmax
    accumulate in fp32 inside their kernels. int8: a copy with every nn.Linear replaced by an
    `int8.Int8Linear` (weights per output channel, activations per token; see `int8.py` for why
    not torch's quantize_dynamic); the caller's model is left as it was. int8-static: a copy with
    the encoder's Linears at the calibrated input ranges `scales` (`int8_static.StaticScales`).
    """
    model = model.eval().to(device)
    if precision == "bf16":
        return model.to(torch.bfloat16)
    if precision == "int8":
        from bertkit.backend.int8 import quantize_linears

        return quantize_linears(copy.deepcopy(model))
    if precision == "int8-static":
        from bertkit.backend.int8_static import quantize_static

        return quantize_static(copy.deepcopy(model), scales)
    return model


def input_length(config, tokenizer: BertTokenizer, pooling: "Pooling | None",
                 model_dir: str | os.PathLike | None = None) -> int:
    """The pieces per input a model directory is read at, whatever the use, the command or the
    route (the CLI, `bertkit.load`, the service and retrieval all load through `Engine.load`):

    - a sentence-transformers model: its `max_seq_length`, as it was trained (capped at the model's);
      a SparseEncoder (modules.json with SpladePooling, `model_dir` given) too;
    - a cross-encoder (a sequence classifier with one relevance logit): its tokenizer's
      `model_max_length` when below the model's limit, as sentence-transformers' CrossEncoder
      reads pairs; `finetune --task rerank` writes its trained pair length there. Its predict,
      classify and embed answers use the same length as its rerank, so every door agrees;
    - otherwise the model's limit (RoBERTa: 512 of its 514 positions).
    """
    limit = config.max_sequence_length
    if pooling is not None and pooling.max_seq_length:
        return min(pooling.max_seq_length, limit)
    sparse_length = sparse_encoder_length(model_dir) if model_dir is not None else None
    if sparse_length:
        return min(sparse_length, limit)
    cross_encoder = "ForSequenceClassification" in tasks.architecture_kinds(config) and tasks.is_cross_encoder(config)
    if cross_encoder and 2 < tokenizer.model_max_length < limit:
        return tokenizer.model_max_length
    return limit


# ---------------------------------------------------------------------------------------------
# the engine
# ---------------------------------------------------------------------------------------------
@dataclass
class Engine:
    """A model, its tokenizer and how to run them: the one object every use takes.

    Build with `Engine.load(model_dir, use=...)`, or `Engine(model, tokenizer, ...)` from objects
    in memory. `max_length` defaults to the model's limit (for sentence-transformers models, their
    `max_seq_length`, as they were trained); `truncate=False` makes longer texts an error.
    """

    model: nn.Module
    tokenizer: BertTokenizer
    precision: str = "fp32"
    threads: int | None = None
    max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS
    device: str | torch.device = "cpu"
    max_length: int | None = None
    truncate: bool = True
    model_dir: Path | None = None
    use: str | None = None  # the use it was loaded for (`tasks.USES`)
    pooling: "Pooling | None" = None
    stats: Stats = field(default_factory=Stats)
    # Adapters over this engine's encoder (`bertkit.adapters`): the routing its layers read, and
    # the slot this engine's sequences take unless `run` is given one per sequence (None: the base).
    routing: Any = None
    adapter_slot: int | None = None
    # BGE-M3's lexical and multi-vector heads (`encoder.m3`), when the directory has them; they run
    # on the encoder's last states (`inference.m3`).
    m3: M3Heads | None = None
    # int8-static: text to calibrate on (a file, or texts), or the ranges already measured
    # (`int8_static.StaticScales`); neither → the scales saved in model_dir by `bertkit calibrate`.
    calibration: str | os.PathLike | Sequence[str] | None = None
    int8_scales: Any = None

    def __post_init__(self) -> None:
        if self.threads is not None:
            if self.threads < 1:
                raise ValueError(f"threads must be at least 1, got {self.threads}")
            torch.set_num_threads(self.threads)
        if self.max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be positive, got {self.max_batch_tokens}")
        self.device = _device(self.device)
        if self.device.type == "cpu":
            keep_freed_memory()  # batch buffers reused, not page-faulted in anew each layer (bertkit.backend.malloc)
            bound_op_caches()  # shape-keyed oneDNN caches capped: memory stays flat across batch shapes
        self.config = self.model.config
        limit = self.config.max_position_embeddings
        if self.max_length is None:
            self.max_length = limit
        elif not 2 < self.max_length <= limit:
            raise ValueError(f"max_length {self.max_length} must be in 3..{limit} "
                             f"(the model's max_position_embeddings)")
        self.precision = resolve_precision(self.precision, self.device)
        if self.precision == "int8-static" and self.int8_scales is None:
            self.int8_scales = self._static_scales()
        self.model = prepare_model(self.model, self.precision, self.device, self.int8_scales)
        self.float_dtype = torch.bfloat16 if self.precision == "bf16" else torch.float32
        if self.m3 is not None:
            # Two Linear layers over the last states, beside a dozen layers: int8 would save nothing
            # measurable there, so they stay in fp32 unless the whole model runs in bf16.
            self.m3 = self.m3.eval().to(self.device, self.float_dtype)

    @classmethod
    def load(cls, model_dir: str | os.PathLike, use: str = "embed", **options: Any) -> "Engine":
        """An engine for `use` (embed, fill-mask, classify, rerank, ner, qa: `tasks.USES`) over a model dir."""
        if use not in tasks.USES:
            raise ValueError(f"unknown use {use!r}; choose one of {', '.join(tasks.USES)}")
        model_class, head, needs = use_class(use), tasks.HEADS[tasks.USES[use].kind].weights, tasks.USES[use].needs
        model_dir = model_directory(model_dir)
        tokenizer = BertTokenizer.from_pretrained(model_dir)
        model = model_class.from_pretrained(model_dir)
        missing = missing_from(model, model.load_report, head) if head else []
        if missing:
            kind = ", ".join(model.config.extra.get("architectures") or ["of unknown kind"])
            raise ValueError(f"{model_dir} has no weights for {use} ({missing[0]} missing; the "
                             f"checkpoint is {kind}); {use} needs {needs}")
        pooling = Pooling.read(model_dir)
        if options.get("max_length") is None:
            options["max_length"] = input_length(model.config, tokenizer, pooling, model_dir)
        m3 = read_m3_heads(model_dir, model.config.hidden_size)
        return cls(model, tokenizer, model_dir=Path(model_dir), use=use, pooling=pooling, m3=m3, **options)

    def _static_scales(self) -> Any:
        """int8-static's input ranges: measured now on `calibration` with the fp32 model, or read
        from the model directory."""
        from bertkit.backend.int8_static import NEEDS_CALIBRATION, StaticScales, calibration_texts, observing

        if self.calibration is None:
            saved = StaticScales.read(self.model_dir) if self.model_dir is not None else None
            if saved is None:
                raise ValueError(NEEDS_CALIBRATION)
            return saved
        texts, _ = calibration_texts(self.calibration)
        self.model = self.model.eval().to(self.device)
        encoder = encoder_of(self.model)
        scales = StaticScales()
        with observing(self.model, scales):
            for _ in self.run_encodings(self.encode(texts), lambda _model, batch: encoder.forward_packed(
                    batch.input_ids, batch.token_type_ids, batch.packed)):
                pass
        scales.tokens = self.stats.tokens
        self.stats = Stats()  # the counts are the uses', not calibration's
        return scales

    # -- tokenization --------------------------------------------------------------------------
    def encode(self, texts: Sequence[str], pairs: Sequence[str] | None = None) -> list[Any]:
        """`tokenizers` encodings (ids, type_ids, offsets, word_ids) of texts or pairs, with
        [CLS]/[SEP], cut to `max_length` (pairs longest side first)."""
        encodings = self.tokenizer.encode_raw(texts, pairs, max_length=self.max_length)
        long = [i for i, e in enumerate(encodings) if e.overflowing]
        if long and not self.truncate:
            i = long[0]
            raise ValueError(f"{len(long)} of {len(encodings)} inputs exceed the model's limit of "
                             f"{self.max_length} tokens (input {i} is one); shorten them or allow "
                             "truncation (--truncate)")
        if long:
            # Said once per engine: a reranker or a server truncates on every call, and a warning
            # per call buries the rest of the log. The count goes on in stats.truncated.
            first = self.stats.truncated == 0
            self.stats.add(truncated=len(long))
            log.log(logging.WARNING if first else logging.DEBUG,
                    "%d of %d inputs were longer than %d tokens and were truncated%s", len(long),
                    len(encodings), self.max_length,
                    " (later truncations by this engine are counted in its stats, not logged)" if first else "")
        return encodings

    # -- the forward ---------------------------------------------------------------------------
    def run(self, ids: Sequence[Sequence[int]], type_ids: Sequence[Sequence[int]] | None,
            head: Callable[[nn.Module, Batch], Any], adapters: Sequence[int | None] | None = None
            ) -> Iterator[tuple[list[int], Any]]:
        """Run `head(model, batch)` over token-budget batches of the sequences `ids`.

        ids / type_ids: one list of token ids (and segment ids; None = all 0) per sequence,
        special tokens included. Yields (batch.index, whatever `head` returned) per batch, in
        batch order; `index` maps the batch's sequences back to positions in `ids`.
        adapters: with adapters loaded (`bertkit.adapters`), each sequence's adapter slot (None:
        the base alone); one batch may mix them. Default: this engine's `adapter_slot` for all.
        """
        lengths = [len(seq) for seq in ids]
        if not lengths:
            return
        if min(lengths) < 1:
            raise ValueError("an input has no tokens; every sequence needs at least [CLS]")
        for index in token_budget_batches(lengths, self.max_batch_tokens):
            flat_ids = torch.tensor(list(itertools.chain.from_iterable(ids[i] for i in index)),
                                    dtype=torch.long)  # (N,)
            if type_ids is None:
                flat_types = torch.zeros_like(flat_ids)  # (N,)
            else:
                flat_types = torch.tensor(list(itertools.chain.from_iterable(type_ids[i] for i in index)),
                                          dtype=torch.long)  # (N,)
            packed = Packed.from_lengths([lengths[i] for i in index], self.device)
            batch = Batch(index, flat_ids.to(self.device), flat_types.to(self.device), packed)
            if self.routing is None:
                with torch.inference_mode():
                    result = head(self.model, batch)
            else:
                batch.adapters = ([self.adapter_slot] * len(index) if adapters is None
                                  else [adapters[i] for i in index])
                with torch.inference_mode(), self.routing.route(packed.lengths, batch.adapters, self.device):
                    result = head(self.model, batch)
            self.stats.add(batches=1, sequences=len(index), tokens=int(flat_ids.numel()))
            yield index, result

    def run_encodings(self, encodings: Sequence[Any], head: Callable[[nn.Module, Batch], Any]
                      ) -> Iterator[tuple[list[int], Any]]:
        """`run` over tokenizer encodings."""
        return self.run([e.ids for e in encodings], [e.type_ids for e in encodings], head)

    def run_ordered(self, ids: Sequence[Sequence[int]], type_ids: Sequence[Sequence[int]] | None,
                    head: Callable[[nn.Module, Batch], Any], adapters: Sequence[int | None] | None = None
                    ) -> list[Any]:
        """`run`, one result per sequence in the order of `ids`: `head` returns the batch's B
        results in batch order (a list, or a tensor of B rows)."""
        out: list[Any] = [None] * len(ids)
        for index, rows in self.run(ids, type_ids, head, adapters=adapters):
            for i, row in zip(index, rows):
                out[i] = row
        return out

    @functools.cached_property
    def word_pieces(self) -> WordPieces:
        """The tokenizer as plain word pieces (no special tokens, no truncation), for the uses
        that build their own windows (ner, qa, classify over windows); made once per engine."""
        return WordPieces.of(self.tokenizer)

    def view(self, model: nn.Module, use: str, *, adapter_slot: int | None, max_length: int | None = None,
             pooling: "Pooling | None" = None) -> "Engine":
        """This engine (its tokenizer, precision, device, routing, word pieces) over another
        model that shares its encoder, prepared already: an adapter's task model
        (`bertkit.adapters`). Nothing is copied or prepared again."""
        other = copy.copy(self)
        other.model, other.config, other.use, other.adapter_slot = model, model.config, use, adapter_slot
        other.max_length = min(max_length or self.config.max_sequence_length, self.config.max_sequence_length)
        other.pooling = pooling if pooling is not None else self.pooling
        other.stats = Stats()
        return other

    def describe(self) -> dict[str, Any]:
        """What a caller (CLI summary, `/info`) reports about this engine."""
        return {"model": str(self.model_dir) if self.model_dir else None, "task": self.use,
                "precision": self.precision, "device": str(self.device),
                "max_length": self.max_length, "max_batch_tokens": self.max_batch_tokens,
                "threads": torch.get_num_threads()}


def _device(name: str | torch.device) -> torch.device:
    if isinstance(name, torch.device):
        return name
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda was asked for but no CUDA GPU is available; use --device cpu")
    if name not in ("cpu", "cuda") and not name.startswith("cuda:"):
        raise ValueError(f"unknown device {name!r}; use auto, cpu or cuda")
    return torch.device(name)
