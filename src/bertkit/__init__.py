"""bertkit: BERT end to end — build, pre-train, fine-tune and use encoder models.

    import bertkit
    model = bertkit.load("path/to/model")     # any BERT-family Hugging Face directory
    model.encode(["a text"])                  # np.ndarray (1, H), as sentence-transformers
    model.fill_mask("Paris is the [MASK] of France.")

Checkpoints are Hugging Face–format directories (config.json, model.safetensors, vocab.txt /
tokenizer.json), so existing BERT models load here and ours load in other tools.

The names below load on first use (PEP 562), so `import bertkit` and the command line start
without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# name → the module that defines it
_EXPORTS = {
    "load": "bertkit.api",
    "load_adapters": "bertkit.api",
    "Model": "bertkit.api",
    "Engine": "bertkit.inference",
    "evaluate": "bertkit.evaluation",
    "BertConfig": "bertkit.encoder.config",
    "BertTokenizer": "bertkit.data.tokenizer",
    "BertModel": "bertkit.encoder.model",
    "BertForMaskedLM": "bertkit.encoder.model",
    "BertForPreTraining": "bertkit.encoder.model",
    "BertForSequenceClassification": "bertkit.encoder.heads",
    "BertForTokenClassification": "bertkit.encoder.heads",
    "BertForQuestionAnswering": "bertkit.encoder.heads",
}

__all__ = ["__version__", "load", "load_adapters", "Model", "Engine", "evaluate", "BertConfig", "BertTokenizer",
           "BertModel",
           "BertForMaskedLM", "BertForPreTraining", "BertForSequenceClassification", "BertForTokenClassification",
           "BertForQuestionAnswering"]

if TYPE_CHECKING:
    from bertkit.api import Model, load, load_adapters
    from bertkit.data.tokenizer import BertTokenizer
    from bertkit.encoder.config import BertConfig
    from bertkit.encoder.heads import (
        BertForQuestionAnswering,
        BertForSequenceClassification,
        BertForTokenClassification,
    )
    from bertkit.encoder.model import BertForMaskedLM, BertForPreTraining, BertModel
    from bertkit.evaluation import evaluate
    from bertkit.inference import Engine


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value  # once: later look-ups skip this function
        return value
    raise AttributeError(f"module 'bertkit' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
