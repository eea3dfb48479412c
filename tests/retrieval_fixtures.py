"""Tiny models and corpora for the retrieval tests (random weights: the tests check plumbing,
exactness and file formats, not relevance)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

WORDS = ("the a cat dog sees likes red blue ball car park house runs jumps over under big small "
         "green tree river city news game team wins loses market price rises falls film music").split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]


def tiny_config(**overrides):
    from bertkit.encoder.config import BertConfig

    # hidden 32 in 4 heads, FFN 37, 2 layers, 41 positions: distinct sizes, as the other tests.
    return BertConfig(**{"vocab_size": len(VOCAB), "hidden_size": 32, "num_hidden_layers": 2,
                         "num_attention_heads": 4, "intermediate_size": 37,
                         "max_position_embeddings": 41, "type_vocab_size": 2, **overrides})


def save_tokenizer(directory: Path) -> None:
    from bertkit.data.tokenizer import BertTokenizer

    BertTokenizer.from_vocab({t: i for i, t in enumerate(VOCAB)}).save_pretrained(directory)


def tiny_encoder(directory: Path, seed: int = 0) -> Path:
    """A random BertModel with its tokenizer: a (meaningless) bi-encoder."""
    from bertkit.encoder.model import BertModel

    torch.manual_seed(seed)
    BertModel(tiny_config()).save_pretrained(directory)
    save_tokenizer(directory)
    return directory


def tiny_mlm(directory: Path, seed: int = 0) -> Path:
    """A random BertForMaskedLM with its tokenizer: a (meaningless) SPLADE model."""
    from bertkit.encoder.model import BertForMaskedLM

    torch.manual_seed(seed)
    BertForMaskedLM(tiny_config()).eval().save_pretrained(directory)
    save_tokenizer(directory)
    return directory


def tiny_cross_encoder(directory: Path, seed: int = 1) -> Path:
    from bertkit.encoder.heads import BertForSequenceClassification

    torch.manual_seed(seed)
    BertForSequenceClassification(tiny_config(id2label={0: "LABEL_0"})).save_pretrained(directory)
    save_tokenizer(directory)
    return directory


def sentences(n: int, seed: int = 0) -> list[str]:
    import random

    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) for _ in range(n)]


def write_corpus(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n" for i, t in enumerate(texts)),
                    encoding="utf-8")
    return path
