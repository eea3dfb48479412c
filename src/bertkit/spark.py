"""bertkit on Spark: sentence embeddings as an iterator pandas UDF, the model loaded once per
executor process.

    from bertkit.spark import embed_column
    df = embed_column(df, "path/to/model", column="text")  # + `embedding`: array<float>

    from bertkit.spark import embed_udf  # the UDF itself, for select / withColumn
    embed = embed_udf("path/to/model", threads=2)
    df = df.withColumn("embedding", embed("text"))

Spark hands an iterator pandas UDF every Arrow batch of a partition in one call, and a Python
worker process (reused across tasks, Spark's default) runs many partitions. The UDF's closure is
unpickled per task, so the engine is not kept on it: each process keeps its engines in
`_SHARED`, keyed by the model and its settings, and loads each once. The vectors are `embed`'s on
the same engine settings (`bertkit.inference.columns.Embedder`). Needs pyspark (`pip install
'bertkit[spark]'`) and Java 17 where the job runs.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterator

from bertkit.inference.columns import Embedder, texts_of

# {settings: Embedder} of this process: what makes the model load once per executor process
_SHARED: dict[str, Embedder] = {}


def shared(embedder: Embedder) -> Embedder:
    """The process's Embedder with `embedder`'s settings (it, the first time they are seen)."""
    key = json.dumps([embedder.model_dir, embedder.threads, embedder.engine_options, embedder.options],
                     sort_keys=True, default=str)
    return _SHARED.setdefault(key, embedder)


def embed_udf(model_dir: str | os.PathLike, *, threads: int | None = None, precision: str | None = None,
              max_batch_tokens: int | None = None, max_length: int | None = None, truncate: bool | None = None,
              device: str | None = None, **options: Any):
    """A pandas UDF (iterator of Series → iterator of Series) from a string column to its
    embeddings, array<float> of the model's hidden size (or truncate_dim).

    threads: torch's threads in each executor process (None: torch's choice; give the cores
    per task, `spark.task.cpus`); precision, max_batch_tokens, max_length, truncate, device: the
    engine's; options: embed's (pooling, normalize, prompt, truncate_dim).
    """
    import pandas as pd
    from pyspark.sql.functions import pandas_udf
    from pyspark.sql.types import ArrayType, FloatType

    embedder = Embedder(model_dir, threads=threads, precision=precision, max_batch_tokens=max_batch_tokens,
                        max_length=max_length, truncate=truncate, device=device, **options)

    def embed(batches):
        process = shared(embedder)
        for texts in batches:
            vectors = process.compute(texts_of({"text": texts.tolist()}, "text"))  # (n, H) float32
            yield pd.Series(list(vectors))

    # Spark reads the kind of pandas UDF from the type hints, as objects: this module's hints are
    # strings (postponed evaluation), so they are given here.
    embed.__annotations__ = {"batches": Iterator[pd.Series], "return": Iterator[pd.Series]}
    return pandas_udf(ArrayType(FloatType()))(embed)


def embed_column(df: Any, model_dir: str | os.PathLike, *, column: str = "text", out: str = "embedding",
                 **settings: Any) -> Any:
    """`df` with `out` = the embeddings of its string column `column` (embed_udf's settings).

    A missing column, or one that is not of strings, is one error naming it, before any task runs.
    """
    from pyspark.sql.types import StringType

    fields = {f.name: f.dataType for f in df.schema.fields}
    if column not in fields:
        raise ValueError(f"the DataFrame has no column {column!r} (columns: {', '.join(fields)}); name the "
                         "text column with column=")
    if not isinstance(fields[column], StringType):
        raise ValueError(f"column {column!r} is {fields[column].simpleString()}, not strings; cast it "
                         f"(df.withColumn({column!r}, df[{column!r}].cast('string'))) or name another column")
    return df.withColumn(out, embed_udf(model_dir, **settings)(df[column]))
