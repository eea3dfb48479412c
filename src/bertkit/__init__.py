"""bertkit: BERT end to end — build, pre-train, fine-tune and use encoder models.

Checkpoints are Hugging Face–format directories (config.json, model.safetensors, vocab.txt /
tokenizer.json), so existing BERT models load here and ours load in other tools.
"""

__version__ = "0.1.0"
