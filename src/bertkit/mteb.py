"""bertkit models in MTEB: an encoder that `mteb.evaluate` runs (mteb 2.x's `EncoderProtocol`),
and a cross-encoder for its reranking tasks (`CrossEncoderProtocol`).

    import mteb
    from bertkit.mteb import Encoder

    model = Encoder("my-model", prompts={"query": "query: ", "document": "passage: "}, precision="bf16")
    results = mteb.evaluate(model, mteb.get_tasks(tasks=["STSBenchmark"]))

Texts are embedded by `bertkit.evaluation.encoder.TextEncoder`, the embedding path of
`bertkit eval` (the inference engine at any precision, the model's pooling, unit vectors), and
compared by the same cosine, so `bertkit eval` and MTEB give the same figures on the same task
(tested). Prompts per task type follow MTEB's keys (a task's name or type, optionally with
`-query` / `-document`, or `query` / `document`): the `prompts` given, else the model's own
config_sentence_transformers.json prompts, as MTEB's sentence-transformers wrapper picks them.
Batches: MTEB's loader hands over its batches; the engine re-batches them by tokens, so
`encode_kwargs={"batch_size": ...}` changes nothing here.

`CrossEncoder(model_dir)` scores MTEB's (query, document) pairs with a cross-encoder's relevance
logit, at the pair length it was trained at, as `bertkit eval` reranks.

mteb is an optional dependency: `pip install 'bertkit[mteb]'`.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from bertkit.evaluation.encoder import TextEncoder, cosine_matrix, cosine_pairs

MTEB_EXTRA = "pip install 'bertkit[mteb]'"


def need_mteb() -> None:
    """An error naming the extra to install where mteb is absent."""
    if importlib.util.find_spec("mteb") is None:
        raise ValueError(f"bertkit.mteb runs bertkit models in MTEB, which is not installed: {MTEB_EXTRA}")


class Encoder:
    """A bertkit model as MTEB's `EncoderProtocol`: `encode`, `similarity`, `similarity_pairwise`,
    `mteb_model_meta`.

    model_name: a model directory (any BERT-family model bertkit loads). revision: recorded in the
    model's MTEB metadata only. device: the engine's (default cpu). prompts: key → text (the
    module docstring), replacing the model's own. engine_options: `Engine.load`'s (precision,
    max_length, max_batch_tokens, ...).
    """

    def __init__(self, model_name: str | os.PathLike, revision: str | None = None, *, device: str | None = None,
                 prompts: Mapping[str, str] | None = None, **engine_options: Any):
        need_mteb()
        if device is not None:
            engine_options["device"] = device
        self.encoder = TextEncoder.load(model_name, prompts=prompts, **engine_options)
        self.model_name = str(model_name)
        self.revision = revision

    @property
    def mteb_model_meta(self):
        """MTEB's description of the model (its name is bertkit/<directory name>)."""
        engine = self.encoder.engine
        return _meta(self.model_name, self.revision, engine, embed_dim=engine.config.hidden_size,
                     similarity_fn_name="cosine")

    def encode(self, inputs, *, task_metadata, hf_split: str, hf_subset: str, prompt_type=None,
               **kwargs: Any) -> np.ndarray:
        """(N, H) float32 unit vectors of every text of `inputs`' batches, in order, with the
        prompt of the task and side (`prompt_type`: MTEB's query / document, or None)."""
        texts = [text for batch in inputs for text in batch["text"]]
        side = getattr(prompt_type, "value", prompt_type)
        prompt = self.encoder.prompt(task_metadata.name, task_metadata.type, side)
        return self.encoder.encode(texts, prompt)

    def similarity(self, embeddings1, embeddings2):
        """(A, B) cosine of every pair, as a torch tensor (what MTEB's search takes the top k of)."""
        import torch

        return torch.from_numpy(cosine_matrix(_numpy(embeddings1), _numpy(embeddings2)))

    def similarity_pairwise(self, embeddings1, embeddings2):
        """(N,) cosine of each row with the same row of the other."""
        import torch

        return torch.from_numpy(cosine_pairs(_numpy(embeddings1), _numpy(embeddings2)))


class CrossEncoder:
    """A bertkit cross-encoder (a classifier with one relevance output) as MTEB's
    `CrossEncoderProtocol`: `predict` over pairs, `mteb_model_meta`.

    model_name: its directory. revision: recorded in the MTEB metadata only. device: the engine's
    (default cpu). engine_options: `Engine.load`'s (precision, max_length, ...).
    """

    def __init__(self, model_name: str | os.PathLike, revision: str | None = None, *, device: str | None = None,
                 **engine_options: Any):
        need_mteb()
        from bertkit.retrieval.search import load_reranker

        if device is not None:
            engine_options["device"] = device
        self.engine = load_reranker(model_name, **{k: v for k, v in engine_options.items() if v is not None})
        self.model_name = str(model_name)
        self.revision = revision

    @property
    def mteb_model_meta(self):
        return _meta(self.model_name, self.revision, self.engine)

    def predict(self, inputs1, inputs2, *, task_metadata, hf_split: str, hf_subset: str, prompt_type=None,
                **kwargs: Any) -> np.ndarray:
        """(N,) float32 relevance logits of the pairs (i-th text of inputs1, i-th of inputs2)."""
        from bertkit.evaluation.retrieval import pair_relevance

        first = [text for batch in inputs1 for text in batch["text"]]
        second = [text for batch in inputs2 for text in batch["text"]]
        # MTEB hands the pairs over query by query. Scored a query at a time, as `bertkit eval`
        # scores them, the logits are the same to the last bit: what else shares a packed batch
        # moves a logit by ~1e-9, enough to reorder candidates that tie.
        scores, start = [], 0
        for end in range(1, len(first) + 1):
            if end == len(first) or first[end] != first[start]:
                scores.append(pair_relevance(self.engine, first[start:end], second[start:end]))
                start = end
        return np.concatenate(scores) if scores else np.zeros(0, dtype=np.float32)


def _meta(model_name: str, revision: str | None, engine: Any, **fields: Any):
    from mteb.models.model_meta import ModelMeta

    return ModelMeta.create_empty(overwrites={"name": f"bertkit/{Path(model_name).name}", "revision": revision,
                                             "max_tokens": engine.max_length, "framework": ["PyTorch"], **fields})


def _numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().cpu().float().numpy()
    x = np.asarray(x, dtype=np.float32)
    return x[None, :] if x.ndim == 1 else x
