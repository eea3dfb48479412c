"""BGE-M3's two heads beside its encoder: the files read and written, the layout recognised.

BGE-M3 (Chen et al. 2024, "M3-Embedding", arXiv:2402.03216) is an XLM-RoBERTa encoder whose one
forward pass gives three outputs: a dense vector ([CLS]), lexical weights (one per token) and
multi-vector ColBERT vectors (one per token). The last two come from two small Linear layers that
FlagEmbedding saves beside the Hugging Face checkpoint with `torch.save(state_dict)`:

    colbert_linear.pt   Linear(H -> D), {"weight": (D, H), "bias": (D,)}; D = H in BGE-M3
    sparse_linear.pt    Linear(H -> 1), {"weight": (1, H), "bias": (1,)}

A directory is in the M3 layout when it holds both (as `.pt`, or as `.safetensors` with the same
two keys, which bertkit reads first and writes by default). The `.pt` files are read with
`torch.load(weights_only=True)`: no code from a checkpoint runs. What the heads compute is in
`bertkit.inference.m3`; here are only files and tensors.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from bertkit.util.fileio import atomic_path

# head name -> its file stem; safetensors is read first when both forms are there
HEAD_FILES = {"colbert": "colbert_linear", "sparse": "sparse_linear"}
FORMATS = ("safetensors", "pt")
# The service routes a model in this layout answers beyond embed and tokenize: its lexical
# weights (TEI's /embed_sparse shape) and its ColBERT vectors (/embed_multi).
M3_ROUTES = ("embed_sparse", "embed_multi")


class M3Heads(nn.Module):
    """The two Linear layers of BGE-M3 (FlagEmbedding's attribute names)."""

    def __init__(self, hidden_size: int, colbert_dim: int):
        super().__init__()
        self.colbert_linear = nn.Linear(hidden_size, colbert_dim)  # (N, H) -> (N, D) per token
        self.sparse_linear = nn.Linear(hidden_size, 1)  # (N, H) -> (N, 1) per token

    @property
    def colbert_dim(self) -> int:
        return self.colbert_linear.out_features


def head_file(model_dir: str | os.PathLike, head: str) -> Path | None:
    """The file holding `head` ("colbert" or "sparse") in `model_dir`, safetensors first; None
    when it has neither form."""
    for fmt in FORMATS:
        path = Path(model_dir) / f"{HEAD_FILES[head]}.{fmt}"
        if path.is_file():
            return path
    return None


def has_m3_heads(model_dir: str | os.PathLike) -> bool:
    """Whether `model_dir` is in BGE-M3's layout: both head files beside the encoder."""
    return all(head_file(model_dir, head) is not None for head in HEAD_FILES)


def read_m3_heads(model_dir: str | os.PathLike, hidden_size: int) -> M3Heads | None:
    """The heads of an M3 directory (fp32, CPU), None for a directory with neither file.

    hidden_size: the encoder's H, which both heads must read. Raises ValueError naming the file
    when only one head is there, a file cannot be read, or a tensor has the wrong shape.
    """
    paths = {head: head_file(model_dir, head) for head in HEAD_FILES}
    if not any(paths.values()):
        return None
    missing = [f"{HEAD_FILES[h]}.pt" for h, p in paths.items() if p is None]
    if missing:
        present = next(p for p in paths.values() if p is not None)
        raise ValueError(f"{model_dir} has {present.name} but no {missing[0]}; BGE-M3's layout needs both "
                         "head files (copy the missing one from the model's download)")
    colbert = _read_linear(paths["colbert"], hidden_size, None)
    sparse = _read_linear(paths["sparse"], hidden_size, 1)
    heads = M3Heads(hidden_size, colbert["weight"].shape[0])
    heads.colbert_linear.load_state_dict(colbert)
    heads.sparse_linear.load_state_dict(sparse)
    return heads.eval()


def write_m3_heads(heads: M3Heads, out_dir: str | os.PathLike, fmt: str = "safetensors") -> list[Path]:
    """Write both heads into `out_dir` as `fmt` ("safetensors", or "pt" as FlagEmbedding saves
    them); atomic per file. Returns the paths written."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown head format {fmt!r}; use one of {', '.join(FORMATS)}")
    written = []
    for head, stem in HEAD_FILES.items():
        linear = heads.colbert_linear if head == "colbert" else heads.sparse_linear
        state = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in linear.state_dict().items()}
        path = Path(out_dir) / f"{stem}.{fmt}"
        with atomic_path(path) as tmp:
            if fmt == "pt":
                torch.save(state, tmp)
            else:
                from safetensors.torch import save_file

                save_file(state, str(tmp))
        written.append(path)
    return written


def _read_linear(path: Path, hidden_size: int, out_features: int | None) -> dict[str, torch.Tensor]:
    """{"weight": (D, H), "bias": (D,)} from one head file, checked; ValueError naming the file."""
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path), device="cpu")
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch and safetensors raise several types for a bad file
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ValueError(f"{path} could not be read as a weights-only state dict ({reason}); "
                         "replace it with the file from the model's download") from None
    if not isinstance(state, dict) or set(state) != {"weight", "bias"}:
        found = sorted(state) if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"{path} holds {found}, not a Linear layer's weight and bias; replace it with "
                         "the file from the model's download")
    weight, bias = state["weight"], state["bias"]
    want = out_features if out_features is not None else weight.shape[0]
    if weight.ndim != 2 or tuple(weight.shape) != (want, hidden_size) or tuple(bias.shape) != (want,):
        raise ValueError(f"{path}: weight {tuple(weight.shape)} and bias {tuple(bias.shape)} do not make a "
                         f"Linear from the encoder's hidden size {hidden_size} to {want if out_features else 'D'} "
                         "outputs; the file belongs to another model")
    return {"weight": weight.float(), "bias": bias.float()}
