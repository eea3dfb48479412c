"""The uses over columnar batches (`bertkit.inference.columns`), in-process, as a Ray actor or a
Spark executor runs them: Arrow, NumPy and pandas batches in and out, each use's column equal to
its library function on the same texts, and an instance that pickles without its model."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from bertkit.data.tokenizer import BertTokenizer
from bertkit.encoder.heads import BertForSequenceClassification
from bertkit.encoder.model import BertForMaskedLM
from bertkit.inference import classify, rerank
from bertkit.inference.columns import Classifier, Embedder, Reranker, SparseEmbedder, texts_of
from bertkit.inference.sparse import embed_sparse

from model_fixtures import save_tiny

pa = pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install 'bertkit[ray]')")

SENTENCES = ["A man is playing a guitar.", "Stocks fell.", "Paris is the capital of France.",
             "The central bank raised interest rates by a quarter of a point.", "Someone plays an instrument."]


def test_embedder_takes_arrow_numpy_and_pandas_batches_and_pickles_without_its_model(minilm_dir):
    embedder = Embedder(minilm_dir, threads=1)
    want = embedder.compute(SENTENCES)  # (5, 384)
    assert embedder._engine is not None and pickle.loads(pickle.dumps(embedder))._engine is None
    table = embedder(pa.table({"text": SENTENCES, "id": list(range(5))}))
    assert table.column_names == ["text", "id", "embedding"]
    assert np.array_equal(np.array(table.column("embedding").to_pylist(), dtype=np.float32), want)
    batch = embedder({"text": np.array(SENTENCES, dtype=object)})
    assert batch["embedding"].shape == (5, 384) and np.array_equal(batch["embedding"], want)
    frame = embedder(table.to_pandas()[["text"]])
    assert np.array_equal(np.stack(frame["embedding"].tolist()), want)


def test_a_column_of_no_strings_is_one_error_naming_it(minilm_dir):
    embedder = Embedder(minilm_dir)
    with pytest.raises(ValueError, match="column 'text' holds int values .row 1: 3., not strings"):
        texts_of({"text": np.array(["a", 3], dtype=object)}, "text")
    with pytest.raises(ValueError, match="the batch has no column 'body' .columns: text."):
        Embedder(minilm_dir, text_column="body")({"text": np.array(["a"])})
    assert embedder._engine is None  # refused before any model was loaded


def test_classify_rerank_sparse_equal_their_library_functions(minilm_dir, tmp_path):
    tok = BertTokenizer.from_pretrained(minilm_dir)
    clf = save_tiny(BertForSequenceClassification, tok, tmp_path / "clf", id2label={0: "neg", 1: "pos"})
    cross = save_tiny(BertForSequenceClassification, tok, tmp_path / "cross", id2label={0: "LABEL_0"})
    mlm = save_tiny(BertForMaskedLM, tok, tmp_path / "mlm")
    table = pa.table({"text": SENTENCES})

    got = Classifier(clf)(table)
    want = classify(clf, SENTENCES)
    assert got.column("label").to_pylist() == [w["label"] for w in want]
    assert np.allclose(got.column("score").to_pylist(), [w["score"] for w in want], atol=1e-6)

    scores = Reranker(cross, query="what fell?")(table).column("score").to_pylist()
    by_index = {r["index"]: r["score"] for r in rerank(cross, "what fell?", SENTENCES)}
    assert np.allclose(scores, [by_index[i] for i in range(len(SENTENCES))], atol=1e-6)

    numpy_batch = {"text": np.array(SENTENCES, dtype=object)}  # Ray's "numpy" batch format
    assert Reranker(cross, query="what fell?")(numpy_batch)["score"].dtype == np.float32
    assert list(Classifier(clf)(numpy_batch)["label"]) == [w["label"] for w in want]

    sparse = SparseEmbedder(mlm)(table).column("sparse").to_pylist()
    for row, (indices, values) in zip(sparse, embed_sparse(mlm, SENTENCES)):
        assert row["indices"] == indices.tolist() and np.allclose(row["values"], values.tolist(), atol=1e-6)
