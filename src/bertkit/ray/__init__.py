"""bertkit on Ray: the engine inside Ray Data's `map_batches`, and files embedded on a cluster.

    import ray
    from bertkit.ray import Embedder

    ds = ray.data.read_parquet("passages/")  # a `text` column
    ds = ds.map_batches(Embedder, fn_constructor_args=("path/to/model",), batch_size=256,
                        compute=ray.data.ActorPoolStrategy(size=4), num_cpus=2)
    # each row gains `embedding` (hidden floats); each actor loads the model once, 2 torch threads

`Embedder`, `Classifier`, `Reranker` (`query=`), `SparseEmbedder` are the uses over columnar
batches (`bertkit.inference.columns`). `embed_on_ray` is `bertkit embed --input FILE --out DIR
--ray [ADDRESS]`: Parquet shards of `line` and `embedding`, resumable shard by shard (`job.py`).
Needs the `ray` extra (`pip install 'bertkit[ray]'`); importing this package does not import Ray.
"""

from bertkit.inference.columns import Classifier, Embedder, Reranker, SparseEmbedder
from bertkit.ray.job import embed_on_ray, read_shards

__all__ = ["Embedder", "Classifier", "Reranker", "SparseEmbedder", "embed_on_ray", "read_shards"]
