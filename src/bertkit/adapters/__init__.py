"""LoRA adapters served side by side over one base encoder (see `host.py`).

    from bertkit.adapters import AdapterHost, load_engine, open_engine
    engine = load_engine("minilm", "runs/topics-lora")      # one adapter, as `--adapter DIR`
    engine = open_engine("runs/topics-lora")                # the same: its base from adapter_config.json

Reading and checking an adapter directory (PEFT's files and bertkit's side file): `files.py`;
the layers whose low-rank terms differ row by row: `routed.py`.
"""

from bertkit.adapters.files import (
    AdapterError,
    AdapterFiles,
    base_of,
    fingerprint,
    is_adapter_dir,
    read_adapter,
    resolve,
    write_side_file,
)
from bertkit.adapters.host import Adapter, AdapterHost, load_engine, mixed_embeddings, mixed_logits, open_engine

__all__ = ["AdapterHost", "Adapter", "AdapterError", "AdapterFiles", "load_engine", "open_engine", "mixed_logits",
           "mixed_embeddings", "read_adapter", "write_side_file", "fingerprint", "is_adapter_dir", "base_of",
           "resolve"]
