"""int8 and binary codes of dense vectors against sentence-transformers' `quantize_embeddings`
and `semantic_search_faiss`; an index searched on its codes and re-scored in float."""

from __future__ import annotations

import numpy as np
import pytest

from bertkit.retrieval import quantize
from bertkit.retrieval.index import build_index, open_index
from bertkit.retrieval.quantize import QuantizedVectors
from bertkit.retrieval.search import Searcher

from pretrain_fixtures import one_thread  # noqa: F401
from retrieval_fixtures import sentences, tiny_encoder, write_corpus

pytestmark = pytest.mark.usefixtures("one_thread")
st_quant = pytest.importorskip("sentence_transformers.util.quantization")


def vectors(n: int, dim: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, dim)) + rng.normal(size=dim)  # a shared offset: ranges differ by dimension
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize("precision", ["int8", "uint8", "binary", "ubinary"])
def test_codes_equal_sentence_transformers(precision):
    x = vectors(300, 37)  # 37: binary codes pad the last byte
    x[:, 5] = 0.25  # a constant dimension: ST's step of 1
    ours = quantize.quantize(x, precision)
    theirs = st_quant.quantize_embeddings(x, precision)
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    np.testing.assert_array_equal(ours, theirs)
    ranges = quantize.calibrate(x[:100])  # ranges of another set: values outside are clipped
    if precision.endswith("int8"):
        np.testing.assert_array_equal(quantize.quantize(x, precision, ranges),
                                      st_quant.quantize_embeddings(x, precision, ranges=ranges))
    codes, kept = QuantizedVectors.build("int8" if precision.endswith("int8") else "binary", x)
    assert codes.shape == ours.shape


@pytest.mark.parametrize("precision", ["int8", "binary"])
def test_search_without_floats_is_sentence_transformers_rescoring(precision):
    corpus, queries = vectors(400, 24), vectors(7, 24, seed=1)
    codes, ranges = QuantizedVectors.build(precision, corpus)
    store = QuantizedVectors(precision, codes, ranges, 24)  # no float vectors: ST's rescoring on the codes
    top_k, m = 5, 2 if precision == "int8" else 80  # binary: every row a candidate (Hamming ties at the edge)
    scores, rows = store.search(queries, top_k, m)
    st_codes = quantize.quantize(corpus, "uint8" if precision == "int8" else "ubinary", ranges)
    found, _ = st_quant.semantic_search_faiss(queries, corpus_embeddings=st_codes, top_k=top_k, ranges=ranges,
                                              corpus_precision="uint8" if precision == "int8" else "ubinary",
                                              rescore_multiplier=m)
    assert rows.tolist() == [[h["corpus_id"] for h in q] for q in found]
    np.testing.assert_allclose(scores, [[h["score"] for h in q] for q in found], rtol=1e-5, atol=1e-5)


def test_float_rescoring_recovers_the_exact_ranking():
    corpus, queries = vectors(500, 32), vectors(9, 32, seed=2)
    exact = np.argsort(-(queries @ corpus.T), axis=1)[:, :10]
    for precision in ("int8", "binary"):
        codes, ranges = QuantizedVectors.build(precision, corpus)
        store = QuantizedVectors(precision, codes, ranges, 32, floats=corpus)
        s, r = store.search(queries, 10, rescore_multiplier=50)  # every row re-scored: exact
        assert r.tolist() == exact.tolist()
        np.testing.assert_allclose(s, np.take_along_axis(queries @ corpus.T, r, 1), rtol=1e-6)
        assert store.memory_bytes() < corpus.nbytes / (3 if precision == "int8" else 30)


@pytest.fixture(scope="module")
def index_inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("q")
    docs = [". ".join(s.capitalize() for s in sentences(4 + i % 5, seed=i)) + "." for i in range(60)]
    return tiny_encoder(root / "bi"), write_corpus(root / "c.jsonl", docs), docs


@pytest.mark.parametrize("dtype", ["int8", "binary"])
def test_index_on_codes_from_the_cli(tmp_path, index_inputs, dtype, capsys):
    from bertkit import cli
    from bertkit.retrieval.update import update_index

    model, corpus, docs = index_inputs
    args = ["--model", str(model), "--no-progress", "--passage-tokens", "12"]
    assert cli.main(["index", str(corpus), "--out", str(tmp_path / "f"), *args]) == 0
    assert cli.main(["index", str(corpus), "--out", str(tmp_path / "q"), *args, "--vector-dtype", dtype,
                     "--rescore-multiplier", "3"]) == 0
    ix = open_index(tmp_path / "q")
    assert ix.meta["backend"]["vector_dtype"] == dtype and ix.meta["backend"]["rescore_multiplier"] == 3
    queries = [docs[4][:30], docs[17][:30], "red car"]
    float_hits = Searcher.open(tmp_path / "f").search(queries, top_k=5)
    searcher = Searcher.open(tmp_path / "q")
    assert searcher.backend.memory_bytes() < ix.vectors.nbytes / 3
    wide = searcher.search(queries, top_k=5, rescore_multiplier=1000)  # every passage: the float answer
    assert [[h.id for h in q] for q in wide] == [[h.id for h in q] for q in float_hits]
    np.testing.assert_allclose([[h.score for h in q] for q in wide], [[h.score for h in q] for q in float_hits],
                               rtol=1e-5)
    assert cli.main(["search", str(tmp_path / "q"), "red car", "--rescore-multiplier", "2"]) == 0
    assert cli.main(["index", str(corpus), "--out", str(tmp_path / "c"), *args, "--vector-dtype", dtype,
                     "--no-float-rescore"]) == 0
    on_codes = Searcher.open(tmp_path / "c")
    assert on_codes.backend.handle.floats is None and searcher.backend.handle.floats is not None
    assert len(on_codes.search(queries, top_k=5)[0]) == 5
    update_index(tmp_path / "q", delete=["d3"])  # codes rebuilt from the kept vectors
    after = open_index(tmp_path / "q")
    assert np.load(tmp_path / "q" / quantize.CODES_FILE).shape[0] == after.meta["rows"]
    assert after.meta["backend"]["vector_dtype"] == dtype


def test_codes_are_the_exact_backends(tmp_path, index_inputs):
    model, corpus, _ = index_inputs
    with pytest.raises(ValueError, match="--vector-dtype int8 is for the exact backend"):
        build_index(corpus, model, tmp_path / "x", backend="faiss-hnsw", backend_params={"vector_dtype": "int8"})
    with pytest.raises(ValueError, match="rescore multiplier 0"):
        build_index(corpus, model, tmp_path / "y", progress=False, backend_params={"vector_dtype": "binary"})
        Searcher.open(tmp_path / "y").search("cat", rescore_multiplier=0)


def test_encode_precision_gives_the_codes(index_inputs):
    import bertkit

    model = bertkit.load(index_inputs[0])
    floats = model.encode(sentences(6))
    for precision in ("int8", "uint8", "binary", "ubinary"):
        got = model.encode(sentences(6), precision=precision)
        np.testing.assert_array_equal(got, st_quant.quantize_embeddings(floats, precision))
    assert model.encode(sentences(2), precision="float32").dtype == np.float32
    with pytest.raises(ValueError, match="unknown precision 'int4'"):
        model.encode("a cat", precision="int4")
