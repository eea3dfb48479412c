"""The embedding side of an evaluation: an engine, the prompts it is evaluated with, and the one
similarity every score uses. `bertkit eval` and the MTEB encoder (`bertkit.mteb`) both embed here,
so the two give the same vectors and the same figures.

Prompts are chosen as MTEB chooses them for a sentence-transformers model (its
`get_prompt_name`), from a dict whose keys are, first match wins:
`"{task name}-{query|document}"`, `"{task name}"`, `"{task type}-{query|document}"`,
`"{task type}"`, `"query"` / `"document"`. Task types are MTEB's: Retrieval, Reranking, STS,
PairClassification, Classification. The dict is the caller's, else the model's own
(config_sentence_transformers.json's `prompts`); when no key matches, the model's
`default_prompt_name` applies, as sentence-transformers' `encode` does.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

import numpy as np

from bertkit.encoder.sentence_transformers import sentence_transformers_settings
from bertkit.inference import Engine, embed
from bertkit.inference.embed import resolve_prompt

# Which side of an asymmetric task a text is on (MTEB's PromptType values).
PROMPT_TYPES = ("query", "document")
TASK_TYPES = ("Retrieval", "Reranking", "STS", "PairClassification", "Classification")


def prompt_key(prompts: Mapping[str, str], task_name: str | None, task_type: str | None,
               prompt_type: str | None) -> str | None:
    """The key of `prompts` that applies (the order in the module docstring), or None."""
    candidates = []
    for base in (task_name, task_type):
        if base:
            if prompt_type:
                candidates.append(f"{base}-{prompt_type}")
            candidates.append(base)
    if prompt_type:
        candidates.append(prompt_type)
    return next((key for key in candidates if key in prompts), None)


class TextEncoder:
    """Unit-length sentence embeddings of a model for evaluation, with its prompts.

    engine: an embed Engine (any BERT-family encoder; the model's own pooling).
    prompts: key → text (see the module docstring); None: the model's own.
    default_prompt: put before texts that no key matches (the model's default_prompt_name's).
    """

    def __init__(self, engine: Engine, *, prompts: Mapping[str, str] | None = None, default_prompt: str = ""):
        self.engine = engine
        self.prompts = dict(prompts or {})
        self.default_prompt = default_prompt

    @classmethod
    def load(cls, model: str | os.PathLike | Engine, *, prompts: Mapping[str, str] | None = None,
             **engine_options: Any) -> "TextEncoder":
        """An encoder over a model directory (or an Engine), with the directory's prompts unless
        `prompts` replaces them."""
        engine = model if isinstance(model, Engine) else Engine.load(model, use="embed", **engine_options)
        settings = sentence_transformers_settings(engine.model_dir) if engine.model_dir else {}
        if prompts is not None:
            bad = [key for key in prompts if not isinstance(prompts[key], str)]
            if bad:
                raise ValueError(f"prompt {bad[0]!r} is {prompts[bad[0]]!r}; prompts map keys to texts")
        return cls(engine, prompts=settings.get("prompts") if prompts is None else prompts,
                   default_prompt=resolve_prompt(settings))

    def prompt(self, task_name: str | None, task_type: str | None, prompt_type: str | None = None) -> str:
        """The text put before each input of this task and side."""
        key = prompt_key(self.prompts, task_name, task_type, prompt_type)
        return self.prompts[key] if key is not None else self.default_prompt

    def encode(self, texts: Sequence[str], prompt: str = "") -> np.ndarray:
        """(N, H) float32 unit vectors of `texts`, `prompt` put before each, in input order."""
        if not texts:
            return np.zeros((0, self.engine.config.hidden_size), dtype=np.float32)
        return embed(self.engine, list(texts), normalize=True, prompt=prompt).numpy()


def cosine_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(A, B) float32 cosine similarities of unit vectors a (A, H) and b (B, H)."""
    return np.asarray(a, dtype=np.float32) @ np.asarray(b, dtype=np.float32).T


def cosine_pairs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(N,) float32 cosine of each row of a (N, H) with the same row of b, in the arithmetic of
    scikit-learn's `1 - paired_cosine_distances` (MTEB's STS and pair scores): rows normalized
    again (a bf16 or int8 run's vectors are unit only to their precision), then 1 − ‖a − b‖² / 2."""
    a, b = _unit_rows(a), _unit_rows(b)
    diff = a - b  # (N, H)
    return 1 - 0.5 * np.einsum("ij,ij->i", diff, diff)


def _unit_rows(x: np.ndarray) -> np.ndarray:
    x = np.array(x, dtype=np.float32)  # a copy, divided in place below
    norms = np.sqrt(np.einsum("ij,ij->i", x, x))  # (N,)
    norms[norms < 10 * np.finfo(norms.dtype).eps] = 1.0  # a zero row stays zero, as scikit-learn keeps it
    x /= norms[:, None]
    return x
