"""LoRA adapters served side by side over one base encoder (see `host.py`).

    from bertkit.adapters import AdapterHost, load_engine
    engine = load_engine("minilm", "runs/topics-lora")      # one adapter, as `--adapter DIR`

Reading and checking an adapter directory (PEFT's files and bertkit's side file): `files.py`;
the layers whose low-rank terms differ row by row: `routed.py`.
"""

from bertkit.adapters.files import AdapterError, AdapterFiles, fingerprint, read_adapter, write_side_file
from bertkit.adapters.host import Adapter, AdapterHost, load_engine, mixed_embeddings, mixed_logits

__all__ = ["AdapterHost", "Adapter", "AdapterError", "AdapterFiles", "load_engine", "mixed_logits",
           "mixed_embeddings", "read_adapter", "write_side_file", "fingerprint"]
