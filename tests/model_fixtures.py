"""Small random models saved Hugging Face–format, shared by the inference, serve and explore tests
(a helper module, not collected)."""

from __future__ import annotations

from pathlib import Path

import torch

from bertkit.encoder.config import BertConfig

# Odd, distinct sizes (STYLE.md): a swapped dimension fails loudly. No dropout: outputs are exact.
TINY = dict(hidden_size=36, num_hidden_layers=2, num_attention_heads=4, intermediate_size=53,
            max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def save_tiny(model_class, tokenizer, out: Path, seed: int = 0, **config) -> Path:
    """A small random `model_class` over `tokenizer`'s vocabulary, saved with it in `out`.

    config: BertConfig fields (config.json names) over TINY, `num_labels` and `id2label` included.
    """
    torch.manual_seed(seed)
    settings = {"vocab_size": tokenizer.vocab_size, **TINY, **config}
    model_class(BertConfig.from_dict(settings)).eval().save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def save_tiny_m3(tokenizer, out: Path, seed: int = 0, colbert_dim: int = 29) -> Path:
    """A tiny random encoder in BGE-M3's layout: the bare encoder plus its two head files
    (colbert_linear / sparse_linear, safetensors), ColBERT vectors of an odd size of their own."""
    from bertkit.encoder.m3 import M3Heads, write_m3_heads
    from bertkit.encoder.model import BertModel

    save_tiny(BertModel, tokenizer, out, seed=seed)
    torch.manual_seed(seed + 1)
    heads = M3Heads(TINY["hidden_size"], colbert_dim)
    with torch.no_grad():
        heads.sparse_linear.bias.fill_(0.1)  # most tokens above the ReLU
    write_m3_heads(heads, out)
    return out
