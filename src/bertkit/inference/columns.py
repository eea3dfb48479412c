"""The uses over columnar batches, for engines that hand a function one batch at a time: Ray
Data's `Dataset.map_batches` (a callable class, one instance per actor), Spark's pandas UDFs.

    ds.map_batches(Embedder, fn_constructor_args=(model_dir,), compute=ActorPoolStrategy(size=4),
                   num_cpus=2, batch_format="pyarrow")

A batch is a pyarrow Table, a pandas DataFrame or a dict of NumPy arrays (Ray's "numpy" format)
holding a column of strings (`text`, or the name given); the answer is the same kind of batch
with the use's column added (`embedding`, `labels`, `score`, `sparse`), row i for row i. Each
instance loads its engine on its first batch, not when it is made, so an instance pickles (to an
actor, an executor) without its model, and a process loads the model once however many batches
it is given. Threads: torch's intra-op threads are set to `threads`, else to the CPUs Ray
assigned the actor, else left to torch.

The numbers are those of the single-process path (`embed`, `classify`, `rerank`,
`embed_sparse` on the same engine), since each batch runs through it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from bertkit.inference.classify import classify, rerank
from bertkit.inference.embed import embed
from bertkit.inference.engine import Engine
from bertkit.inference.sparse import embed_sparse


def assigned_cpus() -> int | None:
    """The CPUs Ray gave this actor or task (its `num_cpus`), or None outside Ray."""
    try:
        import ray
    except ImportError:
        return None
    if not ray.is_initialized():
        return None
    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
    return max(1, int(cpus)) if cpus else None


def texts_of(batch: Any, column: str) -> list[str]:
    """The strings of `column` in a pyarrow Table, a pandas DataFrame or a dict of arrays; a
    missing column or a value that is not a string is one error naming it."""
    if hasattr(batch, "column_names"):  # pyarrow.Table
        names, values = batch.column_names, (batch.column(column).to_pylist() if column in batch.column_names
                                             else None)
    elif hasattr(batch, "columns"):  # pandas.DataFrame
        names, values = list(batch.columns), (batch[column].tolist() if column in batch.columns else None)
    else:
        names, values = list(batch), (list(batch[column]) if column in batch else None)
    if values is None:
        raise ValueError(f"the batch has no column {column!r} (columns: {', '.join(map(str, names))}); "
                         "name the text column with text_column=")
    for i, value in enumerate(values):
        if not isinstance(value, str):
            raise ValueError(f"column {column!r} holds {type(value).__name__} values (row {i}: {value!r}), "
                             "not strings; cast it to strings or name another column")
    return values


def with_column(batch: Any, name: str, values: Any) -> Any:
    """`batch` with column `name` = `values` (a (N, D) array, or a list of N Python values)."""
    if hasattr(batch, "column_names"):  # pyarrow.Table
        import pyarrow as pa

        if isinstance(values, np.ndarray) and values.ndim == 2:  # (N, D) → fixed-size lists of D floats
            column = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])
        else:
            column = pa.array(values)
        if name in batch.column_names:
            batch = batch.drop_columns([name])
        return batch.append_column(name, column)
    if hasattr(batch, "columns"):  # pandas.DataFrame
        batch = batch.copy()
        batch[name] = list(values)
        return batch
    out = dict(batch)
    if isinstance(values, np.ndarray):
        out[name] = values
    elif values and isinstance(values[0], (dict, list, str)):  # labels, sparse rows: one object each
        out[name] = np.array(values + [None], dtype=object)[:-1]  # (N,), never split into a 2-D array
    else:
        out[name] = np.asarray(values, dtype=np.float32)  # scores
    return out


class BatchUse:
    """A use of one model over columnar batches (see the module docstring); a subclass says
    which engine use it loads (`USE`), its output column (`COLUMN`) and how it fills it (`compute`)."""

    USE = "embed"
    COLUMN = "embedding"

    def __init__(self, model_dir: str | os.PathLike, *, text_column: str = "text", threads: int | None = None,
                 precision: str | None = None, max_batch_tokens: int | None = None, max_length: int | None = None,
                 truncate: bool | None = None, device: str | None = None, **options: Any):
        """precision, max_batch_tokens, max_length, truncate, device: the engine's (`Engine.load`;
        None: its default). options: the use's own keyword arguments (embed: pooling, normalize,
        prompt, truncate_dim; classify: function; rerank: query; sparse: top_k, prompt)."""
        self.model_dir = str(Path(model_dir))
        self.text_column = text_column
        self.threads = threads
        given = {"precision": precision, "max_batch_tokens": max_batch_tokens, "max_length": max_length,
                 "truncate": truncate, "device": device}
        self.engine_options = {k: v for k, v in given.items() if v is not None}
        self.options = options
        self._engine: Engine | None = None

    @property
    def engine(self) -> Engine:
        """The engine, loaded on first use in this process (threads set first)."""
        if self._engine is None:
            threads = self.threads or assigned_cpus()
            if threads:
                import torch

                torch.set_num_threads(threads)
            self._engine = Engine.load(self.model_dir, use=self.USE, **self.engine_options)
        return self._engine

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_engine": None}  # the model never travels: each process loads its own

    def __call__(self, batch: Any) -> Any:
        texts = texts_of(batch, self.text_column)
        return with_column(batch, self.COLUMN, self.compute(texts) if texts else [])

    def compute(self, texts: list[str]) -> Any:
        raise NotImplementedError


class Embedder(BatchUse):
    """`embedding`: (N, hidden) float32, as `embed` (pooling, normalize, prompt, truncate_dim)."""

    def compute(self, texts: list[str]) -> np.ndarray:
        return embed(self.engine, texts, **self.options).numpy()  # (N, H) float32


class Classifier(BatchUse):
    """`label` and `score`: per text its best label and that label's score, as `classify`."""

    USE = "classify"

    def __call__(self, batch: Any) -> Any:
        results = classify(self.engine, texts_of(batch, self.text_column), **self.options)
        batch = with_column(batch, "label", [r["label"] for r in results])
        return with_column(batch, "score", [float(r["score"]) for r in results])


class Reranker(BatchUse):
    """`score`: each text's relevance to `query` (a cross-encoder), as `rerank`."""

    USE, COLUMN = "rerank", "score"

    def __init__(self, model_dir: str | os.PathLike, *, query: str, **options: Any):
        super().__init__(model_dir, query=query, **options)

    def compute(self, texts: list[str]) -> list[float]:
        scored = rerank(self.engine, self.options["query"], texts,
                        **{k: v for k, v in self.options.items() if k != "query"})
        by_index = {s["index"]: s["score"] for s in scored}
        return [float(by_index[i]) for i in range(len(texts))]


class SparseEmbedder(BatchUse):
    """`sparse`: per text {"indices", "values"}, its SPLADE term weights, as `embed_sparse`."""

    USE, COLUMN = "fill-mask", "sparse"

    def compute(self, texts: list[str]) -> list[dict[str, list]]:
        return [{"indices": ix.tolist(), "values": v.tolist()}
                for ix, v in embed_sparse(self.engine, texts, **self.options)]
