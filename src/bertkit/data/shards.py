"""Prepared pre-training data: `prepare` writes it once, `PretrainingData` / `PretrainingBatches`
read it, memory-mapped, as batches for the trainer.

DATA_DIR layout (all arrays are .npy files, memory-mapped when read):

    meta.json                    written last: a directory without it is not valid data
    tokenizer/                   the tokenizer the ids belong to (vocab.txt, tokenizer.json, ...)
    train/shard-00000/           up to `shard_size` instances per shard
        input_ids.npy            (N,) uint16 when the vocabulary fits, else int32: all tokens
        offsets.npy              (n + 1,) int64: instance i is input_ids[offsets[i]:offsets[i + 1]]
        segment_b.npy            (n,) int32: position of segment B's first token (= length if none)
        nsp_labels.npy           (n,) int8: 0 IsNext, 1 NotNext, -100 without NSP
        word_starts.npy          (N,) bool, whole-word masking with dynamic masks only
        masked_ids.npy           (N,) static masking only: the input the model sees
        mlm_selected.npy         (N,) bool, static masking only: positions to predict
    eval/shard-00000/ ...        held-out documents (same layout), when eval_fraction > 0

Determinism: the same corpus, tokenizer and settings give byte-identical files. Documents are
split into train/eval by a seeded permutation; instance creation uses seeded generators; static
masks and the dynamic mask of instance i at epoch e are functions of (seed, e, i) only
(`bertkit.data.masking`), so a batch is the same whichever worker, rank or run builds it.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from bertkit.constants import IGNORE_INDEX
from bertkit.data.instances import Instance
from bertkit.data.masking import default_max_predictions, mask_keys, mask_tokens
from bertkit.data.tokenizer import BertTokenizer

logger = logging.getLogger(__name__)

FORMAT_NAME = "bertkit-pretraining-data"
FORMAT_VERSION = 1
SPLITS = ("train", "eval")
# Instances per shard: ~30 MB of uint16 tokens at 128 tokens each; bounds memory while writing.
DEFAULT_SHARD_SIZE = 1 << 17
# What the sentence-pair labels are: none (packed sentences), NSP pairs, or SOP pairs.
OBJECTIVES = ("mlm", "mlm+nsp", "mlm+sop")
# Static masks are drawn with this pseudo-epoch, apart from every dynamic epoch (0, 1, 2, ...).
STATIC_EPOCH = -1
# Batches pad to a multiple of 8 tokens: tensor-core friendly, and few distinct shapes to compile.
PAD_MULTIPLE = 8


def special_table(vocab_size: int, special_ids: Iterable[int]) -> np.ndarray:
    """(V,) bool: True for special token ids."""
    table = np.zeros(vocab_size, dtype=bool)
    table[list(special_ids)] = True
    return table

# ---------------------------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------------------------
class PretrainingData:
    """One split of a prepared data directory, memory-mapped.

    Attributes: meta (meta.json), num_instances, nsp, max_seq_len, vocab_size, tokenizer_dir
    (DATA_DIR/tokenizer, to copy into checkpoints), static_masking, whole_word_mask.
    tokenizer: a BertTokenizer or tokenizer directory to check against the data: a different
    fingerprint is a ValueError naming both directories.
    """

    def __init__(self, data_dir: str | os.PathLike, split: str = "train",
                 tokenizer: BertTokenizer | str | os.PathLike | None = None):
        self.data_dir = Path(data_dir)
        meta_path = self.data_dir / "meta.json"
        if not meta_path.exists():
            raise FileNotFoundError(f"{self.data_dir} is not prepared data (no meta.json; an "
                                    "interrupted prepare leaves none); run `bertkit prepare`")
        self.meta: dict[str, Any] = json.loads(meta_path.read_text(encoding="utf-8"))
        if self.meta.get("format") != FORMAT_NAME or self.meta.get("version") != FORMAT_VERSION:
            raise ValueError(f"{meta_path} is not {FORMAT_NAME} version {FORMAT_VERSION}; "
                             "re-run `bertkit prepare`")
        if split not in self.meta["splits"]:
            raise ValueError(f"{self.data_dir} has no split {split!r}; it has "
                             f"{', '.join(self.meta['splits'])}")
        self.split = split
        self.nsp: bool = self.meta["nsp"]
        # Data written before objectives existed had NSP pairs or packed sentences.
        self.objective: str = self.meta.get("objective", "mlm+nsp" if self.nsp else "mlm")
        self.max_seq_len: int = self.meta["max_seq_len"]
        self.vocab_size: int = self.meta["vocab_size"]
        self.static_masking: bool = self.meta["settings"]["static_masking"]
        self.whole_word_mask: bool = self.meta["settings"]["whole_word_mask"]
        self.tokenizer_dir = self.data_dir / "tokenizer"
        self.special_token_ids: dict[str, int] = self.meta["special_token_ids"]
        self.special_table = special_table(self.vocab_size, self.meta["special_ids"])
        split_meta = self.meta["splits"][split]
        self.num_instances: int = split_meta["num_instances"]
        self._shard_meta: list[dict[str, Any]] = split_meta["shards"]
        self._array_names: list[str] = split_meta["arrays"]
        self._starts = np.cumsum([0] + [s["num_instances"] for s in self._shard_meta])
        self._shards: list[dict[str, np.ndarray]] | None = None
        self._open()  # now, so that a damaged directory fails here and not in a worker
        if tokenizer is not None:
            self.check_tokenizer(tokenizer)

    def check_tokenizer(self, tokenizer: BertTokenizer | str | os.PathLike) -> None:
        """ValueError unless `tokenizer` encodes exactly as the one the data was prepared with."""
        if isinstance(tokenizer, BertTokenizer):
            where, given = "the given tokenizer", tokenizer
        else:
            where, given = f"tokenizer {tokenizer}", BertTokenizer.from_pretrained(tokenizer)
        expected = self.meta["tokenizer"]["fingerprint"]
        if given.fingerprint() != expected:
            raise ValueError(f"{where} (fingerprint {given.fingerprint()}) differs from the one "
                             f"{self.data_dir} was prepared with ({self.tokenizer_dir}, "
                             f"fingerprint {expected}); use that tokenizer or re-run prepare")

    def __len__(self) -> int:
        return self.num_instances

    def instance(self, index: int) -> tuple[Instance, tuple[np.ndarray, np.ndarray] | None]:
        """Instance `index` of the split, and its static (masked_ids, mlm_selected) if stored."""
        if not 0 <= index < self.num_instances:
            raise IndexError(f"instance {index} out of range for {self.num_instances} instances")
        shards = self._open()
        s = int(np.searchsorted(self._starts, index, side="right")) - 1
        shard, local = shards[s], index - int(self._starts[s])
        lo, hi = int(shard["offsets"][local]), int(shard["offsets"][local + 1])
        word_starts = shard["word_starts"][lo:hi] if "word_starts" in shard else None
        instance = Instance(input_ids=np.asarray(shard["input_ids"][lo:hi], dtype=np.int64),
                            segment_b_start=int(shard["segment_b"][local]),
                            nsp_label=int(shard["nsp_labels"][local]),
                            word_starts=None if word_starts is None else np.asarray(word_starts))
        static = None
        if "masked_ids" in shard:
            static = (np.asarray(shard["masked_ids"][lo:hi], dtype=np.int64),
                      np.asarray(shard["mlm_selected"][lo:hi]))
        return instance, static

    def _open(self) -> list[dict[str, np.ndarray]]:
        if self._shards is None:
            shards = []
            for shard in self._shard_meta:
                arrays = {}
                for name in self._array_names:
                    path = self.data_dir / shard["dir"] / f"{name}.npy"
                    if not path.exists():
                        raise FileNotFoundError(f"{path} is missing; {self.data_dir} is damaged, "
                                                "re-run `bertkit prepare`")
                    arrays[name] = np.load(path, mmap_mode="r", allow_pickle=False)
                tokens, n = shard["num_tokens"], shard["num_instances"]
                if len(arrays["input_ids"]) != tokens or len(arrays["offsets"]) != n + 1:
                    raise ValueError(f"{self.data_dir / shard['dir']} does not match meta.json "
                                     f"({len(arrays['input_ids'])} tokens, expected {tokens}); the "
                                     "directory is damaged, re-run `bertkit prepare`")
                shards.append(arrays)
            self._shards = shards
        return self._shards

    # Memory maps are reopened, not pickled, when the dataset travels to a DataLoader worker.
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_shards"] = None
        return state


def collate(instances: Sequence[Instance], *, pad_id: int, max_seq_len: int | None = None,
            pad_to_multiple_of: int = PAD_MULTIPLE) -> dict[str, np.ndarray]:
    """Pad instances into numpy arrays: input_ids, token_type_ids, attention_mask (B, T) int64,
    word_starts (B, T) bool (False where unknown), nsp_labels (B,) int64.

    T is the longest instance rounded up to pad_to_multiple_of, but not beyond max_seq_len when the
    longest fits it (the model's position table may end there).
    """
    longest = max(len(inst.input_ids) for inst in instances)
    width = -(-longest // pad_to_multiple_of) * pad_to_multiple_of
    if max_seq_len is not None:
        width = min(width, max(max_seq_len, longest))
    batch = len(instances)
    input_ids = np.full((batch, width), pad_id, dtype=np.int64)  # (B, T)
    token_type_ids = np.zeros((batch, width), dtype=np.int64)  # (B, T)
    attention_mask = np.zeros((batch, width), dtype=np.int64)  # (B, T)
    word_starts = np.zeros((batch, width), dtype=bool)  # (B, T)
    for row, inst in enumerate(instances):
        length = len(inst.input_ids)
        input_ids[row, :length] = inst.input_ids
        attention_mask[row, :length] = 1
        token_type_ids[row, inst.segment_b_start:length] = 1
        if inst.word_starts is not None:
            word_starts[row, :length] = inst.word_starts
    nsp_labels = np.array([inst.nsp_label for inst in instances], dtype=np.int64)  # (B,)
    return {"input_ids": input_ids, "token_type_ids": token_type_ids,
            "attention_mask": attention_mask, "word_starts": word_starts, "nsp_labels": nsp_labels}


class PretrainingBatches(torch.utils.data.Dataset):
    """Map-style dataset of whole batches: item i is batch i of this rank in this epoch.

    The epoch's order is a permutation drawn from (seed, epoch). Global batch g is
    order[g × B × W : (g + 1) × B × W] (B = batch_size, W = world_size) and rank r takes the r-th
    slice of B. With drop_last=False the last global batch is completed with instances from the
    start of the order when W > 1 (every rank needs the same number of equal batches), and is
    simply shorter when W = 1. Dynamic masks depend on (seed, epoch, instance index) only.

    Items: input_ids, token_type_ids, attention_mask, mlm_labels (B, T) long, mlm_labels -100 where
    not predicted; nsp_labels (B,) long, -100 for data prepared without NSP.
    """

    def __init__(self, data: PretrainingData, batch_size: int, *, seed: int, epoch: int,
                 rank: int = 0, world_size: int = 1, mlm_probability: float = 0.15,
                 drop_last: bool = True):
        if batch_size < 1:
            raise ValueError(f"batch_size {batch_size} must be at least 1")
        if epoch < 0:
            raise ValueError(f"epoch {epoch} must be 0 or more")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in 0..{world_size - 1} (world_size {world_size})")
        if not 0.0 < mlm_probability < 1.0:
            raise ValueError(f"mlm_probability {mlm_probability} must be between 0 and 1")
        prepared_p = data.meta["settings"]["mlm_probability"]
        if data.static_masking and mlm_probability != prepared_p:
            raise ValueError(f"{data.data_dir} holds static masks drawn at mlm_probability "
                             f"{prepared_p}, not {mlm_probability}; pass {prepared_p} or prepare "
                             "without --static-masking")
        self.data = data
        self.batch_size = batch_size
        self.seed, self.epoch = seed, epoch
        self.rank, self.world_size = rank, world_size
        self.mlm_probability = mlm_probability
        self.drop_last = drop_last
        self.max_predictions = (data.meta["settings"]["max_predictions_per_seq"]
                                or default_max_predictions(data.max_seq_len, mlm_probability))
        self.replacement_ids = np.flatnonzero(~data.special_table)
        rng = np.random.default_rng([seed & 0xFFFFFFFF, seed >> 32 & 0xFFFFFFFF, epoch])
        self.order = rng.permutation(data.num_instances)  # (N,) the epoch's instance order
        global_batch = batch_size * world_size
        full, rest = divmod(data.num_instances, global_batch)
        self.num_batches = full + (1 if rest and not drop_last else 0)
        if self.num_batches == 0:
            raise ValueError(f"split {data.split!r} of {data.data_dir} has {data.num_instances} "
                             f"instances, fewer than one global batch of {global_batch} (batch "
                             f"size {batch_size} × world size {world_size}); lower --batch-size "
                             "or prepare more data (a larger corpus, or a higher --dupe-factor)")

    def __len__(self) -> int:
        return self.num_batches

    def indices(self, i: int) -> np.ndarray:
        """(b,) instance indices of this rank's batch i."""
        if not 0 <= i < self.num_batches:
            raise IndexError(f"batch {i} out of range for {self.num_batches} batches")
        global_batch = self.batch_size * self.world_size
        lo = i * global_batch
        chunk = self.order[lo:lo + global_batch]
        if len(chunk) < global_batch and self.world_size > 1:
            chunk = np.concatenate([chunk, np.resize(self.order, global_batch - len(chunk))])
        start = self.rank * self.batch_size
        return chunk[start:start + self.batch_size]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        indices = self.indices(i)
        rows = [self.data.instance(int(j)) for j in indices]
        data = self.data
        batch = collate([inst for inst, _ in rows], pad_id=data.special_token_ids["pad"],
                        max_seq_len=data.max_seq_len)
        padding = batch["attention_mask"] == 0  # (B, T)
        if data.static_masking:
            input_ids = batch["input_ids"].copy()
            labels = np.full_like(input_ids, IGNORE_INDEX)
            for row, (inst, (masked, selected)) in enumerate(rows):
                length = len(masked)
                input_ids[row, :length] = masked
                labels[row, :length] = np.where(selected, inst.input_ids, IGNORE_INDEX)
        else:
            special = data.special_table[batch["input_ids"]] | padding  # (B, T)
            masked = mask_tokens(batch["input_ids"], special,
                                 mask_keys(self.seed, self.epoch, indices),
                                 mask_token_id=data.special_token_ids["mask"],
                                 replacement_ids=self.replacement_ids,
                                 mlm_probability=self.mlm_probability,
                                 max_predictions=self.max_predictions,
                                 word_starts=batch["word_starts"] if data.whole_word_mask else None)
            input_ids, labels = masked.input_ids, masked.labels
        return {
            "input_ids": torch.from_numpy(input_ids),  # (B, T)
            "token_type_ids": torch.from_numpy(batch["token_type_ids"]),  # (B, T)
            "attention_mask": torch.from_numpy(batch["attention_mask"]),  # (B, T)
            "mlm_labels": torch.from_numpy(labels),  # (B, T)
            "nsp_labels": torch.from_numpy(batch["nsp_labels"]),  # (B,)
        }
