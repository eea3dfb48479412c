"""The service's JSON answers: Starlette's JSONResponse, encoded by orjson when installed.

Vectors go in as float32 numpy arrays (`array`), not Python lists: orjson writes an array
directly, while `tolist()` makes a Python float per value (an /embed_all answer of 32 texts of
256 tokens is 3 million of them), which is slower and leaves the heap fragmented behind it.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

import numpy as np
import torch
from starlette.responses import JSONResponse as _StarletteJSONResponse

try:
    import orjson
except ImportError:  # the serve extra installs it; without it Python's json writes the answers
    orjson = None


class JSONResponse(_StarletteJSONResponse):
    """orjson encodes an embedding about twenty times faster than Python's json, on the event
    loop every request passes through."""

    def render(self, content: Any) -> bytes:
        if orjson is None:
            return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"),
                              default=lambda o: o.tolist()).encode("utf-8")
        return orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY)


def array(t: torch.Tensor) -> np.ndarray:
    """A CPU float tensor as a C-contiguous float32 array (what orjson writes)."""
    return np.ascontiguousarray(t.detach().float().numpy())


def stacked(rows: Sequence[torch.Tensor]) -> np.ndarray:
    """Per-input vectors of one length as one (N, H) float32 array. float32 rows are viewed and
    stacked by numpy: no torch op, so the event loop keeps the GIL, where each torch call gives
    it up and waits to take it back from the model thread."""
    if all(row.dtype == torch.float32 for row in rows):
        return np.stack([row.numpy() for row in rows])
    return array(torch.stack(list(rows)))


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    """Each row over its length, as F.normalize: x / max(‖x‖, 1e-12)."""
    return vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), np.float32(1e-12))
